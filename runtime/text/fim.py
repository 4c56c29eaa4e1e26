"""Fill-in-the-middle (FIM) for editors: the prompt layout from a bundle's own FIM tokens, and
the stops editors ask for (an indentation floor, a time budget that ends at a line end).

Layout (prefix-suffix-middle, Qwen2.5-Coder's repo-level form; docs/design.md "Editors"):

    [<|repo_name|>project\\n] (<|file_sep|>path\\ntext)* [<|file_sep|>path\\n]     extra files, if any
    <|fim_prefix|>{prefix up to its last line break}<|fim_suffix|>{suffix}<|fim_middle|>{cursor line}

Extra files come first, so a file's next request (a keystroke later) shares every row up to the
cursor's line with the last one. The text typed on the cursor's line goes after <|fim_middle|>,
as the start of the middle the model writes, not at the end of the prefix: a keystroke then
changes only the tokens after <|fim_middle|>, and the prefix cache keeps the suffix's rows
(in the plain layout every keystroke recomputes the whole suffix). The prompt is just token ids,
so this is exact: the output is the target's own for these ids, cached or not.

User text is tokenized as text (`Tokenizer.encode_text`): a literal `<|fim_prefix|>` in a file
stays characters.

The cursor line's last token is healed: left out of the prompt, and the output must begin with
its text (`FimParts.heal`, runtime/sampling/text_prefix.py), because a line typed up to the
cursor ends on a token the model rarely sees continued (8 typed spaces are one token, where the
file's lines are "7 spaces" + " self"; "def e" ends on " e", never followed by "mpty").

A window (`FimWindow`, llama.cpp's /infill does the like with its batch size) keeps the text near
the cursor: at most `prefix` tokens of the prefix's whole lines and `suffix` tokens of the suffix,
each cut at a line boundary. Where the prefix starts is a multiple of `step` tokens counted from
the file's start (then moved to the next line start), so a cursor moving a few lines keeps the
same start and the rows before the old cursor stay cached; a window cut at `len - prefix` would
start elsewhere at every cursor move and share nothing (llama.cpp's server then shifts cached rows
into new positions, `--cache-reuse`, which is not what a fresh read computes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..bundle.pieces import pieces
from ..bundle.tokenizer import Tokenizer
from ..errors import InvalidRequest
from .textstream import TextStream

PROJECT = "project"  # the repository name written after <|repo_name|> (no client sends one)
CURRENT = "filename"  # the cursor's file path when the client names none (llama.cpp's)


class NoFim(InvalidRequest):
    """The bundle's vocabulary has no FIM tokens (prefix, suffix and middle)."""


@dataclass(frozen=True)
class ExtraFile:
    """A file given as context (llama.cpp's input_extra chunk)."""

    path: str
    text: str


@dataclass(frozen=True)
class FimWindow:
    """How much of the file around the cursor a FIM prompt keeps (module docstring)."""

    prefix: int = 1536  # tokens of the prefix's whole lines, at most (llama.cpp: 3/4 of n_batch 2048)
    suffix: int = 512  # tokens of the suffix, at most (llama.cpp: 1/4)
    step: int = 256  # the prefix's start moves in steps of this many tokens

    def __post_init__(self):
        if not (self.prefix >= 1 and self.suffix >= 1 and 1 <= self.step <= self.prefix):
            raise ValueError(f"a FIM window needs prefix >= 1, suffix >= 1 and 1 <= step <= prefix; got {self}")

    @classmethod
    def parse(cls, text: str) -> FimWindow | None:
        """'PREFIX,SUFFIX' (tokens) -> a window; 'none' -> None (the whole file, as the context holds)."""
        if text.strip().lower() == "none":
            return None
        try:
            prefix, suffix = (int(x) for x in text.split(","))
            return cls(prefix, suffix, min(cls.step, prefix))
        except ValueError as e:
            raise ValueError(f"a FIM window is 'PREFIX,SUFFIX' in tokens (e.g. 1536,512) or 'none': {e}") from None

    def cut_prefix(self, text: str, ids: list[int], starts: list[int], encode) -> list[int]:
        """The kept prefix's ids. text: the prefix's whole lines; ids: its tokens; starts[j - 1]:
        the token where line j starts (`_line_starts`); encode: text -> ids. The start is the
        first line starting at or after a multiple of `step` tokens, the kept lines tokenized
        anew (so the first line keeps its indentation); no line start there: a token cut."""
        n = len(ids)
        if n <= self.prefix:
            return ids
        at = -(-(n - self.prefix) // self.step) * self.step  # stable while the cursor moves within a step
        lines = text.split("\n")
        j = next((j for j, t in enumerate(starts, 1) if t >= at), None)
        if j is None or j >= len(lines) - 1:  # no whole line starts after it
            return ids[at:]
        kept = encode("\n".join(lines[j:]))
        while len(kept) > self.prefix and j < len(lines) - 2:  # a new tokenization one token longer
            j += 1
            kept = encode("\n".join(lines[j:]))
        return kept

    def cut_suffix(self, text: str, ids: list[int], starts: list[int], encode) -> list[int]:
        """The kept suffix's ids: its whole lines within `suffix` tokens (a first line longer than
        that is cut at the token)."""
        if len(ids) <= self.suffix:
            return ids
        j = max((j for j, t in enumerate(starts, 1) if t <= self.suffix), default=0)
        if j == 0:
            return ids[: self.suffix]
        lines = text.split("\n")
        kept = encode("\n".join(lines[:j]) + "\n")
        while len(kept) > self.suffix and j > 1:
            j -= 1
            kept = encode("\n".join(lines[:j]) + "\n")
        return kept if len(kept) <= self.suffix else ids[: self.suffix]


@dataclass(frozen=True)
class FimParts:
    """A FIM prompt's token ids in its four parts (the prompt is their concatenation); `fit`
    trims it to a budget."""

    extra: list[int]  # BOS (if the tokenizer adds one) and the extra files
    prefix: list[int]  # <|fim_prefix|> + the prefix's whole lines
    suffix: list[int]  # <|fim_suffix|> + the suffix
    middle: list[int]  # <|fim_middle|> + the cursor's line so far, less its healed last token
    left_out: int = 0  # tokens the window and `fit` left out
    heal: str = ""  # the cursor line's last token's text, left out: the output must begin with it

    @property
    def ids(self) -> list[int]:
        return self.extra + self.prefix + self.suffix + self.middle

    def fit(self, budget: int) -> FimParts:
        """Trimmed to at most `budget` tokens where it is over: the extra files from their
        start, then the prefix from its start (after its FIM token), then the suffix from its
        end. The cursor's line and the three FIM tokens are never cut (InvalidRequest if even
        they do not fit)."""
        over = len(self.ids) - budget
        if over <= 0:
            return self
        if len(self.middle) + 2 > budget:
            raise InvalidRequest(f"the cursor's line ({len(self.middle)} tokens) leaves no room in the context "
                                 f"({budget} tokens after the completion's)", "max_new_tokens")
        extra, over = self.extra[over:], over - min(over, len(self.extra))
        cut = min(over, len(self.prefix) - 1)
        prefix, over = self.prefix[:1] + self.prefix[1 + cut :], over - cut
        suffix = self.suffix[: len(self.suffix) - over]
        cut = FimParts(extra, prefix, suffix, self.middle, heal=self.heal)
        return replace(cut, left_out=self.left_out + len(self.ids) - len(cut.ids))


def fim_parts(tok: Tokenizer, prefix: str, suffix: str, extra: tuple[ExtraFile, ...] | list = (),
              path: str | None = None, field: str = "suffix", window: FimWindow | None = None,
              heal: bool = True) -> FimParts:
    """The FIM prompt for the code before (`prefix`) and after (`suffix`) the cursor, extra files
    first, the file cut to `window` around the cursor (None: all of it), the cursor line's last
    token healed (`heal`; docstring above). Raises NoFim naming `field` when the bundle has no
    FIM tokens."""
    fim = tok.fim
    if not fim.usable:
        raise NoFim("this model has no fill-in-the-middle tokens (its vocabulary lacks <|fim_prefix|>, "
                    "<|fim_suffix|> and <|fim_middle|> or their equivalents)", field)
    head, nl, line = prefix.rpartition("\n")
    ids = list(tok.tk.encode("", add_special_tokens=True).ids)  # BOS, where the tokenizer adds one
    if extra or path:
        ids += _files(tok, list(extra), path or CURRENT)
    pre, suf = tok.encode_text(head + nl), tok.encode_text(suffix)
    whole = len(pre) + len(suf)
    if window is not None and len(pre) > window.prefix:
        pre = window.cut_prefix(head + nl, pre, _line_starts(tok, pre), tok.encode_text)
    if window is not None and len(suf) > window.suffix:
        suf = window.cut_suffix(suffix, suf, _line_starts(tok, suf), tok.encode_text)
    typed, healed = _healed(tok, line) if heal else (tok.encode_text(line), "")
    return FimParts(ids, [fim.prefix] + pre, [fim.suffix] + suf, [fim.middle] + typed, whole - len(pre) - len(suf),
                    healed)


def _healed(tok: Tokenizer, line: str) -> tuple[list[int], str]:
    """(the typed line's tokens less its last one, that token's text); the whole line and ""
    where the line is empty or its tokens' pieces do not spell it byte for byte, and for a
    vocabulary whose tokens are whole words (no byte-level or SentencePiece pieces: nothing to
    heal). A last token holding part of a character takes the one before it too."""
    ids, p = tok.encode_text(line), pieces(tok)
    if not ids or (p.bmap is None and not p.metaspace):  # a word-level vocabulary: words are whole tokens
        return ids, ""
    spelled = [p.piece(t) for t in ids]
    if b"".join(spelled) != line.encode():
        return ids, ""
    for j in range(len(ids) - 1, -1, -1):
        try:
            return ids[:j], b"".join(spelled[j:]).decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ids, ""


def _line_starts(tok: Tokenizer, ids: list[int]) -> list[int]:
    """[j - 1]: the token where line j starts (the one after the token holding the j-th line
    break; a token such as "\\n   " holds a break and the next line's indentation)."""
    spelled = pieces(tok)
    return [i + 1 for i, t in enumerate(ids) for _ in range(spelled.piece(t).count(b"\n"))]


def _files(tok: Tokenizer, extra: list[ExtraFile], current: str) -> list[int]:
    """The repo-level preamble: the repository name, each extra file, the cursor's file path.
    Without a file separator token each file is set off by a marker line."""
    fim, enc = tok.fim, tok.encode_text
    ids = [fim.repo_name] + enc(PROJECT + "\n") if fim.repo_name is not None else []
    for f in extra:
        ids += [fim.file_sep] + enc(f.path + "\n" + f.text) if fim.file_sep is not None else enc(
            f"\n\n--- {f.path} ---\n\n{f.text}")
    if fim.file_sep is not None:
        ids += [fim.file_sep] + enc(current + "\n")
    return ids


class EditorText:
    """A TextStream (stop strings) with the stops editors ask for, in llama.cpp's terms:
    - `n_indent` > 0: a line indented by fewer columns (spaces or tabs) ends the text before it
      (the line break that opened it is not part of the text); the whitespace that starts a line
      is held back until the line shows whether it stays;
    - `t_max_s`: once this long has passed since the first token, the text ends at the next line
      break (not included): the completion is whole lines.
    Same interface as TextStream (push, flush, tail, ids, stopped, stop). `ids` ends at the token that
    triggered a stop, as with stop strings."""

    def __init__(self, text: TextStream, n_indent: int = 0, t_max_s: float | None = None, clock=time.perf_counter):
        self.text, self.n_indent, self.t_max_s, self.clock = text, n_indent, t_max_s, clock
        self.t_start: float | None = None
        self.end: int | None = None  # where a stop of ours cut the text
        self.emitted = 0
        self.lines_done = 0  # characters of full text whose lines were checked

    @property
    def ids(self) -> list[int]:
        return self.text.ids

    @property
    def stopped(self) -> bool:
        return self.end is not None or self.text.stopped

    @property
    def stop(self) -> str | None:
        """The client's stop string that ended the text (None: none did, or an editor rule did)."""
        return self.text.stop if self.end is None else None

    @property
    def full(self) -> str:
        return self.text.full if self.end is None else self.text.full[: self.end]

    def push(self, chunk: list[int]) -> str:
        if self.t_start is None:
            self.t_start = self.clock()
        for t in chunk:  # token by token: `ids` must end where a stop fell
            self.text.push([t])
            if self.text.stopped or self._stop() is not None:
                break
        return self._release()

    def flush(self) -> None:
        self.text.flush()
        if self.end is None:
            self._stop()

    def tail(self) -> str:
        piece, self.emitted = self.full[self.emitted :], len(self.full)
        return piece

    def _stop(self) -> int | None:
        """Check the lines completed since the last call; -> where the text ends, or None."""
        full = self.text.full
        late = self.t_max_s is not None and self.clock() - self.t_start > self.t_max_s
        while (nl := full.find("\n", self.lines_done)) >= 0:
            if late:
                self.end = nl
                return nl
            rest = full[nl + 1 :]
            body = rest.lstrip(" \t")
            if self.n_indent > 0 and body and len(rest) - len(body) < self.n_indent:
                self.end = nl
                return nl
            if self.n_indent > 0 and not body:
                return None  # the next line's indentation is not known yet
            self.lines_done = nl + 1
        return None

    def _release(self) -> str:
        """The text that no pending rule can take back: the TextStream's hold for stop strings,
        and with n_indent a line break plus the whitespace after it."""
        safe = len(self.full) if self.end is not None else len(self.text.full) - self.text.hold
        if self.n_indent > 0 and self.end is None:
            nl = self.text.full.rfind("\n")
            if nl >= 0 and not self.text.full[nl + 1 :].strip(" \t"):
                safe = min(safe, nl)
        if self.end is not None:
            return ""  # the rest goes out with tail()
        if safe > self.emitted:
            piece, self.emitted = self.full[self.emitted : safe], safe
            return piece
        return ""
