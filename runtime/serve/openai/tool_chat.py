"""Tool calls over the OpenAI API: the wire format's tools and messages <-> runtime/text/chat.py and
runtime/text/toolstream.py.

`chat_prompt(req, tokenizer)` renders a chat request (its tools through the bundle's template,
or ToolError: a template without tools refuses them with the 400 it always gave) and returns
the response shape to use: `ChatOutput` for plain chat, `ToolChatOutput` when tools are on.
`ToolChatOutput` is `ChatOutput` with each choice's text run through a `CallParser`:
streamed chunks carry `delta.content` and `delta.tool_calls` (a dense index; a call's first
piece has id, type and name, later ones argument fragments), the whole reply
`message.tool_calls` with `content` null when there is no text, and `finish_reason`
"tool_calls" when a reply with calls ends normally. The streamed and whole replies run the same
parser over the same text, so they reassemble to the same calls. Plain data, like
`ChatOutput`: the Ray ingress builds it and an engine replica fills it.
"""

from __future__ import annotations

from dataclasses import replace

from ...options import RequestOptions
from ...text.chat import prepare
from ...text.output import finish_reason
from ...text.toolcalls import ToolPlan
from ...text.toolstream import CallParser, Delta, parse
from ..schema import UsageInfo
from .outputs import ChatOutput
from .schema_chat import (
    AssistantMessage,
    AssistantToolCall,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
)


def chat_prompt(req: ChatCompletionRequest, tokenizer, shape=None) -> tuple[list[int], ChatOutput]:
    """-> (prompt ids, response shape; shape(model, plan, prompt tokens) builds it for an API
    translated onto chat). Raises ToolError (a 400 naming its param)."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice if isinstance(req.tool_choice, str | None) else req.tool_choice.model_dump()
    parallel = req.parallel_tool_calls is True  # unset: one call (docs/design.md "Tool calls")
    ids, plan = prepare(tokenizer, req.chat_messages(), tools, choice, parallel)
    if shape is not None:
        return ids, shape(req.model, plan, len(ids))
    return ids, (ToolChatOutput(req.model, plan) if plan.tools is not None else ChatOutput(req.model))


def with_tool_grammar(opts: RequestOptions, out) -> RequestOptions:
    """The request's options with its tools' grammar (when they have one)."""
    if tool_grammar_field(out) is None:
        return opts
    return replace(opts, grammar=out.plan.constraint)


def tool_grammar_field(out) -> str | None:
    """"tools" when the response shape carries a tool grammar (the field a compile error names)."""
    return "tools" if out.plan is not None and out.plan.constraint is not None else None


def _tool_deltas(d: Delta) -> list[DeltaToolCall] | None:
    return [DeltaToolCall(index=c.index, id=c.id, type="function" if c.id else None,
                          function=DeltaFunctionCall(name=c.name, arguments=c.arguments)) for c in d.calls] or None


class ToolChatOutput(ChatOutput):
    def __init__(self, model: str, plan: ToolPlan):
        super().__init__(model)
        self.plan = plan
        self.parsers: dict[int, CallParser] = {}  # per choice, while it streams

    def _parser(self, index: int) -> CallParser:
        if index not in self.parsers:
            self.parsers[index] = CallParser(self.plan.names, self.plan.constrained)
        return self.parsers[index]

    def _delta(self, d: Delta) -> DeltaMessage:
        return DeltaMessage(content=d.content or None, tool_calls=_tool_deltas(d))

    def piece(self, index: int, text: str, lp: list | None = None):
        """A text piece -> a chunk of its content and call pieces; None while the parser holds
        it back (a partial tag, a call's header) and no logprobs need to go out."""
        d = self._parser(index).push(text)
        if not d and lp is None:
            return None
        return self.chunk(index, self._delta(d), logprobs=self.logprobs(index, lp))

    def last(self, index: int, finish: str):
        p = self._parser(index)
        d = p.flush()
        return self.chunk(index, self._delta(d), finish_reason(finish, False, bool(p.calls)))

    def whole(self, choices: list[tuple[str, str, list | None, int]], usage: UsageInfo) -> ChatCompletionResponse:
        out = []
        for i, (text, finish, lp, _) in enumerate(choices):
            content, calls = parse(text, self.plan.names, self.plan.constrained)
            msg = AssistantMessage(content=content, tool_calls=[
                AssistantToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls] or None)
            out.append(ChatCompletionChoice(index=i, message=msg, logprobs=self.logprobs(i, lp),
                                            finish_reason=finish_reason(finish, False, bool(calls))))
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model, usage=usage, choices=out)
