"""The prefix-affinity table and policy (runtime/serve/ray/affinity.py), without Ray."""

from __future__ import annotations

import threading

from specrt.runtime.serve.ray.affinity import AffinityTable, block_hashes, rank


def test_block_hashes_chain_full_blocks_only():
    a = block_hashes(list(range(100)), block=32)
    assert len(a) == 3  # 100 tokens: three full blocks, the tail has none
    assert block_hashes(list(range(64)), block=32) == a[:2]  # a shared prefix, shared hashes
    other = block_hashes([7] + list(range(1, 100)), block=32)
    assert all(x != y for x, y in zip(a, other, strict=True))  # block 0 differs: so does every later one


def test_match_counts_leading_blocks_per_replica():
    t = AffinityTable()
    turn1 = list(range(70))
    turn2 = turn1 + list(range(500, 560))
    t.record("r1", block_hashes(turn1, 32))
    t.record("r2", block_hashes(list(range(1000, 1070)), 32))
    assert t.match(block_hashes(turn2, 32), ["r1", "r2", "r3"]) == {"r1": 2, "r2": 0, "r3": 0}
    t.report("r3", block_hashes(turn2, 32))  # the replica says it holds turn 2's blocks
    assert t.match(block_hashes(turn2, 32), ["r1", "r3"]) == {"r1": 2, "r3": 4}
    t.report("r3", [])  # a report replaces the previous one
    t.forget("r1")
    assert t.match(block_hashes(turn2, 32), ["r1", "r3"]) == {"r1": 0, "r3": 0}


def test_table_is_bounded_and_thread_safe():
    t = AffinityTable(max_blocks=50)

    def work(i):
        for j in range(50):
            t.record(f"r{i % 3}", block_hashes([i, j] * 64, 32))
            t.match(block_hashes([i, j] * 64, 32), ["r0", "r1", "r2"])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(t._sent) <= 50
    assert sum(t.size(f"r{i}") for i in range(3)) <= 50 * 3


def test_rank_affinity_unless_too_uneven():
    # the replica holding the conversation wins while its load is within the threshold
    order, why = rank({"a": 5, "b": 1}, {"a": 3, "b": 0}, {}, imbalance=4)
    assert (order[0], why) == ("a", "affinity")
    order, why = rank({"a": 5, "b": 1}, {"a": 5, "b": 0}, {}, imbalance=4)
    assert (order[0], why) == ("b", "balance")
    # nobody holds a block: least loaded, ties to the replica caching least
    order, why = rank({"a": 0, "b": 0}, {"a": 1, "b": 1}, {"a": 10, "b": 2}, imbalance=4)
    assert (order, why) == (["b", "a"], "spread")
    # equal matches (a shared system prompt everywhere): the less loaded one
    order, why = rank({"a": 3, "b": 3}, {"a": 2, "b": 1}, {}, imbalance=4)
    assert (order[0], why) == ("b", "affinity")
