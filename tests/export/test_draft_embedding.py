"""An int4 / int8 graph from a GGUF gathers its embedding from the file's own blocks, as a gguf
target's does (emitter.embedding_form, quant_target.embedding_blocks; docs/design.md "Quantized
targets"): the coder's int4 draft, a tied one whose int4 head is cut to a vocabulary subset, an
RTN target and its self-draft, an fp32 target's self-draft. Each graph computes the same logits bit for bit as the one that
gathers the fp32 table (the export before this), and speculation over it equals target-only."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from tiny_gguf import write_tiny_gguf

import specrt
from specrt.export import export_bundle, quant_target
from specrt.export.steps import decoder, kernel_decoder, runs_kernels
from specrt.runtime.bundle.manifest import load_manifest

KW = dict(max_seq_len=256, max_draft_tokens=8, echo=None)
PAIR = dict(precision="gguf", accuracy_level=4, draft_precision="int4", **KW)
PROMPTS = [[1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9], [4, 8, 15, 16, 23, 42, 8, 15, 16], list(range(10, 50))]
# draft GGUF -> (its writer's arguments, the export's): the coder's 0.5B (untied, Q5_0 table), a
# tied one with per-block mins (Q4_K) whose int4 head, quantized from the table, is cut to 64 tokens
DRAFTS = {"untied": (dict(seed=1, embd="Q5_0"), {}), "tied": (dict(seed=2, tie=True, embd="Q4_K"), dict(draft_vocab=64))}


def _fp32_table(fn):
    """Run `fn` with the embedding gathered from the fp32 table (the export before this)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quant_target, "embedding_blocks", lambda m, opts: {})
        return fn()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    base = tmp_path_factory.mktemp("draft_embedding")
    target = str(write_tiny_gguf(base / "t.gguf"))
    out = {}
    for name, (gguf_kw, kw) in DRAFTS.items():
        draft = str(write_tiny_gguf(base / f"{name}.gguf", **gguf_kw))
        export_bundle(target, base / name, draft=draft, **PAIR, **kw)
        _fp32_table(lambda d=draft, n=name, k=kw: export_bundle(target, base / f"{n}-fp32", draft=d, **PAIR, **k))
        out[name] = base / name
        out[f"{name}-fp32"] = base / f"{name}-fp32"
    export_bundle(target, base / "once", draft=str(base / "untied.gguf"), portable=False, **PAIR)
    out["once"] = base / "once"
    rtn = dict(precision="int4", draft="self-int8", **KW)
    export_bundle(target, base / "rtn", **rtn)
    _fp32_table(lambda: export_bundle(target, base / "rtn-fp32", **rtn))
    out["rtn"], out["rtn-fp32"] = base / "rtn", base / "rtn-fp32"
    own = dict(precision="fp32", draft="self-int8", **KW)  # a streamed fp32 target's self-draft (the default pair's)
    export_bundle(target, base / "self", **own)
    _fp32_table(lambda: export_bundle(target, base / "self-fp32", **own))
    out["self"], out["self-fp32"] = base / "self", base / "self-fp32"
    return out


def _nodes(folder, entry, op):
    m = onnx.load(str(folder / entry.graph), load_external_data=False)
    return [n for n in m.graph.node if n.op_type == op]


@pytest.mark.parametrize("name", ["untied", "tied", "rtn", "self"])
def test_the_embedding_is_gathered_from_the_files_blocks(bundles, name):
    man, old = load_manifest(bundles[name]), load_manifest(bundles[f"{name}-fp32"])
    for e, o in ((man.draft, old.draft), (man.target, old.target)) if name == "rtn" else ((man.draft, old.draft),):
        assert len(_nodes(bundles[name], e, "GatherBlockQuantized")) == 1
        assert not [n for n in _nodes(bundles[name], e, "Gather") if n.input[0] == "embed_tokens"]  # the fp32 table's
        assert [n for n in _nodes(bundles[f"{name}-fp32"], o, "Gather") if n.input[0] == "embed_tokens"]
        assert not _nodes(bundles[f"{name}-fp32"], o, "GatherBlockQuantized")
        assert (bundles[name] / e.data).stat().st_size < (bundles[f"{name}-fp32"] / o.data).stat().st_size
        assert e.parity == o.parity  # the same numbers against the same reference
    if name == "rtn":
        assert "GatherBlockQuantized over the file's Q8_0 blocks" in man.target.quantization["embedding"]
        assert old.target.quantization["embedding"] == "fp32 Gather" and man.target.parity["passed"]
    if name == "tied":  # the head keeps its own form: int4 from the table, cut to the subset
        assert man.draft.vocab_subset["size"] == 64 and man.draft.vocab_subset["rows_equal"]
        heads = [n for n in _nodes(bundles[name], man.draft, "MatMulNBits") if n.output[0].startswith("lm_head")]
        assert heads and {a.i for n in heads for a in n.attribute if a.name in ("bits", "N")} == {4, 64}


@pytest.mark.parametrize("name", ["untied", "tied", "rtn", "self"])
def test_its_logits_are_the_fp32_tables_bit_for_bit(bundles, name):
    """The same logits as the graph over the dequantized table: the gathered rows are those
    values, and the LM head (tied: quantized from the table) kept its source."""
    man, old = load_manifest(bundles[name]), load_manifest(bundles[f"{name}-fp32"])
    for e, o in ((man.draft, old.draft), (man.target, old.target)):
        makers = [decoder] + ([kernel_decoder] if runs_kernels(e) else [])
        for make in makers:
            for prompt in PROMPTS:
                got, want = make(bundles[name], e).prefill(prompt), make(bundles[f"{name}-fp32"], o).prefill(prompt)
                assert np.array_equal(got, want), (name, e.graph, make.__name__)


@pytest.mark.parametrize("name", ["untied", "tied", "once", "rtn", "self"])
def test_speculative_equals_target_only(bundles, name):
    with specrt.load(bundles[name], max_batch=2) as pipe:
        for prompt in PROMPTS:
            want = [t for c in pipe.stream_ids(prompt, max_new_tokens=24, draft="none", ignore_eos=True) for t in c]
            got = [t for c in pipe.stream_ids(prompt, max_new_tokens=24, draft="model", k=4, ignore_eos=True) for t in c]
            assert got == want, (name, prompt)
