"""Tool calls in the Hermes / Qwen2.5 format: what the chat template gets, and the grammar that
makes a call well formed (pure: no engine, no HTTP).

The format (Qwen2.5's chat template, DESIGN §9): the template renders `tools` in the system
block, and the model answers a call as

    <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>

several calls one after the other, separated by "\\n". `plan(tools, tool_choice, parallel)`
turns OpenAI's request fields into a `ToolPlan`: the tools the template renders (none for
"none") and the `Constraint` (runtime/sampling/grammar.py, a Lark grammar for llguidance) the output
follows:
  * "auto": free text until the model writes `<tool_call>` (a lazy lexeme: the shortest text
    that ends in the tag), then a call of an offered function whose arguments follow that
    function's schema, then only further calls or EOS. Text without the tag is unconstrained;
  * "required": one or more calls from the first token; a named function: exactly that call;
  * parallel=False: at most one call.
The grammar rides the same machinery as structured output, so speculative output stays the
constrained target-only output token for token (runtime/sampling/grammar.py's contract).

The arguments use the separators the template's `tojson` writes (", " and ": "), so a call
reads as the model saw calls in its history. A `strict` function's schema must compile as
given; other functions' schemas compile leniently (keywords llguidance cannot enforce are
ignored rather than refused). Parsing the output is runtime/text/toolstream.py.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field

from ..sampling.grammar import Constraint

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
# the JSON separators of the template's `tojson` (Python's json.dumps defaults)
_ARGS_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ToolError(ValueError):
    """A tools / tool_choice / history the server cannot honour; `param` names the field,
    `code` is OpenAI's error code (None: a malformed value)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class Function:
    """One offered function (OpenAI's `tools[i].function`)."""

    name: str
    parameters: dict = field(default_factory=lambda: {"type": "object"})  # JSON schema of the arguments
    description: str | None = None
    strict: bool = False  # the schema must compile as given (OpenAI's strict mode)

    def header(self) -> str:
        """What the model writes after <tool_call> before the arguments object."""
        return f'\n{{"name": "{self.name}", "arguments": '

    def args_schema(self) -> dict:
        schema = dict(self.parameters or {"type": "object"})
        fmt = dict(_ARGS_FORMAT, **({} if self.strict else {"lenient": True}))
        schema["x-guidance"] = {**fmt, **schema.get("x-guidance", {})}
        return schema


def functions(tools: list[dict]) -> list[Function]:
    """OpenAI tool dicts ({"type": "function", "function": {...}}) -> Functions. Raises
    ToolError for a tool that is not a function, a bad or repeated name."""
    out, seen = [], set()
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(f, dict):
            raise ToolError("each tool must be {'type': 'function', 'function': {...}}", f"tools[{i}]")
        name = f.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ToolError("a function name is 1-64 letters, digits, '_' or '-'", f"tools[{i}].function.name")
        if name in seen:
            raise ToolError(f"function {name!r} is offered twice", f"tools[{i}].function.name")
        seen.add(name)
        params = f.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ToolError("must be a JSON schema object", f"tools[{i}].function.parameters")
        out.append(Function(name, params or {"type": "object"}, f.get("description"), bool(f.get("strict"))))
    return out


@dataclass(frozen=True)
class ToolPlan:
    """What a request with tools needs: `tools` for the template (None: render none), the
    `constraint` its output follows (None: free text), the offered names (parsing accepts only
    these), and whether a call can only be well formed (a grammar is on: the parser may stream
    a call's arguments as they come)."""

    tools: list[dict] | None
    constraint: Constraint | None
    names: frozenset[str]
    choice: str  # "none" | "auto" | "required" | "named"

    @property
    def constrained(self) -> bool:
        return self.constraint is not None


def plan(tools: list[dict] | None, tool_choice: str | dict | None = None, parallel: bool = False,
         grammar: bool = True, tag_tokens: bool = True) -> ToolPlan:
    """OpenAI's `tools`, `tool_choice` ("none" | "auto" | "required" | {"type": "function",
    "function": {"name": N}}; None: "auto" with tools) and `parallel_tool_calls` -> a ToolPlan.
    grammar=False: no constraint for any choice (measurement only, tools/tool_eval.py: what the
    model writes unaided; the server always constrains). tag_tokens: see
    `tool_grammar` (`tags_are_tokens(tokenizer)` says which a bundle has)."""
    fs = functions(tools or [])
    choice, named = _choice(tool_choice, fs)
    if not fs or choice == "none":
        return ToolPlan(None, None, frozenset(), "none")
    rendered = [{"type": "function", "function": _openai_function(f)} for f in fs]
    names = frozenset(f.name for f in fs)
    if not grammar:
        return ToolPlan(rendered, None, names, choice)
    offered = [f for f in fs if f.name == named] if named else fs
    return ToolPlan(rendered, Constraint.lark(tool_grammar(offered, choice, parallel, tag_tokens)), names, choice)


def _choice(tool_choice, fs: list[Function]) -> tuple[str, str | None]:
    if tool_choice is None:
        return ("auto" if fs else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ToolError("must be 'none', 'auto', 'required' or a named function", "tool_choice")
        if tool_choice == "required" and not fs:
            raise ToolError("'required' needs 'tools'", "tool_choice")
        return tool_choice, None
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise ToolError("a named tool choice is {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    if name not in {f.name for f in fs}:
        raise ToolError(f"function {name!r} is not among the offered tools", "tool_choice.function.name")
    return "named", name


def _openai_function(f: Function) -> dict:
    """The function as the template renders it (OpenAI's shape, keys in OpenAI's order)."""
    d = {"name": f.name}
    if f.description is not None:
        d["description"] = f.description
    d["parameters"] = f.parameters
    if f.strict:
        d["strict"] = True
    return d


def _lark_string(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a Lark string literal


# A reply may open with a bare call (Qwen2.5-Coder often answers so): the call's JSON object in any
# JSON whitespace (pretty-printed or compact), optionally in a ```json / ``` fence. WS bounds the
# whitespace between its tokens, so a constrained call cannot loop on blank lines.
WS = "[ \\t\\n\\r]{0,8}"
FENCE_RE = "```(json)?[ \\t]{0,4}\\n"
FENCE_END = "\n```"


def _bare_head(name: str) -> str:
    """A regex for a bare call's opening up to its arguments object."""
    return (f'{WS}\\{{{WS}"name"{WS}:{WS}"{name}"{WS},{WS}"arguments"{WS}:{WS}')


def tool_grammar(fs: list[Function], choice: str, parallel: bool, tag_tokens: bool = True) -> str:
    """A Lark grammar (llguidance dialect) for calls of `fs` under `choice` ("auto": text, or
    text then calls, or one bare call; "required" / "named": calls from the first token).
    tag_tokens: the tokenizer has the tags as added tokens (Qwen2.5's), which llguidance treats
    as special tokens: the grammar names them `<tool_call>`, and free text cannot hold them;
    else they are text. Either way free text may not spell the open tag out, nor start as a
    bare call would (a JSON object whose first key is "name"), so every call is a constrained
    one; a bare call is the whole reply (its fence closed if it opened one)."""
    open_, close = (OPEN, CLOSE) if tag_tokens else (_lark_string(OPEN), _lark_string(CLOSE))
    lines = [f'call: "\\n" fn "\\n" {close}', f"fn: {' | '.join(f'fn_{i}' for i in range(len(fs)))}"]
    for i, f in enumerate(fs):
        lines.append(f"fn_{i}: {_lark_string(f.header()[1:])} args_{i} \"}}\"")
        lines.append(f"args_{i}: %json {json.dumps(f.args_schema())}")
    more = f' ("\\n" {open_} call)*' if parallel and choice != "named" else ""
    if choice == "auto":
        # Each opening is one lexeme with its fence: TEXT is alive until the "name" key, and the
        # lexer does not split a live greedy lexeme
        lines[:0] = [f"start: TEXT | TEXT {open_} call{more} | bare" if tag_tokens
                     else f"start: TEXT | head call{more} | bare",
                     f'TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/ & ~/[ \\t\\n\\r]*({FENCE_RE})?[ \\t\\n\\r]*'
                     f'\\{{[ \\t\\n\\r]*"name"(?s:.*)/',
                     f"bare: {' | '.join(f'bare_{i}' for i in range(len(fs)))}",
                     f"BARE_END: /{WS}\\}}/",
                     f"FENCE_END: /{WS}```/"]
        for i, f in enumerate(fs):
            lines.append(f"bare_{i}: BARE_{i} args_{i} BARE_END | FENCED_{i} args_{i} BARE_END FENCE_END")
            lines.append(f"BARE_{i}: /{_bare_head(f.name)}/")
            lines.append(f"FENCED_{i}: /{WS}{FENCE_RE}{_bare_head(f.name)}/")
        if not tag_tokens:  # the shortest text that ends in the tag (a lazy lexeme)
            lines.insert(2, "head[lazy]: /(?s:.*)<tool_call>/")
    else:
        lines[:0] = [f"start: {open_} call{more}"]
    return "\n".join(lines) + "\n"


# ---- history: OpenAI's messages as the template reads them ---------------------------------

def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages -> what a Hermes-style template reads: an assistant's `tool_calls`
    keep OpenAI's shape but their `arguments` become objects (OpenAI sends JSON *strings*; the
    template writes `arguments | tojson`), `tool` messages pass with their content. Raises
    ToolError (param: the message) for arguments that are not a JSON object."""
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if not calls:
            out.append(m)
            continue
        fixed = []
        for j, c in enumerate(calls):
            fn = dict(c.get("function") or {})
            fn["arguments"] = _arguments(fn.get("arguments"), f"messages[{i}].tool_calls[{j}].function.arguments")
            fixed.append({**c, "function": fn})
        out.append({**m, "tool_calls": fixed})
    return out


def _arguments(args, param: str) -> dict:
    if isinstance(args, dict):
        return args
    try:
        value = json.loads(args) if isinstance(args, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ToolError("must be a JSON object (as a string)", param)
    return value


def template_has_tools(source: str | None) -> bool:
    """Whether a chat template renders `tools` and writes calls in the Hermes format (Qwen2.5,
    Hermes 2/3): it reads a `tools` variable and spells the <tool_call> tag."""
    if not source or OPEN not in source:
        return False
    import jinja2
    from jinja2 import meta

    try:
        return "tools" in meta.find_undeclared_variables(jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source))
    except jinja2.TemplateError:
        return False


_RENDERS_TOOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> renders_tools


def renders_tools(tokenizer) -> bool:
    """Whether a runtime Tokenizer's chat template renders tools and writes calls this runtime
    parses (`template_has_tools`), and the tag survives decoding. Kept per tokenizer (the
    template is parsed once)."""
    if tokenizer not in _RENDERS_TOOLS:
        _RENDERS_TOOLS[tokenizer] = template_has_tools(tokenizer.info.chat_template) and tokenizer.decode(
            tokenizer.tk.encode(OPEN, add_special_tokens=False).ids) == OPEN
    return _RENDERS_TOOLS[tokenizer]


def tags_are_tokens(tokenizer) -> bool:
    """Whether a runtime Tokenizer has <tool_call> and </tool_call> as tokens of their own."""
    return all(tokenizer.tk.token_to_id(t) is not None for t in (OPEN, CLOSE))
