"""Weights stored once (export/portable.py, docs/design.md "Weights stored once"): an export with
portable = false keeps only the kernel graphs of a model that has them; it runs as the full
bundle's kernel load does, every reader that needs the portable graphs refuses it in one line
naming the tool, and the tool adds them back byte for byte."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys

import pytest
from tiny_gguf import write_tiny_gguf

import specrt
from specrt.export import export_bundle
from specrt.export.portable import add_portable
from specrt.runtime.bundle.manifest import MANIFEST, BundleError, load_manifest, manifest_from_dict
from specrt.runtime.kernels import form_for

KW = dict(precision="gguf", accuracy_level=4, max_seq_len=256, max_draft_tokens=8, draft_precision="int4", echo=None)
PROMPTS = [[1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9], [4, 8, 15, 16, 23, 42, 8, 15, 16], list(range(10, 50))]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("portable")
    target, draft = write_tiny_gguf(base / "t.gguf"), write_tiny_gguf(base / "d.gguf", seed=1)
    export_bundle(str(target), base / "full", draft=str(draft), **KW)
    export_bundle(str(target), base / "once", draft=str(draft), portable=False, **KW)
    return {"full": base / "full", "once": base / "once", "target": target}


def _files(folder) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_only_the_kernel_graphs_are_stored(pair):
    full, once = _files(pair["full"]), _files(pair["once"])
    man = load_manifest(pair["once"])
    for e in (man.target, man.draft):
        assert not e.portable and e.portable_missing and e.packed.kernels
        assert e.graph not in once and not any(e.packed.file(n) in once for n in e.packed.lanes)
        assert all(e.packed.kernel_file(n) in once for n in e.packed.lanes)
        assert once[e.packed.kernel_data] == full[e.packed.kernel_data]
        assert once[e.data] < full[e.data] / 2  # the projections' MatMulNBits weights are gone
    assert "genai_config.json" in full and "genai_config.json" not in once  # genai reads the portable graphs
    assert sum(once.values()) < 0.75 * sum(full.values())
    assert man.export["portable"] is False and man.export["target"] == str(pair["target"].resolve())
    assert load_manifest(pair["full"]).target.portable


def _greedy(bundle, draft, **kw):
    with specrt.load(bundle, max_batch=2, **kw) as pipe:
        names = pipe.parts.target.graph.name, pipe.parts.draft.graph.name if pipe.parts.draft else None
        return names, [[t for c in pipe.stream_ids(p, max_new_tokens=24, draft=draft, k=4, ignore_eos=True) for t in c]
                       for p in PROMPTS]


@pytest.mark.skipif(form_for(True)[0] == "none", reason="needs the kernel library (make kernels) and a fast form")
def test_it_runs_as_the_full_bundles_kernel_load(pair):
    names, want = _greedy(pair["full"], "none")
    assert names[0] == "packed2.kernels.onnx"
    for bundle in ("full", "once"):
        names, got = _greedy(pair[bundle], "model")
        assert names == ("packed2.kernels.onnx", "packed2.kernels.onnx")
        assert got == want  # speculative = target-only, and the same tokens with or without the portable graphs


def test_a_load_that_needs_the_portable_graphs_says_how_to_add_them(pair, monkeypatch):
    once = pair["once"]
    hint = f"python -m specrt.export.portable {once}"
    for kw in (dict(kernels=False), dict(packed=False)):
        with pytest.raises(BundleError, match="portable graphs") as e:
            specrt.load(once, max_batch=1, **kw)
        assert hint in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("SPECRT_KERNELS_ISA", "ref")  # a CPU with no fast form
    with pytest.raises(BundleError, match="SPECRT_KERNELS_ISA=ref") as e:
        specrt.load(once, max_batch=1, draft="none")
    assert hint in str(e.value)


def test_the_cli_refuses_in_one_line(pair):
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", "--engines", str(pair["once"]), "hi",
                        "--max-new-tokens", "2", "--no-kernels"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "python -m specrt.export.portable" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_tool_adds_them_back_byte_for_byte(pair, tmp_path):
    folder = tmp_path / "b"
    shutil.copytree(pair["once"], folder)
    man = add_portable(folder, echo=None)
    assert man.target.portable and man.draft.portable and (folder / "genai_config.json").is_file()
    full = _files(pair["full"])
    assert set(_files(folder)) == set(full)
    for rel in full:
        if rel != MANIFEST:
            assert filecmp.cmp(folder / rel, pair["full"] / rel, shallow=False), rel
    assert add_portable(folder, echo=None).target.portable  # a bundle that has them is left as it is


def test_the_tool_refuses_another_model_and_a_bundle_without_a_recipe(pair, tmp_path):
    folder = tmp_path / "b"
    shutil.copytree(pair["once"], folder)
    data = json.loads((folder / MANIFEST).read_text())
    data["export"]["target"] = str(write_tiny_gguf(tmp_path / "other.gguf", seed=7))
    (folder / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(BundleError, match="another model"):
        add_portable(folder, echo=None)
    assert not load_manifest(folder).target.portable  # untouched
    data["export"] = {}
    (folder / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(BundleError, match="records no export recipe"):
        add_portable(folder, echo=None)


def test_older_manifests_hold_their_portable_graphs():
    man = manifest_from_dict({"schema_version": 2, "target": {"graph": "target/model.onnx"}})
    assert man.target.portable and not man.target.portable_missing and man.export == {}


def test_portable_false_needs_the_ort_lowering(tmp_path):
    with pytest.raises(ValueError, match="kernel graphs"):
        export_bundle("x.gguf", tmp_path / "b", draft="none", lowering="standard", portable=False, echo=None)


@pytest.mark.skipif(form_for(True)[0] == "none", reason="needs the kernel library (make kernels) and a fast form")
def test_the_checks_observe_the_kernel_graph_and_the_portable_one_only_where_kept(pair):
    full, once = (load_manifest(pair[b]).target.parity for b in ("full", "once"))
    assert once["accuracy_level_4"]["graph"] == full["accuracy_level_4"]["graph"] == "kernels"
    assert once["accuracy_level_4"] == full["accuracy_level_4"]  # the same graph, the same numbers
    assert "portable_accuracy_level_4" in full and "portable_accuracy_level_4" not in once
    assert once["passed"] and once["checked_at_accuracy_level"] == 0  # the gate: the level-0 twin, as before


def test_the_config_key_and_the_flag(tmp_path):
    from specrt.export.config import ConfigError, export_plan

    cfg = tmp_path / "pair.toml"
    cfg.write_text('name = "p"\n[target]\nsource = "t.gguf"\n[export]\nportable = false\n')
    assert export_plan({}, str(cfg))[2]["portable"] is False
    assert export_plan({"portable": True}, str(cfg))[2]["portable"] is True  # a flag wins
    assert export_plan({"target": "t.gguf"})[2]["portable"] is True  # the default: a bundle any onnxruntime reads
    cfg.write_text('[target]\nsource = "t.gguf"\n[export]\nportable = "no"\n')
    with pytest.raises(ConfigError, match="portable must be true or false"):
        export_plan({}, str(cfg))
