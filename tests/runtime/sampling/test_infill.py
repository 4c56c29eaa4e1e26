"""llama.cpp's infill sampler (runtime/sampling/infill.py): hand-computed rows for each of its
branches, and the fast prefix search against a line-by-line transcription of llama.cpp's loops
on random rows. Speculation with it on is checked over HTTP (tests/runtime/serve/test_serve_infill.py)."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime.sampling.draws import SamplingConfig, probs
from specrt.runtime.sampling.infill import InfillSampler

EOS = 2
PIECES = (b"", b"", b"", b"w1", b"w10", b"w2", b"w3", b"w4", b"w5", b"w6", b"w7", b"")  # 2: EOS, no text


def _row(**p) -> np.ndarray:
    row = np.zeros(len(PIECES))
    for name, v in p.items():
        row[EOS if name == "eos" else PIECES.index(name.encode())] = v
    return row


SAMPLER = InfillSampler(PIECES, frozenset({EOS}), EOS)


def test_a_likely_end_keeps_only_the_end_tokens():
    out = SAMPLER(_row(eos=0.3, w1=0.7), truncated=True)  # 3 * 0.3 * 2 candidates > 0.7
    np.testing.assert_allclose(out, _row(eos=1.0))


def test_the_candidate_count_is_llama_cpps():
    row = _row(eos=0.06, w1=0.94)
    np.testing.assert_allclose(SAMPLER(row, truncated=True), row)  # n = 2: 0.36 < 0.94, both stay
    # untruncated, llama.cpp holds the whole vocabulary: n = 12, 3 * 0.06 * 12 > 0.94
    np.testing.assert_allclose(SAMPLER(row, truncated=False), _row(eos=1.0))


def test_a_prefix_is_merged_into_the_likelier_token_which_stays_at_its_own_probability():
    # w1 absorbs w10 (0.65); w2 (0.22) passes 0.2 but not 1/3 of the renormalized rest; w3 goes at 0.2
    out = SAMPLER(_row(w1=0.35, w10=0.30, w2=0.22, w3=0.08, eos=0.05), truncated=True)
    np.testing.assert_allclose(out, _row(w1=0.35 / 0.40, eos=0.05 / 0.40))
    out = SAMPLER(_row(w1=0.30, w10=0.35, w2=0.22, w3=0.08, eos=0.05), truncated=True)  # the longer one is likelier
    np.testing.assert_allclose(out, _row(w10=0.35 / 0.40, eos=0.05 / 0.40))


def test_no_text_left_is_the_end_token_alone():
    row = _row(w2=0.165, w3=0.165, w4=0.165, w5=0.165, w6=0.165, w7=0.165, eos=0.01)  # each text under 0.2
    np.testing.assert_allclose(SAMPLER(row, truncated=True), _row(eos=1.0))


def test_probs_applies_it_after_top_k_and_top_p():
    logits = np.log(_row(w1=0.5, w10=0.2, w2=0.2, w3=0.05, eos=0.05) + 1e-30)
    cfg = SamplingConfig(1.0, top_k=3, infill=SAMPLER)  # top-3 drops w3 and the end token
    # w1 absorbs w10; w2 (0.2 / 0.9) stays past 0.2 but not past 1/3 of w1 + w2
    np.testing.assert_allclose(probs(logits, cfg), _row(w1=1.0), atol=1e-12)
    np.testing.assert_allclose(probs(logits[None], cfg)[0], _row(w1=1.0), atol=1e-12)  # rows alike


def _literal(row: np.ndarray, pieces, eog: set, eot: int, truncated: bool) -> np.ndarray:
    """llama.cpp's llama_sampler_infill_apply, loop for loop, then its `dist` step (the
    survivors' own probabilities renormalized)."""
    cand = [int(t) for t in np.flatnonzero(row > 0)]
    cand.sort(key=lambda t: (-row[t], t))
    ids, p = list(cand), [float(row[t]) for t in cand]
    alive = [True] * len(ids)
    n = len(ids) if truncated else len(row)
    p_eog = sum(pi for t, pi in zip(ids, p, strict=True) if t in eog)
    out = np.zeros_like(row)
    if 3 * p_eog * n > sum(p) - p_eog:
        keep = [i for i, t in enumerate(ids) if t in eog]
    else:
        for i0 in range(len(ids)):
            for i1 in range(len(ids)):
                if not alive[i0]:
                    break
                if i0 == i1 or not alive[i1]:
                    continue
                a, b = pieces[ids[i0]], pieces[ids[i1]]
                if len(a) > 0 and len(a) <= len(b) and b[: len(a)] == a:
                    dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                    p[dst] += p[src]
                    p[src], alive[src] = 0.0, False
        keep = [i for i, t in enumerate(ids) if t in eog or p[i] >= 0.2]
        texts = sum(1 for i in keep if ids[i] not in eog)
        if texts == 0:
            out[eot] = 1.0
            return out
        s = sum(p[i] for i in keep)
        keep = [i for i in keep if ids[i] in eog or p[i] / s >= 1.0 / (texts + 1)]
    for i in keep:
        out[ids[i]] = row[ids[i]]
    return out / out.sum()


@pytest.mark.parametrize("seed", range(4))
def test_equals_llama_cpps_loops_on_random_rows(seed):
    rng = np.random.default_rng(seed)
    V = 40
    alphabet = [bytes(w) for w in ([97], [98], [97, 98], [97, 97], [98, 97], [97, 98, 97], [97, 98, 98])]
    pieces = tuple(b"" if t < 3 else alphabet[rng.integers(len(alphabet))] + bytes([99 + t % 3] * (t % 2))
                   for t in range(V))
    eog = {1, 2}
    sampler = InfillSampler(pieces, frozenset(eog), 2)
    branches = set()
    for _ in range(200):
        row = np.zeros(V)
        cand = rng.choice(V, size=rng.integers(2, 16), replace=False)
        row[cand] = rng.dirichlet(np.full(len(cand), rng.choice([0.2, 1.0, 5.0])))
        truncated = bool(rng.integers(2))
        want = _literal(row, pieces, eog, 2, truncated)
        np.testing.assert_allclose(sampler(row, truncated), want, atol=1e-12)
        branches.add("end" if want[2] == 1.0 else "text")
    assert branches == {"end", "text"}  # both outcomes were exercised
