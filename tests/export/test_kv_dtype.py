"""An fp16 KV cache (`kv_dtype = "fp16"`, issue 38): every graph of the bundle reads and writes
float16 K/V, the manifest says so, and the runtime's pools, sizing and bindings follow it.

Exactness is relative to the same bundle; tests/runtime/engine/test_speculate.py (greedy
speculative = target-only), test_prefix_real.py (reused rows) and tests/export/test_packed.py
(row invariance) run the fp16-KV tiny bundles ("int8-kv16", "good-kv16", "fp32-kv16") too."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

import specrt
from specrt.export import export_bundle
from specrt.export.config import export_plan
from specrt.runtime.bundle.manifest import load_manifest

F16 = onnx.TensorProto.FLOAT16


def _kv_input_types(path) -> set[int]:
    m = onnx.load(str(path), load_external_data=False)
    return {i.type.tensor_type.elem_type for i in m.graph.input if i.name.startswith("past_key_values")}


@pytest.mark.parametrize("name", ["int8-kv16", "good-kv16", "eagle-kv16"])
def test_every_graph_and_the_manifest_say_float16(tiny_bundles, name):
    folder = tiny_bundles[name]
    man = load_manifest(folder)
    assert man.target.kv.dtype == man.draft.kv.dtype == "float16"
    assert man.target.precision == "fp32"  # activations stay fp32: only K/V are float16
    for e in (man.target, man.draft):
        assert _kv_input_types(folder / e.graph) == {F16}
    for lanes in man.target.packed.lanes:
        assert _kv_input_types(folder / man.target.packed.file(lanes)) == {F16}
    assert man.target.packed.lanes == ([] if man.draft.recipe == "eagle" else [1, 2, 4, 8, 16])
    # parity with transformers is held to fp16's tolerance (K/V, GQA's q and output are rounded)
    assert man.target.parity["passed"] and man.target.parity["tolerance"] == 0.05
    assert man.target.parity["greedy_match"] == man.target.parity["greedy_steps"]
    if man.draft.recipe == "eagle":  # its check: the target's features within fp16's tolerance
        assert man.draft.parity["passed"] and man.draft.parity["target_features_max_abs"] <= 0.05


def test_the_default_stays_the_activations_dtype(tiny_bundles):
    man = load_manifest(tiny_bundles["int8"])
    assert man.target.kv.dtype == man.draft.kv.dtype == "float32"
    assert man.target.parity["tolerance"] == 0.001
    assert _kv_input_types(tiny_bundles["int8"] / man.target.graph) == {onnx.TensorProto.FLOAT}


@pytest.mark.parametrize("name,shared", [("int8-kv16", True), ("good-kv16", False)])
def test_pools_are_float16_at_half_the_bytes(tiny_bundles, name, shared):
    """The self-draft stays a track on the target's pool (same layout, float16 included); a
    separate draft gets a float16 pool of its own. Bytes per slot, the load's sizing and the
    packed target's bindings all follow the layout's dtype."""
    fp32 = "int8" if shared else "good"
    with specrt.load(tiny_bundles[name], max_batch=2, adaptive=False) as half, \
            specrt.load(tiny_bundles[fp32], max_batch=2, adaptive=False) as full:
        parts = half.parts
        assert parts.shared_kv is shared and len({id(p) for p in parts.pools}) == 2 - shared
        assert all(p.dtype == np.float16 and all(h.dtype == np.float16 for h in p.host) for p in parts.pools)
        assert type(parts.target).__name__ == "PackedModel"
        assert all(s.dtype == np.float16 for s in parts.target._scratch)  # unused lanes' buffers
        assert half.kv_bytes_per_slot * 2 == full.kv_bytes_per_slot
        assert parts.sizing.kv_bytes * 2 == full.parts.sizing.kv_bytes
        assert half.counters()["kv_bytes"] * 2 == full.counters()["kv_bytes"]
        # a greedy run writes float16 rows the target then reads back
        out = half.generate("w5 w6 w7", max_new_tokens=12, chat=False, k=3)
        assert out.stats.new_tokens == 12
        assert np.abs(parts.target.pool.host[0][0, :, :8].astype(np.float32)).sum() > 0


def test_copy_rows_of_a_float16_pool(tiny_bundles):
    from specrt.runtime.backends.kvpool import KVPool

    kv = load_manifest(tiny_bundles["int8-kv16"]).target.kv
    pool = KVPool(kv, 3, "cpu", max_seq_len=64)
    rng = np.random.default_rng(0)
    for h in pool.host:
        h[...] = rng.standard_normal(h.shape).astype(np.float16)
    pool.copy_rows(0, 2, 40)
    for h in pool.host:
        assert np.array_equal(h[2, :, :40], h[0, :, :40]) and not np.array_equal(h[2, :, 40:], h[0, :, 40:])


def test_generate_on_the_command_line(tiny_bundles):
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", "--engines", str(tiny_bundles["int8-kv16"]),
                        "--json", "--max-new-tokens", "8", "--raw", "w5 w6 w7"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    with specrt.load(tiny_bundles["int8-kv16"], max_batch=1) as pipe:
        want = pipe.generate("w5 w6 w7", max_new_tokens=8, chat=False, draft="none", k=0)
    assert out["token_ids"] == want.token_ids and out["stats"]["draft_tokens"] > 0


@pytest.mark.parametrize("kw,words", [
    (dict(kv_dtype="int8"), r"kv_dtype must be one of \('auto', 'fp16'\), got 'int8'"),
    (dict(kv_dtype="float16"), "kv_dtype must be one of"),
    (dict(kv_dtype="fp16", lowering="standard", draft="none"), "kv_dtype fp16 under fp32 activations exists only in the 'ort' lowering"),
])
def test_a_kv_dtype_it_cannot_take_is_refused_before_loading(tmp_path, kw, words):
    # the target does not exist: the settings are refused before any source is read
    with pytest.raises(ValueError, match=words):
        export_bundle(str(tmp_path / "no-such-model"), tmp_path / "b", echo=None, **{"draft": "self-int8", **kw})
    assert not (tmp_path / "b").exists()


def test_fp16_activations_take_fp16_kv_as_they_are(tiny_dirs, tmp_path):
    """precision fp16 already has float16 KV: kv_dtype fp16 there is the same graph (no casts)."""
    export_bundle(str(tiny_dirs["target"]), tmp_path / "h", draft="none", precision="fp16", kv_dtype="fp16",
                  max_seq_len=128, max_draft_tokens=4, echo=None)
    man = load_manifest(tmp_path / "h")
    assert man.target.kv.dtype == "float16"
    nodes = onnx.load(str(tmp_path / "h" / man.target.graph), load_external_data=False).graph.node
    floats = (onnx.TensorProto.FLOAT, F16)  # not seqlens_k's int32 Casts
    casts = {n.output[0] for n in nodes if n.op_type == "Cast" and n.attribute[0].i in floats}
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert gqa and not any(i in casts for n in gqa for i in n.input)


def test_config_and_flag(tmp_path):
    cfg = tmp_path / "pair.toml"
    cfg.write_text('name = "pair"\n[target]\nsource = "t"\n[export]\nkv_dtype = "fp16"\n')
    assert export_plan({}, str(cfg))[2]["kv_dtype"] == "fp16"
    assert export_plan({"kv_dtype": "auto"}, str(cfg))[2]["kv_dtype"] == "auto"
    cfg.write_text('name = "pair"\n[target]\nsource = "t"\n')
    assert export_plan({}, str(cfg))[2]["kv_dtype"] == "auto"
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "export", "--target", str(tmp_path / "t"),
                        "--kv-dtype", "int8", "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Invalid value for '--kv-dtype'" in r.stderr and "Traceback" not in r.stderr
    cfg.write_text('name = "pair"\n[target]\nsource = "t"\n[export]\nkv_dtype = "bf16"\n')
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "export", "--config", str(cfg), "--out", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "kv_dtype must be one of" in r.stderr and "Traceback" not in r.stderr
