"""Fill-in-the-middle over HTTP (serve/infill.py): `/v1/completions` with `suffix` through the
official openai client and llama.cpp's `/infill` through httpx, on a real server over a tiny
bundle whose vocabulary has Qwen's FIM tokens (and over one without: 400)."""

from __future__ import annotations

import json
import shutil
import threading
import time

import httpx
import pytest
from test_serve import KEY, Server

from specrt.runtime.bundle.manifest import FimTokens, load_manifest
from specrt.runtime.text.fim import ExtraFile, fim_parts
from tiny import save_tiny

AUTH = {"Authorization": f"Bearer {KEY}"}
PREFIX, SUFFIX = "w10 w11 w12\nw13 w14\nw15", "w16 w17\nw18 w19"


@pytest.fixture(scope="module")
def fim_bundle(tmp_path_factory):
    """The tiny target with the FIM tokenizer, drafted by its int8 self-draft."""
    from specrt.export import export_bundle

    base = tmp_path_factory.mktemp("fim")
    hf = save_tiny(base / "hf", seed=0, fim=True)
    export_bundle(str(hf), base / "fim", draft="self-int8", max_seq_len=256, max_draft_tokens=8, echo=None)
    return base / "fim"


@pytest.fixture(scope="module")
def srv(fim_bundle):
    s = Server(fim_bundle, api_key=KEY, max_batch=2, max_queue=8, adaptive=False, k=4)
    yield s
    s.stop()


def _infill(srv, **body) -> httpx.Response:
    return httpx.post(srv.url + "/infill", json=body, headers=AUTH, timeout=60)


def _target_only(pipe, ids, n) -> list[int]:
    return [t for c in pipe.stream_ids(ids, max_new_tokens=n, draft="none", k=0, temperature=0) for t in c]


def test_fim_tokens_recorded_at_export_and_found_in_older_bundles(fim_bundle, tiny_bundles, tmp_path):
    fim = load_manifest(fim_bundle).tokenizer.fim
    assert fim == FimTokens(prefix=122, suffix=124, middle=123, pad=125, repo_name=126, file_sep=127)
    assert load_manifest(tiny_bundles["int8"]).tokenizer.fim == FimTokens()  # recorded: none
    # a bundle exported before the field existed: found in its tokenizer at load
    old = tmp_path / "old"
    shutil.copytree(fim_bundle, old)
    data = json.loads((old / "specrt.json").read_text())
    del data["tokenizer"]["fim"]
    (old / "specrt.json").write_text(json.dumps(data))
    assert load_manifest(old).tokenizer.fim is None
    from specrt.runtime.bundle.tokenizer import Tokenizer

    assert Tokenizer(old, load_manifest(old).tokenizer).fim == fim


def test_suffix_and_infill_give_the_same_tokens_equal_to_target_only(srv):
    """Exactness through both endpoints, streamed and whole: greedy speculative (int8 draft,
    k 4) = target-only on the same prompt ids."""
    n, drafted = 24, srv.pipe.counters()["draft_tokens"]
    ids = fim_parts(srv.pipe.tokenizer, PREFIX, SUFFIX).ids
    want = srv.pipe.tokenizer.decode(_target_only(srv.pipe, ids, n))
    client = srv.client()
    r = client.completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=n, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == want and r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == n
    streamed = client.completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=n, temperature=0,
                                         stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want
    # /infill: the cursor's line may come as `prompt`; the prompt is the same
    head, line = PREFIX.rsplit("\n", 1)
    body = dict(input_prefix=head + "\n", prompt=line, input_suffix=SUFFIX, n_predict=n, temperature=0,
                ignore_eos=True)
    got = _infill(srv, **body).json()
    assert got["content"] == want and got["tokens_evaluated"] == len(ids) and got["tokens_predicted"] == n
    assert got["stop"] is True and got["stop_type"] == "limit" and got["truncated"] is False
    with httpx.stream("POST", srv.url + "/infill", json={**body, "stream": True}, headers=AUTH, timeout=60) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    assert "".join(c["content"] for c in chunks) == want and chunks[-1]["stop"] is True
    assert srv.pipe.counters()["draft_tokens"] > drafted  # the draft ran: speculation was checked


def test_literal_fim_strings_in_user_text_stay_text(srv):
    prefix = "w10 <|fim_suffix|>\nw11 <|fim_middle|>"
    ids = fim_parts(srv.pipe.tokenizer, prefix, "<|fim_prefix|> w12").ids
    assert ids == [122, 10, 0, 124, 0, 12, 123, 11, 0]
    got = _infill(srv, input_prefix=prefix, input_suffix="<|fim_prefix|> w12", n_predict=8, temperature=0).json()
    assert got["tokens_evaluated"] == len(ids)
    assert got["content"] == srv.pipe.tokenizer.decode(_target_only(srv.pipe, ids, 8)[: got["tokens_predicted"]])


def test_the_next_keystroke_reuses_the_file_and_the_suffix(srv):
    """Extra files, the prefix's lines and the suffix are cached; a changed cursor line
    recomputes only what follows <|fim_middle|>. A warm-up (n_predict 0) fills the cache."""
    extra = [{"filename": "a.py", "text": "w30 w31 w32 w33"}, {"filename": "b.py", "text": "w34 w35"}]
    base = dict(input_prefix="w10 w11\nw12 w13\n", input_suffix="w16 w17\nw18", input_extra=extra, temperature=0)
    warm = _infill(srv, **base, prompt="w14", n_predict=0).json()
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    ids = fim_parts(srv.pipe.tokenizer, base["input_prefix"] + "w14 w15", base["input_suffix"],
                    [ExtraFile(x["filename"], x["text"]) for x in extra]).ids
    got = _infill(srv, **base, prompt="w14 w15", n_predict=6).json()
    assert got["tokens_evaluated"] == len(ids)
    assert got["tokens_cached"] == len(ids) - 1  # all but the new word (the middle token's row was there)
    assert got["timings"]["prompt_n"] == 1
    assert got["content"] == srv.pipe.tokenizer.decode(_target_only(srv.pipe, ids, 6)[: got["tokens_predicted"]])


def test_a_prompt_beyond_the_context_is_trimmed_and_says_so(srv):
    long = " ".join(f"w{10 + i % 100}" for i in range(400))
    got = _infill(srv, input_prefix=long + "\n", input_suffix="w16", prompt="w14", n_predict=8, temperature=0).json()
    assert got["truncated"] is True and got["tokens_evaluated"] + 8 <= 256


@pytest.mark.parametrize("body,param", [
    ({"samplers": ["top_k", "infill"]}, "samplers"),
    ({"t_max_prompt_ms": 500}, "t_max_prompt_ms"),
    ({"n_probs": 3}, "n_probs"),
    ({"repeat_penalty": 1.1}, "repeat_penalty"),
    ({"mirostat": 2}, "mirostat"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"min_p": 0.05}, "min_p"),
    ({"n": 2}, "n"),
    ({"return_tokens": True}, "return_tokens"),
    ({"n_predict": -2}, "n_predict"),
    ({"input_extra": [{"filename": "a"}]}, "input_extra[0].text"),
    ({"model": "other"}, "model"),
])
def test_llama_options_not_built_are_refused_naming_them(srv, body, param):
    r = _infill(srv, input_prefix="w10\n", input_suffix="w11", **body)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_honoured_llama_options_and_response_fields(srv):
    body = dict(input_prefix="w10\n", input_suffix="w11", n_predict=4, temperature=0, samplers=["top_k", "top_p"],
                cache_prompt=False, seed=-1, t_max_predict_ms=-1, typical_p=1.0, id_slot=-1, unknown_field=1,
                response_fields=["content", "timings/prompt_n", "tokens_cached", "nothing/here"])
    got = _infill(srv, **body).json()
    assert set(got) == {"content", "timings/prompt_n", "tokens_cached"}


def test_a_bundle_without_fim_tokens_answers_400_naming_the_field(tiny_bundles):
    s = Server(tiny_bundles["none"], api_key=KEY, max_batch=1)
    try:
        r = httpx.post(s.url + "/v1/completions", headers=AUTH, json={"model": "none", "prompt": "w5", "suffix": "w6"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
        assert "fill-in-the-middle" in r.json()["error"]["message"]
        r = httpx.post(s.url + "/infill", headers=AUTH, json={"input_prefix": "w5", "input_suffix": "w6"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input_prefix"
        # an empty suffix is no insertion: a plain completion, on any bundle
        r = httpx.post(s.url + "/v1/completions", headers=AUTH, json={"model": "none", "prompt": "w5", "suffix": "",
                                                                      "max_tokens": 2})
        assert r.status_code == 200
    finally:
        s.stop()


def _wait_idle(pipe, deadline_s=10) -> int:
    deadline = time.time() + deadline_s
    while pipe.counters()["running"] and time.time() < deadline:
        time.sleep(0.02)
    return pipe.counters()["running"]


def test_a_client_that_disconnects_frees_its_slot(srv):
    body = dict(input_prefix="w10\n", input_suffix="w11", n_predict=230, temperature=0, ignore_eos=True)
    before = srv.pipe.counters()["tokens"]
    with httpx.stream("POST", srv.url + "/infill", json={**body, "stream": True}, headers=AUTH) as r:
        next(r.iter_lines())  # the first chunk arrived: the request is running
    assert _wait_idle(srv.pipe) == 0
    # a non-streaming client (llama.vscode) that gives up: its request ends too
    done = threading.Event()

    def give_up():
        try:
            httpx.post(srv.url + "/infill", json=body, headers=AUTH, timeout=0.3)
        except httpx.TimeoutException:
            pass
        done.set()

    threading.Thread(target=give_up).start()
    assert done.wait(10)
    assert _wait_idle(srv.pipe) == 0
    assert srv.pipe.counters()["tokens"] - before < 2 * 230  # both cut short


def test_fill_in_the_middle_drafts_by_n_gram_on_a_server_that_drafts():
    from specrt.runtime.serve.config import ServerConfig

    cfg = ServerConfig("m")
    assert cfg.server_options(fim=True)["draft"] == "ngram"
    assert cfg.server_options()["draft"] is None  # other requests: the server's drafter
    assert ServerConfig("m", draft="none").server_options(fim=True)["draft"] == "none"
    assert ServerConfig("m", fim_draft=None, draft="model").server_options(fim=True)["draft"] == "model"
