"""OpenAI's APIs: chat and completions (schemas, response shapes, tool calls) and the Responses API, translated onto chat."""
