"""A request as plain data: what was asked, where it stands, what it has produced.

The engine thread owns every field except `cancelled` (set by the client, read at the next
step) and reports through `sink(kind, value)`: ("tokens", [ids]) per committed chunk (preceded
by ("logprobs", [TokenLogprob]) for the same tokens when asked), then ("done", Stats) or
("error", exception). Nothing here runs a model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..sampling.draws import Draws, SamplingConfig
from ..sampling.logits import Penalties

if TYPE_CHECKING:
    from ..drafters import Drafter
    from ..sampling.grammar import Matcher

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"
_ids = itertools.count()


@dataclass
class Request:
    prompt: list[int]
    cfg: SamplingConfig
    max_new_tokens: int
    eos_ids: frozenset[int]  # end of generation: a committed one ends the output, itself not kept
    k: int  # draft tokens per round (fixed k), the ceiling with adaptive k
    draft: str = "none"  # "model" | "none" | "ngram" | "auto"
    adaptive: bool = False
    seed: int | list[int] | None = 0  # the key of its draws; [seed, i] for choice i of a prompt (n > 1); None: fresh
    coupled: bool = True  # seeded: sampled tokens keyed by output position (runtime/sampling/draws.py `Draws`)
    sink: Callable[[str, object], None] = lambda kind, value: None
    timeout_s: float | None = None  # from submission; then the request ends with stop_reason "timeout"
    penalties: Penalties | None = None  # runtime/sampling/logits.py: applied at every verified position
    logprobs: int | None = None  # report each new token's logprob and this many alternatives (None: off)
    grammar: Matcher | None = None  # runtime/sampling/grammar.py: the output must match it (None: free)
    text_prefix: str = ""  # the tokens write this first, not the output's text (sampling/text_prefix.py)
    stats: Stats = None  # filled in place (the caller may pass its own)
    # engine-owned state
    id: int = field(default_factory=lambda: next(_ids))
    state: str = WAITING
    slot: int = -1
    seq: list[int] = field(default_factory=list)  # prompt + committed new tokens
    prefilled: int = 0  # prompt tokens in the target's cache (reused ones included)
    produced: int = 0  # new tokens emitted
    rng: Draws | None = None  # this request's randomness (keyed by output position when coupled)
    drafter: Drafter | None = None  # per-request drafter state (runtime/drafters/protocol.py)
    policies: dict = field(default_factory=dict)  # route -> AdaptivePolicy (adaptive k)
    route: str | None = None  # this step's sub-drafter ("model" | "ngram"), chosen before k
    cancelled: bool = False
    token_logprobs: list = field(default_factory=list)  # client-owned: the "logprobs" events, in order
    t_submit: float | None = None  # set by Engine.submit: timeouts and queue time count from there
    t_first: float = 0.0

    def __post_init__(self):
        if self.stats is None:
            self.stats = Stats()
        # unseeded requests have no output to reproduce: they keep rejection sampling, which
        # accepts a little more (docs/benchmarks.md §12)
        self.rng = Draws(self.seed, len(self.prompt), self.coupled and self.seed is not None)
        self.seq = list(self.prompt)
        self.stats.prompt_tokens = len(self.prompt)

    def expired(self, now: float) -> bool:
        """Past its timeout, counted from submission (a request not yet submitted is not)."""
        return self.timeout_s is not None and self.t_submit is not None and now - self.t_submit > self.timeout_s

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.produced


@dataclass
class Stats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV rows were reused, not computed (prefix cache)
    new_tokens: int = 0
    prefill_ms: float = 0.0  # admitted -> first new token (target prompt chunks, in steps shared
    #                          with others), plus draft_prefill_ms
    ttft_ms: float = 0.0  # submitted -> first new token known (queue_ms + the target's part of prefill_ms)
    draft_prefill_ms: float = 0.0  # a separate draft reading the prompt, in its first round after the
    #                                first token (a self-draft adopts the target's rows: 0)
    decode_ms: float = 0.0  # first token -> last token
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
    stop_reason: str = ""  # "eos" | "length" | "stop" (ended by the client) | "timeout" | "interrupted" | "error"
    queue_ms: float = 0.0  # submit -> admitted to a slot
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


