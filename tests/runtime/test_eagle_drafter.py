"""The EAGLE drafter's cache bookkeeping: after any sequence of rounds its proposals equal a
from-scratch computation over the target's real features (no stale or misaligned rows)."""

import numpy as np
import pytest

import specrt
from specrt.runtime.backends.ort import OrtBackend
from specrt.runtime.decoder import Decoder
from specrt.runtime.drafters import AutoDrafter, EagleDrafter
from specrt.runtime.manifest import load_manifest
from specrt.runtime.sampling import SamplingConfig
from specrt.runtime.speculate import Speculator, Stats

GREEDY = SamplingConfig(0.0)


@pytest.fixture(scope="module")
def eagle(tiny_bundles):
    folder = tiny_bundles["eagle"]
    man = load_manifest(folder)
    fresh = (Decoder(OrtBackend(folder / man.target.graph, man.target), "t", keep_hidden=True),
             Decoder(OrtBackend(folder / man.draft.graph, man.draft), "d"))
    return specrt.load(folder), fresh


def scratch_proposal(fresh, seq, k):
    """Greedy draft of k tokens after `seq`, every cache built from nothing."""
    target, draft = fresh
    target.reset()
    target.prefill(seq[:-1])  # features of positions 0 .. n-2
    feats = target.features[: len(seq) - 1].copy()
    draft.reset()
    for s in range(0, len(seq) - 1, draft.max_t):
        e = min(s + draft.max_t, len(seq) - 1)
        logits = draft.forward(seq[s + 1 : e + 1], feats[s:e])
    out = []
    for _ in range(k):
        out.append(int(logits[-1].argmax()))
        logits = draft.forward([out[-1]], draft.hidden[-1:].copy())
    return out


def check_now(model_drafter, fresh, seq, k, rng):
    got, _ = model_drafter.propose(seq, k, GREEDY, rng)
    assert list(got) == scratch_proposal(fresh, seq, k), len(seq)
    model_drafter.commit(len(seq))  # as if nothing was accepted


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("prompt_len", [1, 23])  # 23 > max_t: the prompt's pairs go in chunks
def test_proposals_equal_scratch_after_rounds(eagle, k, prompt_len):
    pipe, fresh = eagle
    drafter = pipe.drafter("model")
    assert isinstance(drafter, EagleDrafter)
    spec, plain = Speculator(pipe.target, drafter), Speculator(pipe.target, None)
    rng = np.random.default_rng(0)
    prompt = [1] + list(np.random.default_rng(k).integers(3, 128, size=prompt_len - 1))
    seq = prompt + [spec.prefill(prompt, GREEDY, rng)]
    assert pipe.draft_decoder.length == len(prompt) - 1  # prompt pairs built at prefill
    for r in range(6):
        seq += spec.round(seq, k, GREEDY, rng, Stats())
        assert pipe.draft_decoder.length <= len(seq) - 2  # only rows built from real features survive
        check_now(drafter, fresh, seq, k, rng)
        if r % 2:  # target-only steps the drafter does not see: it must catch up several pairs
            for _ in range(3 + r):
                seq += plain.round(seq, 0, GREEDY, rng, Stats())
            check_now(drafter, fresh, seq, k, rng)
    assert pipe.target.length == len(seq) - 1


def test_auto_catches_up_after_ngram_rounds(eagle):
    pipe, fresh = eagle
    auto = pipe.drafter("auto")
    assert isinstance(auto, AutoDrafter) and isinstance(auto.model, EagleDrafter)
    spec = Speculator(pipe.target, auto)
    rng, st = np.random.default_rng(0), Stats()
    prompt = [1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9]
    seq = prompt + [spec.prefill(prompt, GREEDY, rng)]
    for _ in range(12):
        seq += spec.round(seq, 4, GREEDY, rng, st)
        check_now(auto.model, fresh, seq, 4, rng)
    assert set(st.drafter_rounds) == {"ngram", "model"}, st.drafter_rounds


def test_needs_features_from_the_target(eagle, tiny_bundles):
    pipe, _ = eagle
    folder = tiny_bundles["int4"]
    man = load_manifest(folder)
    plain = Decoder(OrtBackend(folder / man.draft.graph, man.draft))
    with pytest.raises(ValueError, match="EAGLE"):
        EagleDrafter(plain, pipe.target)
    with pytest.raises(ValueError, match="hidden-state output"):
        Decoder(OrtBackend(folder / man.target.graph, man.target), keep_hidden=True)
    with pytest.raises(ValueError, match="hidden must be"):
        pipe.draft_decoder.forward([5, 6], np.zeros((1, pipe.draft_decoder.backend.hidden_size), np.float32))
