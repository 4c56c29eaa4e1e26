"""The speculation loop: propose -> verify -> commit -> rewind.

Invariants at the start of every round (n = len(seq), the committed tokens):
  target cache holds seq[:n-1]; seq[-1] is fed by this round's verification call.
  drafter caches (if any) hold a prefix of seq.
A round feeds the target [seq[-1], d_1..d_k] in ONE call (k+1 rows of logits), keeps the valid
prefix of the draft plus one target token, and rewinds the target cache to n' - 1.
k = 0 (no drafter, or nothing proposed) is a plain target step through the same code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from .adaptive import PolicySet
from .decoder import Decoder, NonFiniteLogits
from .sampling import SamplingConfig, probs, sample
from .verify import verify_greedy, verify_sampling


@dataclass
class Stats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_ms: float = 0.0  # prompt through target and draft (the draft's part after the first token is out)
    ttft_ms: float = 0.0  # start -> first new token known (target prefill only)
    draft_prefill_ms: float = 0.0  # prompt through the draft, after the first token was yielded
    decode_ms: float = 0.0  # first token -> last token (includes draft_prefill_ms: nothing is left out)
    tpot_ms: float = 0.0  # decode_ms per token after the first
    tokens_per_s: float = 0.0  # new tokens after the first / decode time
    rounds: int = 0
    draft_tokens: int = 0  # proposed
    accepted_tokens: int = 0  # proposed and accepted
    acceptance_rate: float = 0.0  # accepted / proposed
    mean_accepted_per_round: float = 0.0  # tokens committed per round, bonus included
    per_position_acceptance: list[float] = field(default_factory=list)  # P(accept | reached pos j)
    draft_ms: float = 0.0  # time in drafters
    verify_ms: float = 0.0  # time in target calls after prefill
    other_ms: float = 0.0  # decode time outside both (sampling, bookkeeping)
    k_history: list[int] = field(default_factory=list)  # proposals per round
    drafter_rounds: dict = field(default_factory=dict)  # drafter name -> rounds it proposed
    stop_reason: str = ""  # "eos" | "length" | "stop" | "interrupted"
    _pos_tried: list[int] = field(default_factory=list, repr=False)
    _pos_ok: list[int] = field(default_factory=list, repr=False)

    def record_round(self, proposed: int, accepted: int, drafter: str | None):
        self.rounds += 1
        self.k_history.append(proposed)
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        if drafter and proposed:
            self.drafter_rounds[drafter] = self.drafter_rounds.get(drafter, 0) + 1
        while len(self._pos_tried) < proposed:
            self._pos_tried.append(0)
            self._pos_ok.append(0)
        for j in range(min(proposed, accepted + 1)):  # positions reached this round
            self._pos_tried[j] += 1
            self._pos_ok[j] += j < accepted

    def finish(self):
        self.acceptance_rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0
        after_first = max(0, self.new_tokens - 1)
        self.mean_accepted_per_round = after_first / self.rounds if self.rounds else 0.0
        self.per_position_acceptance = [ok / t if t else 0.0 for ok, t in zip(self._pos_ok, self._pos_tried, strict=True)]
        self.tpot_ms = self.decode_ms / after_first if after_first else 0.0
        self.tokens_per_s = 1000.0 * after_first / self.decode_ms if self.decode_ms > 0 else 0.0
        self.other_ms = max(0.0, self.decode_ms - self.draft_ms - self.verify_ms)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def _check_finite(logits: np.ndarray, what: str):
    if not np.isfinite(logits.max()):  # max propagates NaN, so one reduction covers NaN and inf
        raise NonFiniteLogits(f"{what} produced non-finite logits (NaN/inf): the model or its export is broken")


class Speculator:
    """Owns nothing but references: the target decoder and an optional drafter."""

    def __init__(self, target: Decoder, drafter=None, policy=None):
        self.target = target
        self.drafter = drafter
        self.policy = policy  # AdaptivePolicy or None (fixed k)

    def prefill(self, prompt: list[int], cfg: SamplingConfig, rng, draft: bool = True) -> int:
        """Target prefill -> the first new token; draft=True also feeds the prompt to the drafter
        (`run` does that after yielding the first token instead)."""
        self.target.reset()
        row = self.target.prefill(prompt)
        _check_finite(row, "target")
        first = int(row.argmax()) if cfg.greedy else sample(probs(row, cfg), rng.random())
        if draft and self.drafter is not None:
            self.drafter.begin(prompt)
        return first

    def round(self, seq: list[int], k: int, cfg: SamplingConfig, rng, stats: Stats) -> list[int]:
        """One propose -> verify -> commit; returns the committed new tokens (>= 1)."""
        t0 = time.perf_counter()
        draft, q = np.empty(0, dtype=np.int64), None
        if k > 0 and self.drafter is not None:
            draft, q = self.drafter.propose(seq, k, cfg, rng, self.policy)
        t1 = time.perf_counter()
        logits = self.target.forward(np.concatenate(([seq[-1]], draft)))  # [k'+1, V], one call
        t2 = time.perf_counter()
        _check_finite(logits, "target")
        if cfg.greedy:
            n_ok, nxt = verify_greedy(draft, logits)
        else:
            p = probs(logits, cfg)
            n_ok, nxt = verify_sampling(draft, q, p, rng.random(len(draft)), rng.random())
        new = [int(t) for t in draft[:n_ok]] + [nxt]
        n_after = len(seq) + len(new)
        self.target.rewind(n_after - 1)
        if self.drafter is not None:
            self.drafter.commit(n_after)
        if self.policy is not None:
            if k > 0:
                self.policy.update(len(draft), n_ok, getattr(self.drafter, "confs", []),
                                   1000 * (t1 - t0), 1000 * (t2 - t1))
            else:
                self.policy.costs.observe(0, 0.0, 1000 * (t2 - t1))
        stats.draft_ms += 1000 * (t1 - t0)
        stats.verify_ms += 1000 * (t2 - t1)
        stats.record_round(len(draft), n_ok, getattr(self.drafter, "name", None))
        return new

    def run(
        self,
        prompt: list[int],
        cfg: SamplingConfig,
        *,
        k: int,
        max_new_tokens: int,
        eos_ids: set[int],
        seed: int | None = 0,
        stats: Stats | None = None,
    ) -> Iterator[list[int]]:
        """Yields the new tokens in committed chunks (the first chunk is the first token).
        Stops after an EOS token (not yielded) or max_new_tokens; `stats` is filled in place."""
        stats = stats if stats is not None else Stats()
        rng = np.random.default_rng(seed)
        stats.prompt_tokens = len(prompt)
        t_start = time.perf_counter()
        # the first token needs only the target: it goes out before the draft reads the prompt
        first = self.prefill(prompt, cfg, rng, draft=False)
        t_first = time.perf_counter()
        stats.prefill_ms = stats.ttft_ms = 1000 * (t_first - t_start)
        seq = list(prompt) + [first]
        produced = 1
        try:
            if first in eos_ids:
                stats.new_tokens, stats.stop_reason = 0, "eos"
                return
            stats.new_tokens = 1
            yield [first]
            if self.drafter is not None and (k > 0 or self.policy is not None) and produced < max_new_tokens:
                t0 = time.perf_counter()
                self.drafter.begin(prompt)
                stats.draft_prefill_ms = 1000 * (time.perf_counter() - t0)
                stats.prefill_ms += stats.draft_prefill_ms
            while produced < max_new_tokens:
                kk = k
                if self.policy is not None and self.drafter is not None:
                    if isinstance(self.policy, PolicySet):  # routing drafter: k from the route's policy
                        self.policy.select(self.drafter.route(seq))
                    kk = self.policy.choose_k()
                kk = min(kk, max_new_tokens - produced - 1)
                new = self.round(seq, kk, cfg, rng, stats)
                for i, t in enumerate(new):
                    if t in eos_ids:
                        new, stats.stop_reason = new[:i], "eos"
                        break
                new = new[: max_new_tokens - produced]
                seq.extend(new)
                produced += len(new)
                stats.new_tokens = produced
                stats.decode_ms = 1000 * (time.perf_counter() - t_first)
                if new:
                    yield new
                if stats.stop_reason:
                    return
            stats.stop_reason = "length"
        finally:
            stats.decode_ms = 1000 * (time.perf_counter() - t_first)
            if not stats.stop_reason:
                stats.stop_reason = "stop"
            stats.finish()
