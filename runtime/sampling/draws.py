"""logits -> probabilities with temperature, top-k, top-p and llama.cpp's infill filter (pure
NumPy), and a request's randomness (`Draws`: keyed by output position).

The same `SamplingConfig` is applied to target and draft rows, which exact speculative sampling
requires: verification compares the two *processed* distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidRequest
from .infill import InfillSampler

NOISE_DOMAIN = 1  # keys [seed, choice, NOISE_DOMAIN, t] of the coupled noise: apart from the uncoupled stream


class InvalidSampling(InvalidRequest):
    """A sampling setting out of range; `param` names it."""


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    infill: InfillSampler | None = None  # llama.cpp's infill sampler after top-p (sampling/infill.py); None: off

    def __post_init__(self):
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidSampling(f"temperature must be >= 0 (0 = greedy), got {self.temperature}", "temperature")
        if self.top_k < 0 or int(self.top_k) != self.top_k:
            raise InvalidSampling(f"top_k must be a non-negative integer (0 = off), got {self.top_k}", "top_k")
        if not 0 < self.top_p <= 1:
            raise InvalidSampling(f"top_p must be in (0, 1], got {self.top_p}", "top_p")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """logits [..., V] float -> probabilities [..., V] float64 (rows sum to 1).

    top-k keeps the k largest logits (ties at the boundary kept); top-p keeps the smallest set
    of most probable tokens whose mass reaches p (the token that crosses p is kept); then the
    infill filter, if the config has one.
    """
    x = np.asarray(logits, dtype=np.float64) / cfg.temperature
    x = x - x.max(axis=-1, keepdims=True)
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = np.partition(x, -cfg.top_k, axis=-1)[..., -cfg.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if cfg.top_p < 1.0:
        p = _top_p(p, cfg.top_p)
    if cfg.infill is not None:
        p = cfg.infill(p, truncated=0 < cfg.top_k < x.shape[-1] or cfg.top_p < 1.0)
    return p


def sample(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from p [V] with a uniform u in [0, 1)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))


class Draws:
    """A request's randomness, keyed so that a sampled token is a pure function of (seed, choice,
    output position) — never of how many draws earlier rounds took, of k, of the batch, or of
    how the prompt's rows were computed.

    Coupled sampling (the default, `coupled=True`): the token at output position t is
    argmax_x p_t(x) / E_t(x), E_t(x) ~ Exp(1) i.i.d. keyed by (key, t) — the exponential race,
    which is Gumbel-max: an exact sample of p_t. Target-only decoding and every drafter use the
    same E_t, so a draft proposes argmax q_t / E_t and verification keeps a proposal while it
    equals the target's own pick: the output is token for token what target-only sampling with
    the same seed gives (runtime/engine/speculate.py `verify`). `coupled=False`: the uniforms of
    one stream, consumed in order (rejection sampling, runtime/sampling/verify.py `verify_sampling`).
    """

    def __init__(self, seed: int | list[int] | None, prompt_len: int, coupled: bool = True):
        """seed: an int (choice 0), [seed, i] (choice i of one prompt), or None (a fresh key:
        independent samples)."""
        if seed is None:
            seed = int(np.random.SeedSequence().entropy) % 2**64
        key = [int(seed), 0] if np.ndim(seed) == 0 else [int(s) for s in seed]
        self.key = key
        self.prompt_len = prompt_len
        self.coupled = coupled
        self.rng = np.random.default_rng(key)  # the uncoupled stream
        self._noise: dict[int, np.ndarray] = {}  # output position -> E_t float64 [V]

    def random(self, size=None):
        """Uniforms in [0, 1) from the uncoupled stream."""
        return self.rng.random(size)

    def exponentials(self, t: int, vocab: int) -> np.ndarray:
        """E_t float64 [vocab] for output position t (cached until `forget`)."""
        e = self._noise.get(t)
        if e is None or len(e) != vocab:
            g = np.random.default_rng([*self.key, NOISE_DOMAIN, t])
            e = g.standard_exponential(vocab)  # float64: as fast as float32 here, finer near 0
            np.maximum(e, 1e-300, out=e)  # p / E stays defined (0 / 0 would be NaN)
            self._noise[t] = e
        return e

    def scores(self, p: np.ndarray, seq_len: int) -> np.ndarray:
        """p [T, V] (row i: the position after seq_len + i tokens) -> p / E, whose row argmax is
        each row's coupled sample."""
        out = np.empty(p.shape, dtype=np.float64)
        for i in range(p.shape[0]):
            np.divide(p[i], self.exponentials(seq_len + i - self.prompt_len, p.shape[1]), out=out[i])
        return out

    def pick(self, p: np.ndarray, seq_len: int) -> int:
        """One token from p [V] for the position after seq_len tokens."""
        if self.coupled:
            return int(self.scores(p[None], seq_len)[0].argmax())
        return sample(p, self.rng.random())

    def forget(self, seq_len: int) -> None:
        """Positions before the one after seq_len tokens are committed: drop their noise."""
        t0 = seq_len - self.prompt_len
        for t in [t for t in self._noise if t < t0]:
            del self._noise[t]


def _top_p(p: np.ndarray, top_p: float, head: int = 256) -> np.ndarray:
    """Nucleus filter on rows of p. Sorting all V entries costs milliseconds per row at V = 49k; the
    nucleus is almost always inside the `head` most probable tokens, so those are sorted first
    and the full sort is only the fallback. Same result either way (stable order: -p, index)."""
    flat = p.reshape(-1, p.shape[-1])
    out = np.empty_like(flat)
    V = flat.shape[-1]
    for r, row in enumerate(flat):
        keep = None
        if head < V:
            cand = np.argpartition(-row, head)[:head]
            cand = cand[np.lexsort((cand, -row[cand]))]  # by -p, ties by index
            before = np.cumsum(row[cand]) - row[cand]
            inside = before < top_p
            last = int(np.flatnonzero(inside)[-1])
            # decided inside the head iff the nucleus ends before the head's last token and no
            # token outside the head ties with the boundary
            if last < head - 1 and row[cand[last]] > row[cand[-1]]:
                keep = cand[: last + 1]
        if keep is None:
            order = np.argsort(-row, kind="stable")
            before = np.cumsum(row[order]) - row[order]
            keep = order[before < top_p]
        out[r] = 0.0
        out[r, keep] = row[keep]
        out[r] /= out[r].sum()
    return out.reshape(p.shape)
