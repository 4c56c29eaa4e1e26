"""The real default bundle (SmolLM2-135M-Instruct fp32 + int8 self-draft), built by `make export`."""

import numpy as np
import pytest

import specrt
from checks import assert_same_greedy
from paths import DEFAULT_BUNDLE
from specrt.runtime.bundle.manifest import load_manifest

pytestmark = pytest.mark.slow

PROMPTS = [
    "Explain KV caches in two sentences.",
    "Write a Python function that reverses a linked list.",
    "Summarize: The mitochondria is the powerhouse of the cell. It produces ATP through respiration.",
    "What is the capital of Japan?",
]


@pytest.fixture(scope="module")
def pipe(default_bundle):
    with specrt.load(default_bundle) as p:
        yield p


def test_export_parity_recorded(default_bundle):
    man = load_manifest(default_bundle)
    p = man.target.parity
    assert p["passed"] and p["prefill_max_abs"] < 1e-3 and p["continuation_max_abs"] < 1e-3
    assert p["greedy_match"] == p["greedy_steps"] == 32
    assert man.draft.recipe == "self-int8" and man.draft.precision == "int8"
    # the reason it is the default: it agrees with the target almost everywhere (int4: ~0.7-0.9)
    assert man.draft.parity["greedy_agreement_with_target"] >= 0.9
    assert man.tokenizer.eos_token_ids and man.tokenizer.chat_template


def _margins(pipe, prompt_ids, tokens):
    """Target top-1 minus top-2 logit at each generated position (teacher-forced, on a session
    of its own: the pipeline's models belong to its engine)."""
    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend

    dec = SequenceHarness(OrtBackend(pipe.folder / pipe.manifest.target.graph, pipe.manifest.target))
    rows = []
    row = dec.prefill(prompt_ids)
    rows.append(row.copy())
    for t in tokens[:-1]:
        rows.append(dec.forward([t])[0].copy())
    top2 = np.sort(np.stack(rows), axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_target_only_128(pipe, prompt):
    ids = pipe.tokenizer.encode(prompt)
    want = [t for c in pipe.stream_ids(ids, max_new_tokens=128, draft="none", k=0) for t in c]
    for k in (2, 4):
        got = [t for c in pipe.stream_ids(ids, max_new_tokens=128, k=k) for t in c]
        if got != want:
            assert_same_greedy(got, want, _margins(pipe, ids, want))


def test_streaming_text_equals_full_decode(pipe):
    pieces = list(pipe.stream("Write three emoji and a word in Japanese.", max_new_tokens=48))
    res = pipe.last
    assert "".join(pieces) == res.text == pipe.tokenizer.decode(res.token_ids)
    assert "\ufffd" not in res.text


def test_stream_decoder_multibyte_split():
    from specrt.runtime.bundle.tokenizer import Tokenizer

    tok = Tokenizer(DEFAULT_BUNDLE, load_manifest(DEFAULT_BUNDLE).tokenizer)
    text = "naïve café — 日本語 🙂🚀 ok"
    ids = tok.encode(text, chat=False)
    s = tok.stream()
    out = "".join(s.push([i]) for i in ids) + s.flush()
    assert out == tok.decode(ids) == text
    assert len(ids) > len(text.split())  # multi-byte characters really span tokens


def test_stop_string(pipe):
    full = pipe.generate("Count from 1 to 20 separated by commas.", max_new_tokens=60).text
    assert "5" in full
    res = pipe.generate("Count from 1 to 20 separated by commas.", max_new_tokens=60, stop=["5"])
    assert res.text == full[: full.index("5")] and res.stats.stop_reason == "stop"


def test_chat_template_applied(pipe):
    ids = pipe.tokenizer.encode("hello")
    text = pipe.tokenizer.tk.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system") and text.rstrip().endswith("assistant")
    raw = pipe.tokenizer.encode("hello", chat=False)
    assert len(raw) < len(ids)


def test_ctrl_c_ends_cleanly_and_keeps_output(default_bundle):
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "specrt.cli", "generate", "--engines", str(default_bundle), "--max-new-tokens", "1500",
         "--raw", "Once upon a time"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # a shell's background job inherits SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: give the child the default disposition, as a terminal would
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stdout.read(20)  # wait until text is streaming
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert first and "Traceback" not in err, err
    assert proc.returncode == 0, (proc.returncode, err)
    assert "stop: interrupted" in err
    assert len(first + out) > 20
