"""What a request does to the target's logits before a token is chosen, and what it reports.

Pure NumPy. Speculation stays exact because row i of a verification call (the position of
draft[i]) is processed exactly as a target-only step at that position would be: with the
history the tokens before it make — the committed output plus draft[:i] — so every position
sees the same distribution with and without a draft (vLLM's fix after penalties were silently
ignored under speculation).

Processing order (vLLM's): min_tokens (EOS masked until that many tokens), logit_bias (added by
token id), repetition_penalty (prompt and output tokens: positive logits divided, negative
multiplied — the HF / llama.cpp rule), frequency and presence penalties (output tokens only, as
OpenAI defines them: logit -= frequency · count + presence · [count > 0]), then a grammar's mask
(runtime/sampling/grammar.py). Temperature, top-k and top-p come after, in `sampling.probs`.

Logprobs are the raw log-softmax of the target's logits at each emitted position — before
temperature, penalties and masks — as vLLM reports them by default: the same numbers with and
without speculation, up to the float differences of a wider call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Penalties:
    frequency: float = 0.0  # OpenAI frequency_penalty, [-2, 2]
    presence: float = 0.0  # OpenAI presence_penalty, [-2, 2]
    repetition: float = 1.0  # vLLM / llama.cpp repetition_penalty, > 0 (1 = off)
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> bias in [-100, 100]
    min_tokens: int = 0  # EOS is masked until this many new tokens exist

    def __post_init__(self):
        for name, lo, hi in (("frequency", -2, 2), ("presence", -2, 2)):
            v = getattr(self, name)
            if not (np.isfinite(v) and lo <= v <= hi):
                raise ValueError(f"{name}_penalty must be in [{lo}, {hi}], got {v}")
        if not (np.isfinite(self.repetition) and self.repetition > 0):
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        for t, b in self.logit_bias.items():
            if not (np.isfinite(b) and -100 <= b <= 100):
                raise ValueError(f"logit_bias values must be in [-100, 100], got {b} for token {t}")

    @property
    def active(self) -> bool:
        return bool(self.frequency or self.presence or self.repetition != 1.0 or self.logit_bias or self.min_tokens)

    def check_vocab(self, vocab: int) -> None:
        bad = [t for t in self.logit_bias if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"logit_bias names token ids outside the vocabulary [0, {vocab}): {bad[:5]}")


def apply_penalties(rows: np.ndarray, pen: Penalties, prompt, output, drafts, eos_ids) -> np.ndarray:
    """rows [T, V] raw logits of T consecutive positions; row i follows output + drafts[:i]
    (output: the committed new tokens; drafts: at least T - 1 tokens). -> new float32 [T, V]."""
    out = np.array(rows, dtype=np.float32, copy=True)
    T, V = out.shape
    produced = len(output)
    if pen.min_tokens and produced < pen.min_tokens and eos_ids:
        eos = np.fromiter(eos_ids, dtype=np.int64)
        for i in range(min(T, pen.min_tokens - produced)):
            out[i, eos] = -np.inf
    if pen.logit_bias:
        ids = np.fromiter(pen.logit_bias.keys(), dtype=np.int64)
        out[:, ids] += np.fromiter(pen.logit_bias.values(), dtype=np.float32)
    if pen.repetition == 1.0 and not pen.frequency and not pen.presence:
        return out
    # only the tokens seen so far change: work over their ids, never over the whole vocabulary
    history = np.concatenate((np.asarray(output, dtype=np.int64), np.asarray(drafts[: T - 1], dtype=np.int64)))
    prompt_ids = np.unique(np.asarray(prompt, dtype=np.int64))
    for i in range(T):
        ids, n = np.unique(history[: produced + i], return_counts=True)  # row i: output + drafts[:i]
        row = out[i]
        if pen.repetition != 1.0:
            seen = np.union1d(prompt_ids, ids)
            vals = row[seen]
            row[seen] = np.where(vals > 0, vals / pen.repetition, vals * pen.repetition)
        if (pen.frequency or pen.presence) and len(ids):
            row[ids] -= pen.frequency * n.astype(np.float32) + pen.presence * np.ones(len(ids), dtype=bool)
    return out


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # the n most likely tokens at this position, most likely first


def logprobs(rows: np.ndarray, tokens, top_n: int) -> list[TokenLogprob]:
    """rows [n, V] raw logits; tokens [n] the tokens chosen there -> their log-probabilities and
    the top_n alternatives of each row (log-softmax in float64)."""
    out = []
    for row, t in zip(rows, tokens, strict=True):
        x = np.asarray(row, dtype=np.float64)
        m = x.max()
        lse = m + np.log(np.exp(x - m).sum())
        top: list[tuple[int, float]] = []
        if top_n:
            idx = np.argpartition(-x, top_n - 1)[:top_n]
            idx = idx[np.lexsort((idx, -x[idx]))]
            top = [(int(j), float(x[j] - lse)) for j in idx]
        out.append(TokenLogprob(int(t), float(x[int(t)] - lse), top))
    return out
