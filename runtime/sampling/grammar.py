"""Grammar-constrained decoding with llguidance (JSON schema, regex, Lark / GBNF, a choice list).

Two parts, as vLLM's structured-output backends split them:
  * `Grammars` (one per pipeline): the llguidance tokenizer over the bundle's tokenizer.json
    (built on first use, ~0.2-0.5 s) and `compile(constraint)`, which validates a grammar before
    a request reaches the engine (a grammar that cannot compile is a `GrammarError`, a 400);
  * `Matcher` (one per request): the grammar's state over the *committed* tokens only. Masks for
    draft positions are computed by advancing over the drafts and rolling back, so speculation
    never moves the state past what verification kept.

Under speculation (runtime/engine/scheduler.py): a proposal is cut at its first token the
grammar forbids (`valid_prefix`); the model drafter samples from its own masked distribution
(`mask_after`), so the q that verification divides by is the one it sampled from; the target's
row i is masked by the state after the committed tokens + draft[:i] (`masks`), exactly the mask
a target-only step at that position applies. Each state's mask is filled once a round: the
draft's masks are kept until the next commit and verification reuses them (the draft's rows
0..k-1 are the target's; on the coder pair's tool grammar a mask costs up to ~1-2 ms where the
reply may still open a bare call, docs/benchmarks.md §20). Output is the constrained target-only output:
greedy token for token, sampling in distribution.

llguidance is imported lazily: the runtime starts without it, and only constrained requests need
it (`pip install llguidance`; it has no framework dependency).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class GrammarError(ValueError):
    """A constraint that cannot be compiled (the message says why)."""


KINDS = ("json_schema", "regex", "lark", "gbnf", "choice")


@dataclass(frozen=True)
class Constraint:
    """What the output must match. kind: json_schema (spec: the schema as a JSON string; "{}"-like
    {"type": "object"} for any JSON object), regex, lark, gbnf (llama.cpp's grammar format),
    choice (a JSON list of the allowed strings)."""

    kind: str
    spec: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind must be one of {KINDS}, got {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Constraint:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        return cls("lark", grammar)

    @classmethod
    def gbnf(cls, grammar: str) -> Constraint:
        return cls("gbnf", grammar)

    @classmethod
    def choice(cls, options: list[str]) -> Constraint:
        return cls("choice", json.dumps(list(options)))


def _llg():
    try:
        import llguidance
        import llguidance.numpy
    except ImportError as e:
        raise GrammarError(f"structured output needs llguidance (pip install llguidance): {e}") from None
    return llguidance


class Grammars:
    def __init__(self, tokenizer_json: str | Path, vocab: int, eos_ids):
        """tokenizer_json: the bundle's tokenizer.json; vocab: the target's logits width; eos_ids:
        the tokens a finished grammar allows (the request then ends)."""
        self.path, self.vocab, self.eos_ids = Path(tokenizer_json), vocab, sorted(eos_ids)
        self._tok = None
        self._lock = threading.Lock()

    def tokenizer(self):
        with self._lock:
            if self._tok is None:
                llg = _llg()
                try:
                    self._tok = llg.LLTokenizer(self.path.read_text(), n_vocab=self.vocab, eos_token=self.eos_ids)
                except (ValueError, RuntimeError, OSError) as e:  # e.g. a tokenizer without a decoder
                    raise GrammarError(f"this bundle's tokenizer cannot drive a grammar engine: {e}") from None
            return self._tok

    def compile(self, c: Constraint) -> str:
        """-> a validated llguidance grammar, or GrammarError naming the problem."""
        llg = _llg()
        try:
            if c.kind == "json_schema":
                grammar = llg.LLMatcher.grammar_from_json_schema(c.spec)
            elif c.kind == "regex":
                grammar = llg.LLMatcher.grammar_from_regex(c.spec)
            elif c.kind == "lark":
                grammar = llg.LLMatcher.grammar_from_lark(c.spec)
            else:  # gbnf, choice
                grammar = llg.grammar_from("grammar" if c.kind == "gbnf" else "choice", c.spec)
        except (ValueError, TypeError) as e:
            raise GrammarError(f"cannot compile the {c.kind.replace('_', ' ')}: {e}") from None
        err = llg.LLMatcher.validate_grammar(grammar, self.tokenizer())
        if err:
            raise GrammarError(f"cannot compile the {c.kind.replace('_', ' ')}: {err.strip()[:500]}")
        return grammar

    def matcher(self, grammar: str) -> Matcher:
        return Matcher(_llg(), self.tokenizer(), grammar, self.vocab)


class Matcher:
    """One request's grammar state over its committed tokens."""

    def __init__(self, llg, tok, grammar: str, vocab: int):
        self._llg = llg
        self.m = llg.LLMatcher(tok, grammar)
        if self.m.is_error():
            raise GrammarError(f"grammar error: {self.m.get_error()}")
        self.vocab = vocab
        self._exec = llg.LLExecutor()
        self._bits = llg.numpy.allocate_token_bitmask(1, vocab)
        # bitmask rows [W] filled for drafts since the last commit, keyed by the drafted tokens: a
        # model draft fills the masks after d[:j] (mask_after), and verification needs the same
        # states' masks again (masks(d), rows 0..k-1); the state is the same, so is the mask
        self._filled: dict[tuple[int, ...], np.ndarray] = {}

    def _allowed(self, bits: np.ndarray) -> np.ndarray:
        """int32 bitmask rows [T, W] -> bool [T, V]."""
        return np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, : self.vocab].astype(bool)

    def masks(self, drafts=()) -> np.ndarray:
        """bool [len(drafts) + 1, V]: row i = tokens allowed after the committed ones + drafts[:i]
        (drafts must be valid: `valid_prefix`). The state is left where it was. Rows a draft
        already filled this round (`mask_after`) are reused; with only the last row missing (a
        model draft's round, or no drafts) one mask is filled, else all k+1 in one llguidance call."""
        drafts = [int(t) for t in drafts]
        T = len(drafts) + 1
        if self._bits.shape[0] < T:
            self._bits = self._llg.numpy.allocate_token_bitmask(T, self.vocab)
        bits = self._bits[:T]
        known = [self._filled.get(tuple(drafts[:i])) for i in range(T)]
        if all(b is not None for b in known[:-1]):
            for i, b in enumerate(known[:-1]):
                bits[i] = b
            bits[T - 1] = known[-1] if known[-1] is not None else self._fill_after(drafts)
        else:  # the k+1 masks of a draft in one call (advance, fill, roll back inside llguidance)
            self._llg.numpy.fill_next_token_bitmask_par_with_draft_tokens(self._exec, [(self.m, 0, drafts)], bits)
        return self._allowed(bits)

    def mask_after(self, tokens) -> np.ndarray:
        """bool [V]: tokens allowed after the committed ones + `tokens` (a draft in progress, each
        token allowed by the mask before it). One mask is filled, whatever len(tokens): the matcher
        steps over the tokens, fills, and rolls back. The state is left where it was; the mask is
        kept until the next commit, for `masks` to reuse."""
        tokens = [int(t) for t in tokens]
        key = tuple(tokens)
        if key not in self._filled:
            self._filled[key] = self._fill_after(tokens)
        return self._allowed(self._filled[key][None])[0]

    def _fill_after(self, tokens: list[int]) -> np.ndarray:
        """A new bitmask row [W] of the state after the committed tokens + `tokens`."""
        bits = self._llg.numpy.allocate_token_bitmask(1, self.vocab)
        if tokens and not self.m.consume_tokens(tokens):
            raise GrammarError(f"the grammar refused a drafted token: {self.m.get_error()}")
        try:
            self._llg.numpy.fill_next_token_bitmask(self.m, bits, 0)
        finally:
            if tokens:
                self.m.rollback(len(tokens))
        return bits[0]

    def valid_prefix(self, tokens) -> int:
        """How many of `tokens` the grammar accepts in a row from the committed state."""
        return self.m.validate_tokens([int(t) for t in tokens]) if len(tokens) else 0

    def commit(self, tokens) -> None:
        """Advance over committed tokens (each was allowed by its mask)."""
        self._filled.clear()  # masks of drafts from the state before
        if tokens and not self.m.consume_tokens([int(t) for t in tokens]):
            raise GrammarError(f"the grammar refused a committed token: {self.m.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow."""
        return self.m.is_stopped()

    @property
    def spent(self) -> bool:
        """Nothing is constrained any more (never, for a grammar: it holds to the end;
        runtime/sampling/text_prefix.py's is spent once its text is written)."""
        return False


def apply_mask(rows: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """rows [T, V] logits, allowed bool [T, V] -> a copy with forbidden tokens at -inf."""
    return np.where(allowed, rows, np.float32(-np.inf)).astype(np.float32, copy=False)
