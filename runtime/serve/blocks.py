"""A reply as blocks — runs of text and tool calls, in order — for the wire formats that send
content so (the Responses API's output items, Anthropic's content blocks).

The text goes through the same `CallParser` as chat completions (runtime/text/toolstream.py),
streamed piece by piece or whole in one push, so the two reassemble to the same blocks. Each
push returns events: ("start", block), ("delta", block, piece), ("end", block). A text block
starts at its first piece and ends where a call comes or the reply ends; a call block starts,
carries its whole arguments and ends at once (the parser sends a call only once its arguments
are complete JSON). Plain data: an output object holding these travels to a Ray replica.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..text.toolcalls import ToolPlan
from ..text.toolstream import CallParser, Delta, ToolCall


@dataclass
class Block:
    index: int  # its position among the reply's blocks
    kind: str  # "text" | "call"
    text: str = ""  # a text block's text so far
    call: ToolCall | None = None
    done: bool = False


class Blocks:
    def __init__(self, plan: ToolPlan | None):
        self.parser = CallParser(plan.names, plan.constrained) if plan is not None else CallParser(())
        self.blocks: list[Block] = []

    @property
    def calls(self) -> list[ToolCall]:
        return [b.call for b in self.blocks if b.kind == "call"]

    def push(self, text: str) -> list[tuple]:
        return self._events(self.parser.push(text))

    def flush(self) -> list[tuple]:
        """The reply ended: what the parser held, and the end of an open text block."""
        events = self._events(self.parser.flush())
        return events + self._end_text()

    def whole(self, text: str) -> list[Block]:
        """The blocks of a whole reply (the same as its pieces pushed one by one)."""
        self.push(text)
        self.flush()
        return self.blocks

    def _end_text(self) -> list[tuple]:
        last = self.blocks[-1] if self.blocks else None
        if last is None or last.kind != "text" or last.done:
            return []
        last.done = True
        return [("end", last)]

    def _events(self, d: Delta) -> list[tuple]:
        out = []
        if d.content:
            last = self.blocks[-1] if self.blocks else None
            if last is None or last.done:
                last = Block(len(self.blocks), "text")
                self.blocks.append(last)
                out.append(("start", last))
            last.text += d.content
            out.append(("delta", last, d.content))
        for c in d.calls:  # each call whole: its id, name and complete arguments
            out += self._end_text()
            call = self.parser.calls[c.index]
            b = Block(len(self.blocks), "call", call=call, done=True)
            self.blocks.append(b)
            out += [("start", b), ("delta", b, call.arguments), ("end", b)]
        return out
