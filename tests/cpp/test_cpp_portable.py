"""The C API on a bundle exported with portable = false (export/portable.py): it runs the kernel
graphs, with the Python runtime's greedy output, and an open that needs the portable graphs fails
with SPECRT_ERR_UNSUPPORTED and one message naming the tool that adds them."""

from __future__ import annotations

import sys

import pytest

import specrt
from cpp_build import run_cpp
from paths import ROOT
from specrt.runtime.kernels import form_for

sys.path.insert(0, str(ROOT / "tests" / "export"))
from tiny_gguf import write_tiny_gguf  # noqa: E402

PROMPT = [1, 5, 9, 33, 7, 5, 9]


@pytest.fixture(scope="module")
def once(tmp_path_factory):
    from specrt.export import export_bundle

    base = tmp_path_factory.mktemp("cpp-portable")
    target, draft = write_tiny_gguf(base / "t.gguf"), write_tiny_gguf(base / "d.gguf", seed=1)
    return export_bundle(str(target), base / "once", draft=str(draft), precision="gguf", max_seq_len=256,
                         max_draft_tokens=8, draft_precision="int4", portable=False, echo=None) and base / "once"


@pytest.mark.skipif(form_for(True)[0] == "none", reason="needs the kernel library (make kernels) and a fast form")
def test_runs_the_kernel_graphs_as_the_python_runtime(once):
    with specrt.load(once, max_batch=1) as pipe:
        want = [t for c in pipe.stream_ids(PROMPT, max_new_tokens=20, draft="none", ignore_eos=True) for t in c]
    code, out = run_cpp(once, PROMPT, "--max-new-tokens", "20", "--ignore-eos")
    assert code == 0 and out["graphs"] == {"target": "target/packed1.kernels.onnx",
                                           "draft": "draft/packed1.kernels.onnx"}, out
    assert out["token_ids"] == want  # the bundle's draft: speculative = target-only


@pytest.mark.parametrize("flags,env,why", [
    (("--graphs", "bundle"), None, "packed 0"),
    (("--graphs", "packed"), {"SPECRT_KERNELS_ISA": "ref"}, "no fast form"),
    (("--graphs", "packed"), {"SPECRT_KERNELS": "/nonexistent/libspecrt_kernels.so"}, "make kernels"),
])
def test_an_open_that_needs_the_portable_graphs_says_how_to_add_them(once, flags, env, why):
    code, out = run_cpp(once, PROMPT, *flags, env=env)
    assert out["error"]["code"] == "SPECRT_ERR_UNSUPPORTED" and code == 6, out
    message = out["error"]["message"]
    assert why in message and f"python -m specrt.export.portable {once}" in message and "\n" not in message
