"""Prefix reuse on real exported models through real onnxruntime sessions: every output with
reused rows equals target-only greedy of a pipeline that never reuses (a difference is
tolerated only at a near-tie, top-2 logit gap < 1e-4, and the test says so). Tiny bundles for
each kind of draft (self-draft track, separate model, EAGLE head over features); the default
bundle with its chat template in the slow test."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import specrt
from checks import assert_same_greedy, target_margins


def _check(cold, prompt, got, n):
    want = [t for c in cold.stream_ids(prompt, max_new_tokens=n, draft="none", ignore_eos=True) for t in c]
    diff = assert_same_greedy(got, want, target_margins(cold, prompt, want) if got != want else None)
    assert diff is None, f"near-tie at token {diff}: the test cannot tell reuse from float noise there"


@pytest.mark.parametrize("name", ["int8", "good", "eagle", "none", "int8-kv16", "good-kv16"])
def test_multi_turn_and_shared_prefixes_on_tiny_models(tiny_bundles, name):
    folder = tiny_bundles[name]
    draft = "none" if name == "none" else "model"
    g = np.random.default_rng(0)
    with specrt.load(folder, max_batch=1, prefix_cache=False, adaptive=False) as cold, \
            specrt.load(folder, max_batch=2, adaptive=False) as warm:
        # a conversation: each turn resends the history and its answers
        prompt = [1] + [int(t) for t in g.integers(3, 120, size=70)]  # > one 64-token chunk
        for turn in range(3):
            st = specrt.runtime.Stats()
            got = [t for c in warm.stream_ids(prompt, max_new_tokens=16, draft=draft, k=3, ignore_eos=True,
                                              stats=st) for t in c]
            _check(cold, prompt, got, 16)
            assert (st.cached_tokens > 0) == (turn > 0)
            prompt = prompt + got + [int(t) for t in g.integers(3, 120, size=6)]
        # three requests sharing a 40-token system prompt at once on two slots, then a fourth
        # while they may still run (copies from a running slot or an idle one)
        system = [1] + [int(t) for t in g.integers(3, 120, size=39)]
        prompts = [system + [int(t) for t in g.integers(3, 120, size=5)] for _ in range(4)]
        got, stats = {}, [specrt.runtime.Stats() for _ in prompts]

        def client(i):
            got[i] = [t for c in warm.stream_ids(prompts[i], max_new_tokens=20, draft=draft, k=3, ignore_eos=True,
                                                 stats=stats[i]) for t in c]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i, p in enumerate(prompts):
            _check(cold, p, got[i], 20)
        assert sum(s.cached_tokens >= len(system) for s in stats) >= 2
        assert warm.counters()["prefix_cache_hits"] > 0


@pytest.mark.slow
def test_default_bundle_chat_turns_reuse_their_history(default_bundle):
    """The real pair and chat template: three turns over a system prompt; turns 2-3 find their
    history cached and answer exactly what a pipeline that never reuses answers."""
    system = ("You are a concise assistant for a hiking shop. Answer in at most three sentences and "
              "never invent prices or delivery dates.")
    turns = ["What should I pack for a one-day hike?", "And if it might rain?", "Thanks! Which boots fit best?"]
    with specrt.load(default_bundle, max_batch=1, prefix_cache=False, adaptive=False) as cold, \
            specrt.load(default_bundle, max_batch=2) as warm:
        msgs = [{"role": "system", "content": system}]
        for i, user in enumerate(turns):
            msgs.append({"role": "user", "content": user})
            ids = warm.tokenizer.encode_messages(msgs)
            st = specrt.runtime.Stats()
            got = [t for c in warm.stream_ids(ids, max_new_tokens=40, stats=st) for t in c]
            want = [t for c in cold.stream_ids(ids, max_new_tokens=40, draft="none") for t in c]
            diff = assert_same_greedy(got, want, target_margins(cold, ids, want) if got != want else None)
            assert diff is None, f"turn {i}: near-tie at token {diff}"
            assert (st.cached_tokens > len(ids) // 2) == (i > 0), (i, st.cached_tokens, len(ids))
            msgs.append({"role": "assistant", "content": warm.tokenizer.decode(got)})
