"""Bad bundles and bad arguments give their specrt_status (include/specrt.h) and a message, never
a crash: through specrt-cpp (its exit status is the status) and through the C API from C."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cpp_build import compile_program, run_cpp
from paths import DEFAULT_BUNDLE

HERE = Path(__file__).resolve().parent
STATUS = {"SPECRT_ERR_INVALID_ARGUMENT": 1, "SPECRT_ERR_NOT_FOUND": 2, "SPECRT_ERR_BAD_BUNDLE": 3,
          "SPECRT_ERR_SCHEMA_VERSION": 4, "SPECRT_ERR_CONTEXT": 5, "SPECRT_ERR_UNSUPPORTED": 6, "SPECRT_ERR_NO_DRAFT": 7}


def copy_bundle(tmp_path: Path, edit=None, drop_draft: bool = False) -> Path:
    """The default bundle's manifest in a folder of its own (model folders linked, not copied),
    edited by edit(manifest dict)."""
    out = tmp_path / "bundle"
    out.mkdir()
    man = json.loads((DEFAULT_BUNDLE / "specrt.json").read_text())
    for name in ("target", "draft", "tokenizer.json"):
        (out / name).symlink_to(DEFAULT_BUNDLE / name)
    if drop_draft:
        man["draft"] = None
    if edit:
        edit(man)
    (out / "specrt.json").write_text(json.dumps(man))
    return out


def assert_fails(status: str, bundle, *flags, prompt=(1, 2, 3), env=None):
    code, out = run_cpp(bundle, list(prompt) if prompt is not None else None, *flags, env=env)
    assert out["error"]["code"] == status, out
    assert code == STATUS[status] == out["error"]["status"]
    assert out["error"]["message"]
    return out["error"]["message"]


def test_missing_bundle(tmp_path):
    assert str(tmp_path / "nowhere") in assert_fails("SPECRT_ERR_NOT_FOUND", tmp_path / "nowhere")
    assert "specrt.json" in assert_fails("SPECRT_ERR_NOT_FOUND", tmp_path)


def test_corrupt_manifest(tmp_path):
    (tmp_path / "specrt.json").write_text("{not json")
    assert "corrupt" in assert_fails("SPECRT_ERR_BAD_BUNDLE", tmp_path)


def test_other_schema_version(tmp_path):
    bundle = copy_bundle(tmp_path, lambda m: m.update(schema_version=3))
    assert "schema_version 3" in assert_fails("SPECRT_ERR_SCHEMA_VERSION", bundle)


def test_missing_graph(tmp_path):
    bundle = copy_bundle(tmp_path, lambda m: m["target"].update(graph="target/gone.onnx"))
    assert "target/gone.onnx" in assert_fails("SPECRT_ERR_NOT_FOUND", bundle)


def test_graph_onnxruntime_cannot_load(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.onnx").write_bytes(b"not a model")
    bundle = copy_bundle(tmp_path, lambda m: m["target"].update(graph="../broken/model.onnx", data=None, packed={}))
    assert "cannot load the target graph" in assert_fails("SPECRT_ERR_BAD_BUNDLE", bundle)


def test_draft_model_without_one(tmp_path):
    bundle = copy_bundle(tmp_path, drop_draft=True)
    assert "no draft model" in assert_fails("SPECRT_ERR_NO_DRAFT", bundle, "--draft", "model")


def test_bad_arguments(tmp_path):
    assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, "--k", "17")  # max_tokens_per_call - 1 = 16
    assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, "--max-seq-len", "4")
    assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, "--no-such-flag")
    assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, "--draft", "eagle")
    assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, "--prompt-ids", "1,x")
    assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, prompt=None)


def test_kernels_the_cpu_cannot_run():
    """Kernels required (--graphs kernels) where the library runs only its portable form (a CPU
    without AVX-512 VNNI or AMX, as SPECRT_KERNELS_ISA=ref makes it report), or is missing."""
    message = assert_fails("SPECRT_ERR_UNSUPPORTED", DEFAULT_BUNDLE, "--graphs", "kernels", env={"SPECRT_KERNELS_ISA": "ref"})
    assert "AVX-512 VNNI" in message
    assert "make kernels" in assert_fails("SPECRT_ERR_UNSUPPORTED", DEFAULT_BUNDLE, "--graphs", "kernels",
                                          env={"SPECRT_KERNELS": "/nonexistent/libspecrt_kernels.so"})


@pytest.mark.slow
def test_kernels_by_default_only_where_they_run_fast():
    """Without kernels required, such a CPU runs the packed graphs on onnxruntime's operators."""
    code, out = run_cpp(DEFAULT_BUNDLE, [1, 2, 3], "--max-new-tokens", "2", env={"SPECRT_KERNELS_ISA": "ref"})
    assert code == 0 and out["graphs"] == {"target": "target/packed1.onnx", "draft": "draft/packed1.onnx"}, out
    from specrt.runtime import kernels

    code, out = run_cpp(DEFAULT_BUNDLE, [1, 2, 3], "--max-new-tokens", "2")
    fast = "draft/packed1.kernels.onnx" if kernels.fast() else "draft/packed1.onnx"  # as the Python runtime picks
    assert code == 0 and out["graphs"]["draft"] == fast, out


@pytest.mark.slow
def test_bad_requests_after_a_load():
    """What only a loaded bundle can check: each a failure of the request, after the load."""
    assert "exceeds the context of 2048" in assert_fails("SPECRT_ERR_CONTEXT", DEFAULT_BUNDLE, "--max-new-tokens",
                                                         "2046", "--draft", "none")
    assert "vocabulary" in assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, "--draft", "none",
                                        prompt=(1, 49152))
    assert "temperature" in assert_fails("SPECRT_ERR_INVALID_ARGUMENT", DEFAULT_BUNDLE, "--draft", "none",
                                         "--temperature", "-1")


def test_c_api_errors_from_c(tmp_path):
    exe = compile_program(HERE / "api_errors.c", tmp_path / "api_errors")
    r = subprocess.run([str(exe), str(tmp_path / "no-bundle")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
