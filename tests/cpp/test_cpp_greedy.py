"""The C API's greedy output is the Python runtime's target-only output, token for token, with
the draft model, with n-gram lookup and with no drafter (issue 51): through specrt-cpp, through a
C++ program that keeps one bundle open for every request, and through the C example of
docs/cpp.md. On the real default bundle."""

from __future__ import annotations

import subprocess

import pytest

import specrt
from cpp_build import EXAMPLES, compile_program, run_cpp
from paths import ROOT
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.bundle.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

PROMPTS = [
    "Explain KV caches in two sentences.",
    "Repeat exactly, three times: red fish, blue fish, old fish, new fish.",
    "Write a Python function that returns the n-th Fibonacci number.",
]
NEW = 64


@pytest.fixture(scope="module")
def prompts(default_bundle) -> list[list[int]]:
    tok = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    return [tok.encode(p, chat=True) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(default_bundle, prompts) -> list[list[int]]:
    """The Python runtime's target-only greedy tokens (each prompt from an empty cache, as the C
    API computes every request)."""
    with specrt.load(default_bundle, draft="none", max_batch=1, prefix_cache=False) as pipe:
        return [[t for chunk in pipe.stream_ids(ids, max_new_tokens=NEW) for t in chunk] for ids in prompts]


@pytest.mark.parametrize(("draft", "graphs"), [("none", "packed"), ("model", "packed"), ("ngram", "packed"),
                                               ("none", "bundle"), ("model", "bundle")])
def test_specrt_cpp_greedy_is_target_only(default_bundle, prompts, reference, draft, graphs):
    """graphs: packed (the packed graphs, on specrt's kernels where this CPU runs them fast: what
    the Python runtime takes by default) or bundle (the entries' own graphs)."""
    code, out = run_cpp(default_bundle, prompts[0], "--max-new-tokens", str(NEW), "--draft", draft, "--graphs", graphs)
    assert code == 0, out
    assert out["token_ids"] == reference[0]
    assert out["graphs"]["target"].startswith("target/packed1." if graphs == "packed" else "target/model.onnx")
    s = out["stats"]
    assert s["new_tokens"] == len(reference[0]) and s["prompt_tokens"] == len(prompts[0])
    assert s["rounds"] == s["target_calls"] - 1  # the prompt's call, then one per round
    if draft == "none":
        assert s["drafted"] == 0 and s["rounds"] == s["new_tokens"] - 1
    if draft == "model":  # the int8 self-draft agrees with the target almost everywhere
        assert s["accepted"] >= 0.6 * s["drafted"] > 0 and s["rounds"] < s["new_tokens"] / 2


def test_one_open_bundle_every_drafter(default_bundle, prompts, reference, tmp_path):
    """A C++ program (cpp/examples/drafts.cc) that opens the bundle once and picks the drafter
    per request: every prompt, every drafter, target-only's tokens."""
    exe = compile_program(EXAMPLES / "drafts.cc", tmp_path / "drafts")
    (tmp_path / "prompts.txt").write_text("".join(",".join(map(str, p)) + "\n" for p in prompts))
    r = subprocess.run([str(exe), str(default_bundle), str(tmp_path / "prompts.txt"), str(NEW), "none", "model",
                        "ngram"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    lines = [line.split(" ") for line in r.stdout.splitlines()]
    assert len(lines) == 3 * len(prompts)
    for index, draft, _, ids in lines:
        assert [int(t) for t in ids.split(",")] == reference[int(index)], (index, draft)
    accepted = {(i, d): tuple(map(int, c.split("/"))) for i, d, c, _ in lines}
    assert accepted[("1", "ngram")][0] > 0  # the repetitive prompt: lookup proposals are kept


def test_c_example_streams_the_text(default_bundle, prompts, reference, tmp_path):
    """docs/cpp.md's C example: the rendered chat prompt tokenized by the library, the reply
    streamed through its decoder from the token callback: the Python runtime's text."""
    exe = compile_program(EXAMPLES / "generate.c", tmp_path / "generate")
    tok = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    r = subprocess.run([str(exe), str(default_bundle), tok.render_chat(PROMPTS[0])], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == tok.decode(reference[0][:32]) + "\n"
    assert b"32 tokens" in r.stderr


def test_a_long_prompt_to_the_context_s_last_row(default_bundle):
    """A prompt of 32 chunks and a reply that fills the context to its last row (2048): the
    packed target's lone token there has no row for its filler, and is sent with the token
    before it, as the Python runtime does."""
    tok = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    text = (ROOT / "docs" / "bundle.md").read_text()
    ids = tok.encode("Summarize this document:\n" + text, chat=True)[:1990]
    new = 2048 - len(ids)
    with specrt.load(default_bundle, draft="none", max_batch=1, prefix_cache=False) as pipe:
        want = [t for c in pipe.stream_ids(ids, max_new_tokens=new, ignore_eos=True) for t in c]
    for draft in ("none", "model"):
        code, out = run_cpp(default_bundle, ids, "--max-new-tokens", str(new), "--ignore-eos", "--draft", draft)
        assert code == 0, out
        assert out["token_ids"] == want and len(want) == new
