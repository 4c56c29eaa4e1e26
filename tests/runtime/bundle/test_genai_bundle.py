"""onnxruntime-genai runs an `ort` bundle as it is: the bundle's genai_config.json (and the
speculative overlay) through genai's Python API (the same C core its C / C++ / C# / Java APIs
wrap) give specrt's greedy output token for token."""

from __future__ import annotations

import json

import numpy as np
import pytest

import specrt
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.bundle.tokenizer import Tokenizer

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is in the bench extra (make test installs it)")


def _genai_greedy(folder, ids, n, overlay=None):
    cfg = og.Config(str(folder))
    if overlay:
        cfg.overlay(json.dumps(overlay))
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False, batch_size=1)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    out = [int(t) for t in gen.get_sequence(0)][len(ids):]
    man = load_manifest(folder)
    eos = Tokenizer(folder, man.tokenizer).eog_ids
    return out[:-1] if out and out[-1] in eos else out  # genai keeps the EOS it stopped at; specrt does not emit it


def _check(folder, ids, n):
    pipe = specrt.load(folder, draft="none", max_batch=1, hugepages=False)
    want = [t for c in pipe.stream_ids(ids, max_new_tokens=n) for t in c]
    pipe.close()
    assert _genai_greedy(folder, ids, n) == want
    spec = json.loads((folder / "genai_speculative.json").read_text())
    assert _genai_greedy(folder, ids, n, spec) == want  # genai's own speculative decoding, our draft graph


def test_tiny_bundle_runs_in_genai_as_it_is(tiny_bundles):
    folder = tiny_bundles["int8"]
    assert (folder / "genai_config.json").is_file() and (folder / "genai_speculative.json").is_file()
    _check(folder, [1, 5, 9, 33, 7, 12], 24)


def test_bundles_genai_cannot_run_get_no_config(tiny_bundles):
    assert not (tiny_bundles["eagle"] / "genai_speculative.json").exists()  # genai runs no EAGLE head
    assert not (tiny_bundles["none"] / "genai_speculative.json").exists()


@pytest.mark.slow
def test_default_bundle_runs_in_genai_as_it_is(default_bundle):
    pipe = specrt.load(default_bundle, draft="none", max_batch=1)
    ids = pipe.tokenizer.encode("Explain KV caches in two sentences.")
    pipe.close()
    _check(default_bundle, ids, 64)
