"""Engine counters as data (monotonic totals, as vLLM's spec-decode metrics are): the server's
/metrics and the bench read snapshots; ratios are computed by whoever reads them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Counters:
    max_k: int = 16
    steps: int = 0  # decode steps run
    rows: int = 0  # decoding requests summed over steps (rows / steps = mean batch)
    tokens: int = 0  # tokens committed by decode steps (prefill's first tokens not included)
    drafting_steps: int = 0  # steps in which at least one row drafted
    target_calls: int = 0
    draft_calls: int = 0
    prefill_tokens: int = 0  # prompt tokens computed by the target (reused prefixes not included)
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (vLLM's name)
    prefix_cache_hits: int = 0  # of them, tokens whose rows were reused
    finished: int = 0  # requests ended (any reason)
    drafts: int = 0  # verification rounds with >= 1 proposed token
    draft_tokens: int = 0  # proposed
    accepted_tokens: int = 0  # proposed and accepted
    accepted_per_position: list[int] = field(default_factory=list)  # [j]: rounds whose token j was accepted

    def __post_init__(self):
        self.accepted_per_position = [0] * self.max_k

    def record_draft(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.drafts += 1
            self.draft_tokens += proposed
            self.accepted_tokens += accepted
            for j in range(min(accepted, self.max_k)):
                self.accepted_per_position[j] += 1

    def snapshot(self) -> dict:
        d = asdict(self)
        d.pop("max_k")
        return d
