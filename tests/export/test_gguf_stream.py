"""A GGUF exported tensor by tensor (export/gguf_stream.py): no whole fp32 model is ever made,
the weights and the layer-by-layer reference are transformers' own values, the teacher-forced
check gives the step-by-step check's numbers, and the bundle's graphs are the ones the whole-
model path writes, byte for byte."""

import dataclasses

import numpy as np
import onnx
import pytest
import torch
from tiny_gguf import write_tiny_gguf

from specrt.export import export_bundle, gguf_stream
from specrt.export.gguf_stream import GGUFWeights, streamed_logits
from specrt.export.graph import build_graph
from specrt.export.quant_target import prepare
from specrt.export.steps import LoadedModel, Settings, decoder, write_model
from specrt.export.validate import (
    LazyReference,
    Reference,
    check_decoder,
    compare,
    observe,
    observe_forced,
)
from specrt.runtime.bundle.manifest import load_manifest

KW = dict(max_seq_len=256, max_draft_tokens=8, echo=None)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def gguf(request, tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tie=request.param)


@pytest.fixture(scope="module")
def both(gguf):
    """The same file loaded whole (transformers' fp32 model) and streamed."""
    return LoadedModel(str(gguf), 256), LoadedModel(str(gguf), 256, stream=True)


def test_streamed_model_holds_no_weights(both):
    _, s = both
    assert s.streamed and isinstance(s.weights, GGUFWeights)
    assert all(p.device.type == "meta" for p in s.model.parameters())


@pytest.mark.parametrize("slab", [8192, 7])  # 7: dequantized in ragged slabs of rows
def test_streamed_weights_are_transformers_values(both, slab, monkeypatch):
    monkeypatch.setattr(gguf_stream, "SLAB_ROWS", slab)
    whole, s = both
    sd = whole.model.state_dict()
    assert set(s.weights) <= set(sd) and len(s.weights) >= len(sd) - 1  # tied: no lm_head tensor
    for name in s.weights:
        assert s.weights.shape(name) == tuple(sd[name].shape)
        assert np.array_equal(s.weights[name], sd[name].numpy()), name


def test_layer_by_layer_logits_are_the_whole_models(both):
    whole, s = both
    seqs = [np.array([5, 6, 7, 8, 9, 10, 11]), np.array([3, 4, 5])]
    got = streamed_logits(s.model, s.weights, seqs)
    with torch.no_grad():
        for seq, g in zip(seqs, got, strict=True):
            want = whole.model(torch.from_numpy(seq[None])).logits[0].numpy()
            assert g.shape == want.shape and np.abs(g - want).max() < 1e-4
    assert all(p.device.type == "meta" for p in s.model.parameters())  # dropped again after the call


def _graph_and_entry(tmp_path, m, cfg):
    opts = cfg.target_graph(False)
    qw, _ = prepare(m, opts, None)
    return write_model(tmp_path, "target", m.arch, m.weights, opts, cfg.max_t, {}, "export", qw)


@pytest.mark.parametrize("precision", ["gguf", "int4", "int8"])  # int4 / int8: an RTN head from row slabs
def test_streamed_graph_is_byte_for_byte_the_whole_models(both, tmp_path, precision, monkeypatch):
    from specrt.export import quantize

    monkeypatch.setattr(quantize, "RTN_SLAB_ROWS", 50)  # ragged slabs of the 128-row head
    whole, s = both
    cfg = Settings(256, 8, precision, "ort", 8, 4)
    a = _graph_and_entry(tmp_path / "whole", whole, cfg)
    b = _graph_and_entry(tmp_path / "streamed", s, cfg)
    assert (tmp_path / "whole" / a.data).read_bytes() == (tmp_path / "streamed" / b.data).read_bytes()
    ga = onnx.load(str(tmp_path / "whole" / a.graph), load_external_data=False)
    gb = onnx.load(str(tmp_path / "streamed" / b.graph), load_external_data=False)
    assert ga.SerializeToString() == gb.SerializeToString()


@pytest.mark.parametrize("precision", ["gguf", "fp32"])
def test_teacher_forced_check_gives_the_stepwise_numbers(both, tmp_path, precision):
    whole, s = both
    cfg = Settings(256, 8, precision, "ort", 12, 0)
    entry = _graph_and_entry(tmp_path, whole, cfg)
    dec = decoder(tmp_path, entry)
    step = check_decoder(dec, Reference.of(whole.model, whole.arch.vocab, k=8, steps=12), k=8, steps=12)
    lazy = check_decoder(dec, s.reference(cfg), k=8, steps=12)
    assert step.passed and lazy.passed and step.greedy_match == lazy.greedy_match == 12
    assert abs(step.prefill_max_abs - lazy.prefill_max_abs) < 1e-5
    assert abs(step.continuation_max_abs - lazy.continuation_max_abs) < 1e-5


def test_teacher_forced_check_fails_a_graph_of_other_weights(both, tmp_path):
    """The mutant: another file's reference (other random blocks) must not pass."""
    whole, _ = both
    other = LoadedModel(str(write_tiny_gguf(tmp_path / "other.gguf", seed=1)), 256, stream=True)
    cfg = Settings(256, 8, "gguf", "ort", 12, 0)
    dec = decoder(tmp_path, _graph_and_entry(tmp_path, whole, cfg))
    par = check_decoder(dec, other.reference(cfg), k=8, steps=12)
    assert not par.passed and par.prefill_max_abs > 1e-2


def test_forced_steps_give_the_stepwise_numbers_and_hold_every_row(both, tmp_path):
    """`observe_forced` (the level-0 twin's check, teacher-forced on the kernel graph's tokens):
    on its own greedy tokens it gives `observe`'s numbers; on any other sequence every row is
    still held to the tolerance; rows off by more than it fail, with prefill and continuation
    within it; another file's reference fails."""
    whole, s = both
    cfg = Settings(256, 8, "gguf", "ort", 12, 0)
    dec = decoder(tmp_path, _graph_and_entry(tmp_path, whole, cfg))
    ref = s.reference(cfg)
    own = observe(dec, ref)
    stepped = compare(own, ref, "fp32")
    forced = observe_forced(dec, ref, own.tokens)
    par = compare(forced, ref, "fp32")
    assert par.passed and par.greedy_match == stepped.greedy_match == 12 and par.forced_max_abs < 1e-3
    assert (par.prefill_max_abs, par.continuation_max_abs) == (stepped.prefill_max_abs, stepped.continuation_max_abs)
    other_tokens = np.random.default_rng(3).integers(3, 120, 12)
    par = compare(observe_forced(dec, ref, other_tokens), ref, "fp32")
    assert par.passed and par.forced_max_abs < 1e-3
    off = dataclasses.replace(forced, forced=forced.forced + 2e-3 * (np.arange(forced.forced.shape[-1]) % 2))
    par = compare(off, ref, "fp32")
    assert not par.passed and par.prefill_max_abs < 1e-3 and par.forced_max_abs > 1e-3 and par.forced_rows_over == 12

    def spiked(rows: dict[int, float]):  # the forced rows with rows[i] added to row i's odd logits
        bump = np.zeros(forced.forced.shape[0])
        bump[list(rows)] = list(rows.values())
        return compare(dataclasses.replace(forced, forced=forced.forced + bump[:, None] * (np.arange(forced.forced.shape[-1]) % 2)),
                       ref, "fp32")

    # one ill-conditioned row (validate.forced_rows_hold): up to 30 tolerances, one row in 8
    par = spiked({7: 1e-2})
    assert par.passed and par.forced_rows_over == 1 and 1e-2 <= par.forced_max_abs < 1.1e-2
    assert not spiked({7: 4e-2}).passed  # past 30 tolerances
    assert not spiked({3: 2e-3, 7: 2e-3}).passed  # two of 12 rows past the tolerance
    other = LoadedModel(str(write_tiny_gguf(tmp_path / "other.gguf", seed=1)), 256, stream=True).reference(cfg)
    assert not compare(observe_forced(dec, other, own.tokens), other, "fp32").passed


def test_lazy_reference_runs_each_sequence_once():
    calls = []

    def fn(seqs):
        calls.append(len(seqs))
        return [np.full((len(s), 4), float(len(s))) for s in seqs]

    ref = LazyReference(fn, 50, k=2, steps=3, prefix=4)
    a = ref.logits([ref.ids, np.arange(5)])
    b = ref.logits([np.arange(5), ref.ids, np.arange(6)])
    assert calls == [2, 1] and a[0] is b[1] and a[1] is b[0]


def test_export_never_loads_the_whole_model(gguf, tmp_path, monkeypatch):
    """With transformers' whole-model loader broken, a gguf target with a GGUF draft still
    exports, and its numbers are those of the whole-model path."""
    import transformers

    def refuse(*a, **k):
        raise AssertionError("the whole fp32 model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(gguf_stream, "BIG_FIELD", 16)  # the vocabulary dropped from the readers once read
    man = export_bundle(str(gguf), tmp_path / "b", draft=str(gguf), precision="gguf", accuracy_level=4,
                        draft_precision="int4", **KW)
    assert man.target.parity["tokenizer_vs_gguf"]["special_tokens_checked"] > 0
    assert man.target.parity["passed"] and man.target.parity["greedy_match"] == man.target.parity["greedy_steps"]
    assert man.draft.parity["passed"] and man.draft.parity["greedy_agreement_with_target"] > 0
    assert load_manifest(tmp_path / "b").target.packed.kernels


@pytest.mark.parametrize("precision,level", [("fp32", 4), ("gguf", 0)])
def test_other_streamed_targets_export_without_the_whole_model(gguf, tmp_path, monkeypatch, precision, level):
    import transformers

    def refuse(*a, **k):
        raise AssertionError("the whole fp32 model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    man = export_bundle(str(gguf), tmp_path / "b", draft="none", precision=precision, accuracy_level=level, **KW)
    par = man.target.parity
    assert par["passed"] and par["tolerance"] == 1e-3 and par["greedy_match"] == par["greedy_steps"]


def test_build_graph_reads_each_weight_once_when_streamed(both):
    """Graph building needs shapes, not values, for everything but what it writes: no tensor is
    dequantized more often than the graph's use of it (the embedding twice: table and head)."""
    _, s = both
    counts: dict[str, int] = {}
    weights = s.weights
    orig = type(weights).__getitem__

    class Counting(type(weights)):
        def __getitem__(self, name):
            counts[name] = counts.get(name, 0) + 1
            return orig(self, name)

    w = Counting.__new__(Counting)
    w.__dict__.update(weights.__dict__)
    cfg = Settings(256, 8, "fp32", "ort", 8, 4)
    build_graph(s.arch, w, cfg.target_graph(False))
    assert counts and max(counts.values()) <= 2
    assert all(n == 1 for k, n in counts.items() if k != "model.embed_tokens.weight"), {k: n for k, n in counts.items() if n > 1}


def test_level0_twin_in_row_ranges_computes_the_same_logits(gguf, tmp_path, monkeypatch):
    """The twin's large 8-bit projections run as row ranges over the same weights file (views, no
    copy): the same logits as the twin in one piece."""
    from specrt.export import quant_target

    cfg = Settings(256, 8, "gguf", "ort", 8, 4)
    m = LoadedModel(str(gguf), 256, stream=True)
    entry = _graph_and_entry(tmp_path, m, cfg)
    ids = np.array([5, 9, 14, 20, 33, 40, 41, 7])
    outs = []
    for chunk in (1 << 40, 16 * 256 * 4):  # one piece; 16 rows of K = 256 a piece
        monkeypatch.setattr(quant_target, "TWIN_CHUNK_BYTES", chunk)
        twin = quant_target.level0_twin(tmp_path, entry)
        g = onnx.load(str(tmp_path / twin.graph), load_external_data=False)
        outs.append((sum(n.op_type == "MatMulNBits" for n in g.graph.node), decoder(tmp_path, twin).prefill(ids).copy()))
    (n_whole, whole), (n_split, split) = outs
    assert n_split > n_whole  # something was split (the 8-bit projections and the Q6_K head)
    assert np.abs(split - whole).max() <= 1e-5


def test_rows_are_the_whole_tensors_rows(both):
    """`GGUFWeights.rows`: the rows of the token table and the LM head from their own blocks,
    bit for bit the whole tensor's; a tensor whose rows the processor reorders (llama's q) is
    read whole and indexed."""
    _, s = both
    idx = np.array([3, 0, 77, 3, 127])
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"):
        if name not in s.weights:
            continue
        whole = s.weights[name]
        assert np.array_equal(s.weights.rows(name, idx), whole[idx]), name
        assert np.array_equal(s.weights.rows(name, slice(5, 70)), whole[5:70]), name
    assert s.weights._rows_as_stored("model.embed_tokens.weight")
    assert not s.weights._rows_as_stored("model.layers.0.self_attn.q_proj.weight")


def test_the_reference_never_holds_a_whole_table(both, monkeypatch):
    """The layer-by-layer reference reads the embedding's and the LM head's rows, never the
    whole fp32 table; its logits are the whole model's to fp32 rounding."""
    whole, s = both
    read = []
    orig = GGUFWeights.__getitem__
    monkeypatch.setattr(GGUFWeights, "__getitem__", lambda self, name: read.append(name) or orig(self, name))
    monkeypatch.setattr(gguf_stream, "HEAD_SLAB_ROWS", 50)  # ragged slabs of the 128-row head
    seqs = [np.array([5, 6, 7, 8, 9, 10, 11]), np.array([3, 4, 5])]
    got = streamed_logits(s.model, s.weights, seqs)
    assert read and "model.embed_tokens.weight" not in read and "lm_head.weight" not in read
    with torch.no_grad():
        for seq, g in zip(seqs, got, strict=True):
            want = whole.model(torch.from_numpy(seq[None])).logits[0].numpy()
            # fp32 rounding, relative to the logits: the slabs and torch's GEMM sum in other
            # orders, and torch's order is the CPU's (4e-5 on logits of ~1.6 on a Sapphire Rapids
            # host, under 1e-5 on Zen 4); a wrong row or slab errs by the logits' own size
            assert np.abs(g - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("deq_rows", [128, 3])  # 3: ragged groups
def test_dequantize_rows_is_gguf_pys_dequantize(gguf, deq_rows, monkeypatch):
    """`dequantize_rows` (gguf-py's per-type code on groups of rows) gives `gguf.dequantize`'s
    values bit for bit, for every block type and float tensor of the file."""
    from gguf import dequantize

    monkeypatch.setattr(gguf_stream, "DEQ_ROWS", deq_rows)
    reader = gguf_stream.gguf_reader(gguf)
    for t in reader.tensors:
        raw = np.asarray(t.data)
        if raw.ndim != 2:
            continue
        want = np.asarray(dequantize(raw, t.tensor_type), dtype=np.float32).reshape(raw.shape[0], -1)
        got = gguf_stream.dequantize_rows(raw, t.tensor_type, np.empty_like(want))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
