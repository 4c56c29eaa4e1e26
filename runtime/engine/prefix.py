"""Where a new request goes: the KV slot, and how much of its prompt is already computed there.

Slots remember what they hold (runtime/backends/kvpool.py: idle slots keep their rows and token ids; a
running request's committed rows are stable). For a new prompt the placement finds the longest
prefix any slot holds and reuses those rows instead of prefilling them:

  1. an idle slot whose whole content the prompt extends (a conversation's next turn) is taken
     as it is: no copy, nothing lost;
  2. otherwise the rows are copied (a memcpy per layer and K/V, milliseconds against seconds of
     prefill) into the lowest empty slot, so the idle slot keeps its longer content for its own
     next turn; with no empty slot, into the least recently used idle slot — or, when that one
     is the source, it is taken as it is;
  3. nothing shared: the lowest empty slot, else the least recently used idle one, emptied.

At most len(prompt) - 1 rows are reused: the last prompt token is always computed, since its
logits choose the first new token. Rule 2 prefers an empty slot to taking a partly matching idle
slot because the idle slot's tail is some conversation's history, likely to come back. "Used"
is parked or copied from (a prefix just reused is hot); least recently used first is what vLLM's
block cache evicts by, for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.kvpool import KVPool


@dataclass(frozen=True)
class Placement:
    slot: int  # the slot the request gets
    reuse: int  # prompt rows already computed: the target track's length once placed
    source: int | None = None  # copy rows [0, reuse) from this slot (None: `slot` holds them)


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def place(prompt, pool: KVPool, running: dict[int, list[int]], reuse: bool = True) -> Placement | None:
    """The slot for `prompt` and the rows it reuses. running: busy slot -> the token ids its
    target rows hold (committed). reuse=False: no prefix reuse (the lowest empty slot, else the
    least recently used idle one). None when every slot is busy."""
    empty, idle, lru = pool.empty_slots(), pool.idle(), pool.lru_idle()
    fresh = empty[0] if empty else lru
    if fresh is None:
        return None
    if not reuse:
        return Placement(fresh, 0)
    limit = len(prompt) - 1
    best, src, src_idle = 0, None, False
    for slot, held in [*idle.items(), *(running.items() if pool.can_copy else ())]:
        m = min(common_prefix(prompt, held), limit)
        is_idle = slot in idle
        # ties: an idle slot (maybe no copy) over a running one
        if m > best or (m == best and m > 0 and is_idle and not src_idle):
            best, src, src_idle = m, slot, is_idle
    if best == 0:
        return Placement(fresh, 0)
    if src_idle and (best == len(idle[src]) or not pool.can_copy or (not empty and lru == src)):
        return Placement(src, best)  # rule 1 (or a pool that cannot copy)
    return Placement(fresh, best, src)
