"""Token chunks -> text pieces for one request: streaming detokenization plus stop strings.

Text that could be the beginning of a stop string is held back until resolved, so nothing is
streamed and then retracted; at a stop string the text is cut where it begins.
"""

from __future__ import annotations

from ..bundle.tokenizer import Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop: list[str] | None = None, skip: str = ""):
        """skip: text the tokens begin with that is not the output's (a healed prompt's last
        token, runtime/sampling/text_prefix.py): left out of the text, stop strings looked
        for after it."""
        self.dec = tokenizer.stream()
        self.stops = [s for s in (stop or []) if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.skip = skip
        self._skipped = 0  # characters of `skip` decoded so far
        self.full = ""  # text so far (cut at a stop string)
        self.emitted = 0  # characters of `full` handed out
        self.ids: list[int] = []
        self.stopped = False
        self.stop: str | None = None  # the stop string that ended the text (Anthropic's stop_sequence)

    def push(self, chunk: list[int]) -> str:
        """-> the text that is now safe to show ("" if none). With stop strings the chunk is read
        token by token: `ids` ends at the token that completed a stop string, whatever followed
        it in the chunk (a speculative round commits several tokens at once; the ids, and what
        is counted and reported of them, must be those of target-only decoding)."""
        for piece in ([[t] for t in chunk] if self.stops else [list(chunk)]):
            self.ids.extend(piece)
            self.full += self._own(self.dec.push(piece))
            hit = _find_stop(self.full, self.stops, max(0, self.emitted - self.hold))
            if hit is not None:
                cut, self.stop = hit
                self.full = self.full[:cut]
                self.stopped = True
                return ""
        safe = len(self.full) - self.hold
        if safe > self.emitted:
            piece, self.emitted = self.full[self.emitted : safe], safe
            return piece
        return ""

    def flush(self) -> None:
        """The tokens ended (EOS or length): decode what the detokenizer held back."""
        self.full += self._own(self.dec.flush())

    def _own(self, text: str) -> str:
        """Decoded text less what is left of `skip` (the tokens write it first)."""
        if self._skipped < len(self.skip) and text:
            n = min(len(text), len(self.skip) - self._skipped)
            self._skipped, text = self._skipped + n, text[n:]
        return text

    def tail(self) -> str:
        """Text not handed out yet (after the last push, and flush if the tokens ended)."""
        piece, self.emitted = self.full[self.emitted :], len(self.full)
        return piece


def _find_stop(text: str, stops: list[str], start: int) -> tuple[int, str] | None:
    """(earliest index >= start where a stop string begins in text, that string); of two that
    begin there, the one that ends first (it completed first)."""
    hits = [(i, s) for i, s in ((text.find(s, start), s) for s in stops) if i >= 0]
    return min(hits, key=lambda h: (h[0], len(h[1]))) if hits else None
