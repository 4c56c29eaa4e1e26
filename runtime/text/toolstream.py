"""Tool calls out of the model's text, incrementally (runtime/text/toolcalls.py has the format).

`CallParser.push(text)` takes committed text of any length — one token's, or several tokens' at
once as a speculative step commits them — and returns a `Delta`: content to show now and
`CallDelta`s (a dense call index from 0; a call's first delta carries its id and name, later
ones fragments of its arguments). `flush()` ends the text. The whole output parsed in one push
gives the same content and calls as any split of it into pushes (the non-streamed reply is
`parse(text)`, the streamed one the same parser fed piece by piece), so the two reassemble to
the same calls. Rules:
  * text outside calls is content; a prefix of `<tool_call>` at the end of a push is held back
    until the next push says whether it opens a call; whitespace next to a call is dropped;
  * a reply that opens as a bare call — the call's JSON object, `{"name": N, "arguments": {...}}`
    in any JSON whitespace, optionally in a ```json / ``` fence (Qwen2.5-Coder answers so) — is
    one call (held until the object closes; a name not offered or malformed JSON stays content);
  * constrained (a grammar made every call well formed): a call whose header is exactly
    `\\n{"name": "N", "arguments": ` with N offered is sent whole once its arguments close
    (tracked through strings and escapes), before its closing tag;
  * otherwise a call is held until `</tool_call>` (or the end of the text) and parsed as JSON:
    {"name": an offered function, "arguments": an object (or a JSON string of one)} becomes a
    call, anything else — malformed JSON, a function not offered — is content, verbatim.
A call is never sent before its arguments are complete JSON: a call cut off by the token budget
is not a call (OpenAI would return the arguments written so far, which no client can parse);
its text is content, verbatim, and the reply's finish_reason is "length".
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .toolcalls import CLOSE, OPEN

_WS = " \t\n\r"  # JSON whitespace


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # the arguments object as JSON text


@dataclass
class CallDelta:
    """What one push adds to call `index`: its id and name (first delta only) and/or a
    fragment of its arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass
class Delta:
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class _ObjectEnd:
    """Finds where a JSON object ends in text fed piece by piece (strings and escapes aware)."""

    def __init__(self):
        self.depth, self.in_str, self.esc, self.closed = 0, False, False, False

    def feed(self, text: str) -> int:
        """-> how many chars of `text` belong to the object (all, until it closes)."""
        for k, ch in enumerate(text):
            if self.in_str:
                self.esc, self.in_str = (False, True) if self.esc else (ch == "\\", ch != '"')
            elif ch == '"':
                self.in_str = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.closed = True
                    return k + 1
        return len(text)


def parse_call(inner: str, names: frozenset[str]) -> tuple[str, str] | None:
    """The text between the tags -> (name, arguments JSON) if it is a call of an offered
    function, else None."""
    try:
        obj = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


_FENCE = re.compile(r"```(json)?[ \t]*\n")
_FENCE_PREFIX = re.compile(r"`{1,3}(j(s(o(n)?)?)?)?[ \t]*")


def _bare_object(buf: str, names: frozenset[str], final: bool):
    """Where a reply opening as a bare call has its object: (fenced, index of its "{"); False:
    the reply does not open so; None: it may still (wait for more text, unless final)."""
    k = len(buf) - len(buf.lstrip(_WS))
    m = _FENCE.match(buf, k)
    if m is None and _FENCE_PREFIX.fullmatch(buf, k):
        return False if final else None
    j = m.end() if m else k
    j += len(buf[j:]) - len(buf[j:].lstrip(_WS))
    state = _header(buf[j:], names)
    if state is None:
        return False if final else None
    return (m is not None, j) if state else False


def _header(text: str, names) -> bool | None:
    """Whether `text` opens `{"name": "N"` (any JSON whitespace, N offered): True, False, or
    None while it is a prefix of such an opening."""
    i = 0
    for part in ("{", '"name"', ":"):
        i += len(text[i:]) - len(text[i:].lstrip(_WS))
        seg = text[i : i + len(part)]
        if seg != part:
            return None if i + len(seg) == len(text) and part.startswith(seg) else False
        i += len(part)
    i += len(text[i:]) - len(text[i:].lstrip(_WS))
    rest, quoted = text[i:], [f'"{n}"' for n in names]
    if any(rest.startswith(q) for q in quoted):
        return True
    return None if any(q.startswith(rest) for q in quoted) else False


class CallParser:
    def __init__(self, names, constrained: bool = False, new_id: Callable[[], str] = new_call_id):
        self.names, self.constrained, self.new_id = frozenset(names), constrained, new_id
        self.content = ""  # all content emitted so far
        self.calls: list[ToolCall] = []
        self._buf = ""  # text not yet decided on
        self._in_call = False
        self._mode: str | None = None  # inside a call: "stream" or "buffer" (None: undecided)
        self._end: _ObjectEnd | None = None
        self._held = ""  # whitespace not yet emitted (dropped if a call follows)
        self._gap = ""  # the whitespace before the open call (content again if the call is not one)
        self._after_call = False  # leading whitespace is dropped
        self._start_read = False  # whether the reply's start was checked for a bare call
        self._pending, self._args = "", ""  # a constrained call's name and arguments, until they close

    def push(self, text: str) -> Delta:
        return self._run(text, final=False)

    def flush(self) -> Delta:
        return self._run("", final=True)

    def _run(self, text: str, final: bool) -> Delta:
        out = Delta()
        self._buf += text
        if not self._start_read and not self._bare_start(out, final):
            return out
        while self._call(out, final) if self._in_call else self._text(out, final):
            pass
        if final and not self._after_call and self._held:
            self._say(out, "", force=True)  # the held whitespace: no call follows it
        self.content += out.content
        return out

    # ---- a reply that is one bare call ----------------------------------------------------
    def _bare_start(self, out: Delta, final: bool) -> bool:
        """Whether the reply opens as a bare call has been decided (a call taken, or the text
        left to the rest); False: wait for more text."""
        at = _bare_object(self._buf, self.names, final)
        if at is None:
            return False
        if at is False:
            self._start_read = True
            return True
        fenced, k = at
        end = _ObjectEnd()
        n = end.feed(self._buf[k:])
        rest = self._buf[k + n :]
        tail = rest.lstrip(_WS)
        fence_coming = fenced and len(tail) < 3 and "```".startswith(tail)
        if not final and (not end.closed or fence_coming):
            return False  # the object, or its closing fence, is still coming
        self._start_read = True
        call = parse_call(self._buf[k : k + n], self.names) if end.closed else None
        if call is not None:  # else the text is content, as any other (a call cut short included)
            self._start(out, *call)
            self._buf = tail[3:] if fenced and tail.startswith("```") else rest
            self._after_call = True
        return True

    # ---- outside calls ------------------------------------------------------------------
    def _text(self, out: Delta, final: bool) -> bool:
        i = self._buf.find(OPEN)
        if i < 0:
            keep = 0 if final else _held_prefix(self._buf, OPEN)
            seg, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
            self._say(out, seg)
            return False
        self._say(out, self._buf[:i])
        self._gap, self._held = self._held, ""
        self._buf, self._in_call, self._mode = self._buf[i + len(OPEN) :], True, None
        return True

    def _say(self, out: Delta, seg: str, force: bool = False) -> None:
        """Content, except whitespace that may turn out to be next to a call."""
        text = self._held + seg
        if self._after_call:
            text = text.lstrip()
        body = text if force else text.rstrip()
        if not body:
            self._held = "" if force else text
            return
        out.content += body
        self._held = text[len(body) :]
        self._after_call = False

    # ---- inside a call --------------------------------------------------------------------
    def _call(self, out: Delta, final: bool) -> bool:
        if self._mode is None and not self._choose_mode(out, final):
            return False
        if self._mode == "stream":
            return self._stream_args(out, final)
        return self._buffered(out, final)

    def _choose_mode(self, out: Delta, final: bool) -> bool:
        """Follow the arguments if the grammar made the call well formed and its header is
        complete; wait while the header may still come; else hold the call whole."""
        if self.constrained:
            for name in self.names:
                head = f'\n{{"name": "{name}", "arguments": '
                if self._buf.startswith(head):
                    self._mode, self._end, self._buf = "stream", _ObjectEnd(), self._buf[len(head) :]
                    self._pending, self._args = name, ""
                    return True
            if not final and any(f'\n{{"name": "{n}", "arguments": '.startswith(self._buf) for n in self.names):
                return False
        self._mode = "buffer"
        return True

    def _start(self, out: Delta, name: str, arguments: str) -> None:
        call = ToolCall(self.new_id(), name, arguments)
        self.calls.append(call)
        out.calls.append(CallDelta(len(self.calls) - 1, arguments, call.id, name))
        self._gap = ""

    def _stream_args(self, out: Delta, final: bool) -> bool:
        """A constrained call: sent whole once its arguments object closes; cut before that, its
        text is content."""
        if not self._end.closed:
            n = self._end.feed(self._buf)
            self._args, self._buf = self._args + self._buf[:n], self._buf[n:]
            if self._end.closed:
                self._start(out, self._pending, self._args)
            elif final:
                head = f'\n{{"name": "{self._pending}", "arguments": '
                self._held, gap = "", self._gap
                self._say(out, gap + OPEN + head + self._args, force=True)
                self._in_call, self._mode = False, None
                return False
        j = self._buf.find(CLOSE)  # after the arguments: '}\n' then the closing tag
        if j < 0:
            return False
        self._close(j)
        return True

    def _buffered(self, out: Delta, final: bool) -> bool:
        j = self._buf.find(CLOSE)
        if j < 0 and not final:
            return False
        inner = self._buf if j < 0 else self._buf[:j]
        call = parse_call(inner.strip(), self.names)
        if call is not None:
            self._start(out, call[0], call[1])
        else:  # not a call: the text as it was written
            self._held, gap = "", self._gap
            self._say(out, gap + OPEN + inner + (CLOSE if j >= 0 else ""), force=final)
        if j < 0:
            self._buf, self._in_call = "", False
            self._after_call = call is not None
            return False
        self._close(j, was_call=call is not None)
        return True

    def _close(self, j: int, was_call: bool = True) -> None:
        self._buf, self._in_call, self._mode = self._buf[j + len(CLOSE) :], False, None
        self._after_call = was_call
        self._gap = ""


def parse(text: str, names, constrained: bool = False, new_id: Callable[[], str] = new_call_id):
    """The whole output -> (content or None when calls were made and no text, calls)."""
    p = CallParser(names, constrained, new_id)
    p.push(text)
    p.flush()
    return (p.content or None) if p.calls else p.content, p.calls
