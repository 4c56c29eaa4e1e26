"""Editors through Ray Serve (`specrt serve --replicas 2`): llama.cpp's /infill, /tokenize and
/v1/completions with `suffix` on two engine replicas of the tiny FIM bundle (0.5 CPU each),
through Ray's proxy. One Ray start for the module; each answer equals one process's."""

from __future__ import annotations

import json

import httpx
import pytest
from test_serve_infill import CHUNKS, HEAD, LINE, TAIL, fim_bundle, llama_vscode  # noqa: F401 - fixture
from test_serve_ray import RaySrv

import specrt
from specrt.runtime.options import RequestOptions
from specrt.runtime.serve.ray.deploy import REPLICA_HEADER
from specrt.runtime.text.fim import ExtraFile, fim_parts

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def rs(fim_bundle):  # noqa: F811
    s = RaySrv(fim_bundle)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def solo(fim_bundle):  # noqa: F811
    with specrt.load(fim_bundle, max_batch=1, draft="none", prefix_cache=False) as pipe:
        yield pipe


def _text(pipe, ids, opts: RequestOptions, sibling: int = 0) -> str:
    return pipe.tokenizer.decode([t for c in pipe.stream_ids(ids, opts, sibling=sibling) for t in c])


def _ids(pipe, prefix=HEAD + LINE, suffix=TAIL, chunks=CHUNKS) -> list[int]:
    return fim_parts(pipe.tokenizer, prefix, suffix, [ExtraFile(c["filename"], c["text"]) for c in chunks]).ids


def test_llama_vscodes_body_through_the_replicas(rs, solo):
    """Its three completions (n_cmpl) with llama.cpp's infill sampler, run in a replica, are one
    process's target-only texts for the same seed."""
    r = httpx.post(rs.url + "/infill", json=llama_vscode(HEAD, TAIL, LINE, CHUNKS, 0) | {"seed": 5}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers[REPLICA_HEADER]
    opts = RequestOptions(max_new_tokens=128, temperature=1.0, top_k=40, top_p=0.99, infill=True, seed=5)
    ids = _ids(solo)
    assert [a["content"] for a in r.json()] == [_text(solo, ids, opts, i) for i in range(3)]
    assert all(a["tokens_evaluated"] == len(ids) and 0 <= a["timings"]["predicted_ms"] < 120_000 for a in r.json())


def test_infill_streamed_and_suffix_completions_equal_one_process(rs, solo):
    ids = _ids(solo, "w10 w11\nw12", "w13\nw14", [])
    want = _text(solo, ids, RequestOptions(max_new_tokens=12, ignore_eos=True))
    body = {"input_prefix": "w10 w11\n", "prompt": "w12", "input_suffix": "w13\nw14", "n_predict": 12,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", rs.url + "/infill", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers[REPLICA_HEADER]
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert "".join(c["content"] for c in chunks) == want and chunks[-1]["stop"] is True
    r = httpx.post(rs.url + "/v1/completions", json={"model": "fim", "prompt": "w10 w11\nw12", "suffix": "w13\nw14",
                                                    "max_tokens": 12, "temperature": 0, "ignore_eos": True},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want and r.json()["usage"]["prompt_tokens"] == len(ids)


def test_tokenize_and_refusals_at_the_ingress(rs, solo):
    r = httpx.post(rs.url + "/tokenize", json={"content": "w10 <|fim_prefix|>", "with_pieces": True}, timeout=30)
    assert r.json() == {"tokens": [{"id": 10, "piece": "w10"}, {"id": 122, "piece": "<|fim_prefix|>"}]}
    assert httpx.post(rs.url + "/detokenize", json={"tokens": [10, 122]}, timeout=30).json() == {
        "content": "w10<|fim_prefix|>"}
    r = httpx.post(rs.url + "/infill", json={"input_prefix": "w10\n", "samplers": ["min_p"]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "samplers"
