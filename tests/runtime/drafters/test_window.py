"""A draft with its own KV pool reads at most `draft_window` committed tokens to catch up on a
long prompt (runtime/drafters/model.py): the output stays target-only's, the draft's rows hold
only the window, and nothing of them outlives the request."""

from __future__ import annotations

import numpy as np
import pytest

import specrt
from checks import assert_same_greedy, run_request, target_margins

N = 16


def _prompt(seed: int, n: int = 70) -> list[int]:  # > one 64-token chunk
    return [1] + [int(t) for t in np.random.default_rng(seed).integers(3, 120, size=n - 1)]


def _exact(cold, prompt, got, n=N):
    want = [t for c in cold.stream_ids(prompt, max_new_tokens=n, draft="none", ignore_eos=True) for t in c]
    diff = assert_same_greedy(got, want, target_margins(cold, prompt, want) if got != want else None)
    assert diff is None, f"near-tie at token {diff}: the test cannot tell the window from float noise there"


@pytest.mark.parametrize("window", [8, 40, None])
def test_a_windowed_draft_gives_the_target_only_output(tiny_bundles, window):
    folder = tiny_bundles["good"]  # a separate draft (the target's own weights: it agrees when it sees enough)
    with specrt.load(folder, max_batch=1, prefix_cache=False, adaptive=False) as cold, \
            specrt.load(folder, max_batch=2, adaptive=False, draft_window=window) as warm:
        prompt = _prompt(0)
        for turn in range(3):  # a conversation: the next turn reuses the target's rows
            lengths: list[int] = []

            def rows(r, lengths=lengths):
                lengths.append(warm.parts.draft.pool.length(warm.parts.draft.track, r.slot))

            got, st = run_request(warm, prompt, rows,
                max_new_tokens=N, draft="model", k=3, ignore_eos=True)
            _exact(cold, prompt, got)
            assert st.draft_tokens > 0
            if window is not None:  # rows: the window, what the turns since committed (the draft's
                # rows stay with their offset for the next turn) and a round's proposals
                assert max(lengths) <= window + turn * (N + 5) + N + 3
            prompt = prompt + got + _prompt(turn + 1, 6)[1:]


def test_the_window_bounds_what_the_draft_reads_and_the_next_turn_reuses_it(tiny_bundles):
    folder = tiny_bundles["good"]
    with specrt.load(folder, max_batch=1, prefix_cache=False, adaptive=False) as cold, \
            specrt.load(folder, max_batch=1, adaptive=False, draft_window=40) as pipe:
        d = pipe.parts.draft
        seen = []
        prompt = _prompt(3)
        got, _ = run_request(pipe, prompt, lambda r: seen.append((r.slot, d.pool.length(d.track, r.slot))),
                             max_new_tokens=4, draft="model", k=2, ignore_eos=True)
        slot, most = seen[0][0], max(n for _, n in seen)
        assert 40 <= most <= 40 + 4  # the window and what the rounds committed, never the 70-token prompt
        # parked: the target's rows and the draft's window stay, the window at its offset
        held, offset = d.pool.length(d.track, slot), d.pool.offset(d.track, slot)
        assert held >= 40 and offset == len(prompt) + 1 - 40  # read at the first round: the prompt and its first token
        assert pipe.parts.target.pool.length(pipe.parts.target.track, slot) > 70
        # the next turn: the draft keeps its rows and offset and reads only the new tokens
        nxt = prompt + got + _prompt(9, 7)[1:]
        first: list[int] = []
        got2, _ = run_request(pipe, nxt, lambda r: first.append(d.pool.offset(d.track, r.slot)) if not first else None,
                              max_new_tokens=N, draft="model", k=2, ignore_eos=True)
        assert first == [offset] and d.pool.offset(d.track, slot) == offset
        _exact(cold, nxt, got2)


def test_without_a_window_the_draft_reads_the_whole_prompt_and_keeps_it(tiny_bundles):
    folder = tiny_bundles["good"]
    with specrt.load(folder, max_batch=1, adaptive=False, draft_window=None) as pipe:
        d = pipe.parts.draft
        seen = []
        run_request(pipe, _prompt(3), lambda r: seen.append((r.slot, d.pool.length(d.track, r.slot))),
                    max_new_tokens=4, draft="model", k=2, ignore_eos=True)
        slot, most = seen[0][0], max(n for _, n in seen)
        assert most >= 70
        assert d.pool.length(d.track, slot) >= 70


def test_a_window_must_hold_a_token(tiny_bundles):
    with pytest.raises(ValueError, match="draft_window"):
        specrt.load(tiny_bundles["good"], max_batch=1, draft_window=0)


def test_a_windowed_drafts_pool_holds_its_window_and_a_run_and_reads_again_past_it(tiny_bundles, monkeypatch):
    """The loader gives a windowed draft window + WINDOW_RUN rows (not the context's): a request
    that outgrows them reads the window again and keeps target-only's output."""
    from specrt.runtime.bundle import memory

    monkeypatch.setattr(memory, "WINDOW_RUN", 24)
    folder = tiny_bundles["good"]
    with specrt.load(folder, max_batch=1, prefix_cache=False, adaptive=False) as cold, \
            specrt.load(folder, max_batch=1, adaptive=False, draft_window=8, prefix_cache=False) as warm:
        d = warm.parts.draft
        assert d.pool.capacity == 8 + 24 < warm.parts.target.pool.capacity
        prompt = _prompt(5)
        lengths: list[int] = []
        got, st = run_request(warm, prompt, lambda r: lengths.append(d.pool.length(d.track, r.slot)),
                              max_new_tokens=3 * N, draft="model", k=3, ignore_eos=True)
        _exact(cold, prompt, got, 3 * N)
        assert st.draft_tokens > 0
        assert max(lengths) <= 8 + 24
        # 48 new tokens past an 8-token window outgrow 32 rows: the window was read again
        assert any(b < a for a, b in zip(lengths, lengths[1:], strict=False))


def test_the_memory_plan_counts_a_windowed_drafts_rows_not_the_contexts(tiny_bundles):
    from specrt.runtime.bundle import memory
    from specrt.runtime.bundle.loader import memory_plan
    from specrt.runtime.bundle.manifest import load_manifest

    folder = tiny_bundles["good"]
    man = load_manifest(folder)
    s_max = man.target.kv.max_seq_len
    full = memory_plan(folder, man, want_draft=True, draft_window=None)
    windowed = memory_plan(folder, man, want_draft=True, draft_window=8)
    t, d = man.target.kv.bytes_per_token(), man.draft.kv.bytes_per_token()
    assert full.kv_per_slot(s_max) == (t + d) * s_max
    rows = min(s_max, memory.windowed_rows(8))
    assert windowed.kv_per_slot(s_max) == t * s_max + d * rows
