"""Chat with tools through a Pipeline, without the server: OpenAI-shaped messages and tools in,
content and parsed tool calls out (`Pipeline.chat` / `Pipeline.stream_chat` call these).

`prepare` is the one place that turns a conversation into prompt ids and a `ToolPlan`
(runtime/text/toolcalls.py), used by the HTTP server too: a bundle whose template has no tool
section refuses tools and tool history (ToolError), a template that has one renders them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ..engine import Stats
from .toolcalls import ToolError, ToolPlan, plan, renders_tools, tags_are_tokens, template_messages
from .toolstream import CallParser, Delta, ToolCall

NO_TOOLS = "'tools' is not supported by this server: the bundle's chat template has no tool calling"


@dataclass
class ChatResult:
    content: str | None  # None when the reply is only tool calls
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"  # stop | length | timeout | tool_calls (OpenAI's)
    token_ids: list[int] = field(default_factory=list)
    stats: Stats | None = None


def prepare(tokenizer, messages: list[dict], tools: list[dict] | None = None, tool_choice=None,
            parallel_tool_calls: bool = False, tool_grammar: bool = True) -> tuple[list[int], ToolPlan]:
    """-> (prompt ids, ToolPlan). Raises ToolError (with the param to blame) for tools or tool
    history the bundle's template cannot render, and for malformed tools / tool_choice."""
    p = plan(tools, tool_choice, parallel_tool_calls, tool_grammar, tags_are_tokens(tokenizer))
    has = renders_tools(tokenizer)
    if p.tools is not None and not has:
        raise ToolError(NO_TOOLS, "tools", "unsupported_parameter")
    for i, m in enumerate(messages):
        if not has and (m.get("role") == "tool" or m.get("tool_calls")):
            raise ToolError(NO_TOOLS + ": it cannot render tool calls or results", f"messages[{i}]",
                            "unsupported_parameter")
    return tokenizer.encode_messages(template_messages(messages), p.tools), p


def stream_chat(pipe, messages: list[dict], *, tools: list[dict] | None = None, tool_choice=None,
                parallel_tool_calls: bool = False, tool_grammar: bool = True, stop: list[str] | None = None,
                result: list | None = None, **kw) -> Iterator[Delta]:
    """Deltas (content, tool-call pieces) as tokens are committed; `result` (a list) receives
    the ChatResult at the end. kw: `Pipeline.request`'s options (not `grammar`: the tools
    choose it)."""
    ids, p = prepare(pipe.tokenizer, messages, tools, tool_choice, parallel_tool_calls, tool_grammar)
    if p.constraint is not None and kw.get("grammar") is not None:
        raise ToolError("tool calls cannot be combined with another grammar", "grammar")
    stats = kw.pop("stats", None) or Stats()
    r = pipe.request(ids, stats=stats, **({"grammar": p.constraint} if p.constraint else {}), **kw)
    out, calls = pipe.start(r, stop or ()), CallParser(p.names, p.constrained)
    for piece in out:
        d = calls.push(piece)
        if d:
            yield d
    d = calls.flush()
    if d:
        yield d
    if result is not None:
        result.append(ChatResult((calls.content or None) if calls.calls else calls.content, calls.calls,
                                 out.finish_reason(bool(calls.calls)), out.ids, out.result().stats))


def chat(pipe, messages: list[dict], **kw) -> ChatResult:
    """The whole reply (see `stream_chat`)."""
    out: list = []
    for _ in stream_chat(pipe, messages, result=out, **kw):
        pass
    return out[0]
