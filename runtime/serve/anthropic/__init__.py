"""Anthropic's Messages API, translated onto chat completions."""
