"""Ray Serve request routers for the engine deployment (`ray.serve.request_router`).

A router lives in every process that holds a handle to the engine deployment (the ingress
replicas) and sees each request's arguments: an `EngineRequest` whose `ids` are the prompt's
token ids. `PrefixAffinityRouter` sends a request to the replica most likely to hold its
prefix — a conversation's next turn, a shared system prompt — unless that replica is too much
busier than the least loaded one (SGLang's router policy, `affinity.rank`). What a replica
holds is known two ways: the prompts this router sent there, and the block hashes the replica
reports of its idle slots (`record_routing_stats`), which also covers what other routers sent.

`PowerOfTwoRouter` is Ray's default policy (two random replicas, preferring this node's; Ray
probes their queues and takes the shorter), written over Ray's public router API
(`ray.serve.request_router`) so that both routers publish the replicas' routing stats to this
process (`affinity.replica_stats`): the ingress reads them for /metrics. Ray pickles a router's module
by value into every process that routes, so state shared with the ingress lives in another
module (affinity.py), reached through its module object.
"""

from __future__ import annotations

import random

from ray.serve.request_router import (
    FIFOMixin,
    LocalityMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from . import affinity
from .affinity import BLOCK, AffinityTable, block_hashes, rank


def _prompt_ids(pending: PendingRequest | None) -> list[int] | None:
    """The prompt's token ids of an engine call (`EngineRequest.ids`); None for other calls."""
    if pending is None or not pending.args:
        return None
    return getattr(pending.args[0], "ids", None)


def two_choices(candidates: list[RunningReplica]) -> list[list[RunningReplica]]:
    """One rank of (at most) two random replicas: Ray asks both for their queue length and
    sends the request to the shorter (power of two choices)."""
    return [random.sample(candidates, min(2, len(candidates)))] if candidates else []


class PowerOfTwoRouter(FIFOMixin, LocalityMixin, RequestRouter):
    """Ray's default policy (`PowerOfTwoChoicesRequestRouter`, not public: the same steps
    here); publishes the replicas' routing stats to this process."""

    def initialize_state(self, **kwargs):
        affinity.ROUTERS.add(self)  # through the module: Ray ships this one by value

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        local = self.apply_locality_routing(pending_request)  # this node's first, then all
        return two_choices([r for r in candidate_replicas if r.replica_id in local] or candidate_replicas)


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Prefix affinity with a load-imbalance fallback. Ranks are single replicas in order of
    preference: Ray tries the next when one refuses (its `max_ongoing_requests` is reached)."""

    def initialize_state(self, imbalance: int = 2, block: int = BLOCK, max_blocks: int = 200_000):
        """imbalance: requests more than the least loaded replica beyond which affinity yields
        (small: the chat template's own system prompt is a shared prefix of every request, and
        a loose threshold piles them onto the first replica that held it; once every replica
        holds a shared prefix, matches tie and the least loaded wins); block: tokens per hashed
        block."""
        self.imbalance, self.block = imbalance, block
        self.table = AffinityTable(max_blocks)
        self.inflight: dict[str, ReplicaID] = {}  # internal request id -> replica it runs on
        self.decisions = {"affinity": 0, "balance": 0, "spread": 0}
        self.recent: dict[ReplicaID, int] = {}  # replica -> routed requests when it last got one
        affinity.ROUTERS.add(self)  # through the module: Ray ships this one by value

    def _load(self, replica: RunningReplica) -> int:
        return sum(1 for rid in list(self.inflight.values()) if rid == replica.replica_id)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # every replica is considered each time
        ids = _prompt_ids(pending_request)
        if ids is None or not candidate_replicas:  # not a generation call (health, stats): Ray's two choices
            return two_choices(candidate_replicas)
        by_id = {r.replica_id: r for r in candidate_replicas}
        match = self.table.match(block_hashes(ids, self.block), list(by_id))
        load = {rid: self._load(r) for rid, r in by_id.items()}
        held = {rid: self.table.size(rid) for rid in by_id}
        order, why = rank(match, load, held, self.imbalance, self.recent)
        self.decisions[why] += 1
        return [[by_id[rid]] for rid in order]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        ids = _prompt_ids(pending_request)
        if ids is None:
            return
        self.inflight[pending_request.metadata.internal_request_id] = replica_id
        self.recent[replica_id] = sum(self.decisions.values())
        self.table.record(replica_id, block_hashes(ids, self.block))

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.inflight.pop(internal_request_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """New replica set or new routing stats: take in what each replica says it holds,
        forget the replicas that are gone."""
        before = set(self.curr_replicas)
        super().update_replicas(replicas)
        for r in replicas:
            held = (r.routing_stats or {}).get("held_blocks")
            if held is not None and (r.routing_stats or {}).get("block") == self.block:
                self.table.report(r.replica_id, held)
        for gone in before - set(self.curr_replicas):
            self.table.forget(gone)
            self.inflight = {k: v for k, v in self.inflight.items() if v != gone}
