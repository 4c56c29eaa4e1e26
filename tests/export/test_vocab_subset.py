"""A separate draft's LM head cut to a frequency-ranked subset of the vocabulary
(`draft_vocab`, export/vocab_subset.py): the kept rows' logits are the full head's bit for bit,
-inf elsewhere, in the bundle graph and its packed graphs; speculation with it stays exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import specrt
from specrt.export import export_bundle
from specrt.export.config import export_plan
from specrt.export.steps import decoder
from specrt.export.vocab_subset import SubsetError
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.engine import Stats
from tiny import VOCAB

KW = dict(max_seq_len=128, max_draft_tokens=8, greedy_steps=8, echo=None)
SIZE = 40
PROMPTS = [[1, 5, 9, 33, 7], [1, 100, 4, 4, 4, 90, 12, 60]]


@pytest.fixture(scope="module")
def bundles(tiny_dirs, tmp_path_factory):
    """The tiny target drafted by itself as a separate model, fp32 (a MatMul head) and int4
    (MatMulNBits), each with the full head and with a SIZE-token subset."""
    base = tmp_path_factory.mktemp("vsub")
    t = str(tiny_dirs["target"])
    out = {}
    for precision in ("fp32", "int4"):
        dp = None if precision == "fp32" else precision
        for size in (0, SIZE):
            out[precision, size] = base / f"{precision}-{size}"
            export_bundle(t, out[precision, size], draft=t, draft_precision=dp, draft_vocab=size, **KW)
    return out


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_kept_rows_are_the_full_heads_and_the_rest_is_minus_inf(bundles, precision):
    full, cut = (load_manifest(bundles[precision, s]) for s in (0, SIZE))
    assert full.draft.vocab_subset == {}
    info = cut.draft.vocab_subset
    assert info["size"] == SIZE and info["rows_equal"] is True and len(info["ids_sha256"]) == 64
    assert "standard library" in info["corpus"]
    graph = onnx.load(str(bundles[precision, SIZE] / cut.draft.graph), load_external_data=False)
    assert "ScatterElements" in {n.op_type for n in graph.graph.node}
    known = {t.name for t in graph.graph.initializer} | {i.name for i in graph.graph.input} | {""}
    for n in graph.graph.node:  # topological order (onnx's checker does not know the contrib ops)
        assert set(n.input) <= known, n.name
        known |= set(n.output)
    a, b = (decoder(bundles[precision, s], m.draft) for s, m in ((0, full), (SIZE, cut)))
    for prompt in PROMPTS:
        rf, rc = a.prefill(np.array(prompt)), b.prefill(np.array(prompt))
        kept = np.isfinite(rc)
        assert kept.sum() == SIZE and kept[:3].all()  # <unk> <s> </s>: the added tokens are always kept
        np.testing.assert_array_equal(rc[kept], rf[kept])
        a.reset(), b.reset()


def test_the_packed_draft_graphs_carry_the_subset(bundles):
    folder = bundles["int4", SIZE]
    man = load_manifest(folder)
    assert man.draft.packed.lanes
    for lanes in man.draft.packed.lanes:
        g = onnx.load(str(folder / man.draft.packed.graph.format(lanes=lanes)), load_external_data=False)
        assert "ScatterElements" in {n.op_type for n in g.graph.node}


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_greedy_speculation_with_the_subset_equals_target_only(bundles, precision):
    with specrt.load(bundles[precision, SIZE], draft="model", adaptive=False) as pipe:
        rejected = 0
        for prompt in PROMPTS:
            want = [t for c in pipe.stream_ids(prompt, max_new_tokens=30, draft="none", k=0, ignore_eos=True) for t in c]
            st = Stats()
            got = [t for c in pipe.stream_ids(prompt, max_new_tokens=30, k=3, draft="model", stats=st,
                                              ignore_eos=True) for t in c]
            assert got == want, prompt
            assert st.draft_tokens > 0
            rejected += st.draft_tokens - st.accepted_tokens
        # the draft is the target's own weights: what it loses is the target's tokens outside the subset
        assert rejected > 0


def test_refusals(tiny_dirs, tmp_path):
    t = str(tiny_dirs["target"])
    with pytest.raises(ValueError, match="separate draft model"):
        export_bundle(t, tmp_path / "a", draft="self-int8", draft_vocab=SIZE, **KW)
    with pytest.raises(SubsetError, match="between 1 and the vocabulary"):
        export_bundle(t, tmp_path / "b", draft=t, draft_vocab=VOCAB, **KW)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_config_names_the_subset_and_a_flag_wins(tmp_path):
    cfg = tmp_path / "pair.toml"
    cfg.write_text('name = "p"\n[target]\nsource = "t"\n[draft]\nsource = "d"\nvocab_subset = 4096\n')
    assert export_plan({}, str(cfg))[2]["draft_vocab"] == 4096
    assert export_plan({"draft_vocab": 0}, str(cfg))[2]["draft_vocab"] == 0
    assert export_plan({"draft": "self-int8"}, str(cfg))[2]["draft_vocab"] == 0  # the config's draft only
    cfg.write_text('[target]\nsource = "t"\n[draft]\nvocab_subset = "big"\n')
    with pytest.raises(ValueError, match="vocab_subset"):
        export_plan({}, str(cfg))
