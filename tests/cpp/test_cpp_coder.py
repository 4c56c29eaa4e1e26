"""The C API on the real pair (`make test-coder`, outside CI: it needs engines/coder):
Qwen2.5-Coder-1.5B-Instruct (its Q4_K_M blocks at accuracy_level 4, on specrt's kernels where the
CPU runs them) drafted by the 0.5B, a separate model on KV buffers of its own. Greedy output of
specrt-cpp equals the Python runtime's target-only output token for token on code prompts, with
the draft, n-gram and none; its tokenizer (Qwen2: NFC, Split + ByteLevel) encodes the rendered
prompts as Hugging Face tokenizers does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cpp_build import build, run_cpp
from paths import ROOT

BUNDLE = os.environ.get("SPECRT_CODER")
if not BUNDLE:
    pytest.skip("the real pair runs with `make test-coder` (SPECRT_CODER names the bundle)", allow_module_level=True)
BUNDLE = Path(BUNDLE)
WORKLOAD = [json.loads(ln) for ln in (ROOT / "configs" / "workloads" / "code.jsonl").read_text().splitlines() if ln]
PROMPTS = 3
NEW = 48
CONTEXT = "8192"  # the bundle's 32k context would allocate 1.9 GB of KV per model


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    import specrt

    with specrt.load(BUNDLE, draft="none", max_batch=1, max_seq_len=int(CONTEXT), prefix_cache=False) as pipe:
        ids = [pipe.tokenizer.encode(w["prompt"], chat=True) for w in WORKLOAD[:PROMPTS]]
        want = [[t for c in pipe.stream_ids(p, max_new_tokens=NEW) for t in c] for p in ids]
        rendered = [pipe.tokenizer.render_chat(w["prompt"]) for w in WORKLOAD[:PROMPTS]]
    return list(zip(ids, want, rendered, strict=True))


@pytest.mark.parametrize("draft", ["model", "ngram", "none"])
def test_coder_greedy_is_target_only(prompts, draft):
    for ids, want, _ in prompts:
        code, out = run_cpp(BUNDLE, ids, "--max-new-tokens", str(NEW), "--draft", draft, "--max-seq-len", CONTEXT)
        assert code == 0, out
        assert out["token_ids"] == want
        if draft == "model":
            assert out["stats"]["accepted"] > 0


def test_coder_text_prompt_and_text(prompts):
    """--prompt TEXT (the rendered chat template) gives the Python runtime's ids and its text."""
    from specrt.runtime.bundle.manifest import load_manifest
    from specrt.runtime.bundle.tokenizer import Tokenizer

    ids, want, rendered = prompts[0]
    build()
    code, out = run_cpp(BUNDLE, None, "--prompt", rendered, "--max-new-tokens", str(NEW), "--draft",
                        "none", "--max-seq-len", CONTEXT)
    assert code == 0, out
    assert out["prompt_ids"] == ids and out["token_ids"] == want
    tok = Tokenizer(BUNDLE, load_manifest(BUNDLE).tokenizer)
    assert out["text"] == tok.decode(want)
