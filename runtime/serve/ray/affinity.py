"""Which replica likely holds a prompt's prefix: chained hashes of token blocks, per replica.

A prompt of token ids is cut into full blocks of `BLOCK` tokens; block i's hash covers blocks
0..i (each hash chains the previous one), so equal hashes mean equal prefixes, as vLLM's
prefix cache keys its blocks. `AffinityTable` keeps, per replica, the block hashes of the
prompts the router sent there and of what the replica itself reported holding (its slots'
tokens, `routing_stats`); `match` says how many leading blocks of a prompt each replica holds.
Plain data and a lock, no Ray: the router calls it from its event loop, the tests directly.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict

import numpy as np

BLOCK = 32  # tokens per block: a chat turn's header is shorter, a system prompt many blocks
ROUTERS: weakref.WeakSet = weakref.WeakSet()  # the request routers of this process (router.py)


def replica_stats(deployment: str) -> dict[str, dict]:
    """Replica id -> its latest routing stats, as seen by this process's routers for
    `deployment` (empty before the first request through a handle creates a router)."""
    out: dict[str, dict] = {}
    for router in list(ROUTERS):
        for rid, replica in list(router.curr_replicas.items()):
            if rid.deployment_id.name == deployment:
                out[rid.unique_id] = replica.routing_stats
    return out


def block_hashes(ids: list[int], block: int = BLOCK) -> list[int]:
    """Chained hashes of the full blocks of `ids` (a trailing partial block has none)."""
    arr = np.asarray(ids, dtype=np.int64)
    out, prev = [], b""
    for i in range(len(arr) // block):
        prev = hashlib.blake2b(prev + arr[i * block:(i + 1) * block].tobytes(), digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


class AffinityTable:
    """Block hash -> the replicas holding it, bounded (least recently touched hashes go first).

    Two sources per replica: `record` (prompts sent there; they stay until evicted from the
    table) and `report` (what the replica says its KV holds now; each report replaces the
    previous one). Replicas are opaque hashable ids. Thread-safe."""

    def __init__(self, max_blocks: int = 200_000):
        self.max_blocks = max_blocks
        self._sent: OrderedDict[int, set] = OrderedDict()  # hash -> replicas it was sent to
        self._reported: dict = {}  # replica -> frozenset of hashes it holds
        self._n_sent: dict = {}  # replica -> hashes in _sent that name it
        self._lock = threading.Lock()

    def record(self, replica, hashes: list[int]) -> None:
        """The prompt with these block hashes was sent to `replica`."""
        with self._lock:
            for h in hashes:
                owners = self._sent.setdefault(h, set())
                if replica not in owners:
                    owners.add(replica)
                    self._n_sent[replica] = self._n_sent.get(replica, 0) + 1
                self._sent.move_to_end(h)
            while len(self._sent) > self.max_blocks:
                for r in self._sent.popitem(last=False)[1]:
                    self._n_sent[r] -= 1

    def report(self, replica, hashes) -> None:
        """`replica` holds exactly these block hashes now (its latest routing stats)."""
        with self._lock:
            self._reported[replica] = frozenset(hashes)

    def forget(self, replica) -> None:
        """The replica is gone (died, scaled down): nothing is held there any more."""
        with self._lock:
            self._reported.pop(replica, None)
            self._n_sent.pop(replica, None)
            for owners in self._sent.values():
                owners.discard(replica)

    def match(self, hashes: list[int], replicas: list) -> dict:
        """replica -> how many leading blocks of the prompt it holds (0 for unknown ones)."""
        with self._lock:
            out = {}
            for r in replicas:
                held = self._reported.get(r, frozenset())
                n = 0
                for h in hashes:
                    if r not in self._sent.get(h, ()) and h not in held:
                        break
                    n += 1
                out[r] = n
            return out

    def size(self, replica) -> int:
        """Blocks known to be held by `replica` (sent or reported): how much it caches."""
        with self._lock:
            return max(self._n_sent.get(replica, 0), len(self._reported.get(replica, ())))


def rank(match: dict, load: dict, held: dict, imbalance: int, recent: dict | None = None) -> tuple[list, str]:
    """The replicas in order of preference, and the rule that ordered them (SGLang's router
    policy). match: replica -> leading prompt blocks it holds; load: replica -> requests in
    flight there; held: replica -> blocks it caches; imbalance: how many more requests than the
    least loaded replica the best-matching one may have and still be chosen.
    - "affinity": the replica holding the longest prefix (ties: the less loaded) first;
    - "balance": it is too loaded: least loaded first (ties: longer match);
    - "spread": no replica holds a block of it: least loaded first, ties to the replica caching
      least, then to the one chosen longest ago (recent: replica -> a counter of its last
      choice), so new conversations spread over the replicas."""
    recent = recent or {}
    least = min(load.values())
    best = max(match, key=lambda r: (match[r], -load[r]))
    if match[best] == 0:
        return sorted(load, key=lambda r: (load[r], held.get(r, 0), recent.get(r, 0))), "spread"
    if load[best] - least > imbalance:
        return sorted(load, key=lambda r: (load[r], -match[r])), "balance"
    return [best] + sorted((r for r in load if r != best), key=lambda r: (-match[r], load[r])), "affinity"
