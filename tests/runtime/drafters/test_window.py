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


def _exact(cold, prompt, got):
    want = [t for c in cold.stream_ids(prompt, max_new_tokens=N, draft="none", ignore_eos=True) for t in c]
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
            if window is not None:  # rows: the window, a round's proposals and what it committed
                assert max(lengths) <= window + N + 3
            prompt = prompt + got + _prompt(turn + 1, 6)[1:]


def test_the_window_bounds_what_the_draft_reads_and_is_not_left_for_reuse(tiny_bundles):
    folder = tiny_bundles["good"]
    with specrt.load(folder, max_batch=1, adaptive=False, draft_window=8) as pipe:
        d = pipe.parts.draft
        seen = []
        run_request(pipe, _prompt(3), lambda r: seen.append((r.slot, d.pool.length(d.track, r.slot))),
                    max_new_tokens=4, draft="model", k=2, ignore_eos=True)
        slot, most = seen[0][0], max(n for _, n in seen)
        assert 8 <= most <= 8 + 4  # the window and what the rounds committed, never the 70-token prompt
        # parked: the target's rows stay for reuse, the windowed draft's (no prefix) do not
        assert d.pool.length(d.track, slot) == 0
        assert pipe.parts.target.pool.length(pipe.parts.target.track, slot) > 70


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
