"""Fill-in-the-middle over HTTP (serve/llama/infill.py): `/v1/completions` with `suffix` through the
official openai client and llama.cpp's `/infill` through httpx, on a real server over a tiny
bundle whose vocabulary has Qwen's FIM tokens (and over one without: 400)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import replace

import httpx
import pytest
from test_serve import KEY, Server

from specrt.runtime.bundle.manifest import FimTokens, load_manifest
from specrt.runtime.options import RequestOptions
from specrt.runtime.sampling.grammar import Constraint
from specrt.runtime.text.fim import ExtraFile, FimWindow, fim_parts
from tiny import save_tiny

AUTH = {"Authorization": f"Bearer {KEY}"}
PREFIX, SUFFIX = "w10 w11 w12\nw13 w14\nw15", "w16 w17\nw18 w19"


@pytest.fixture(scope="module")
def fim_bundle(tmp_path_factory):
    """The tiny target with the FIM tokenizer, drafted by its int8 self-draft. Its weights are
    wider than the other tiny models' (init std 0.6): at 0.3 its rows are so flat that llama.cpp's
    infill sampler, which keeps only texts over 20%, ends every completion at once."""
    from specrt.export import export_bundle

    base = tmp_path_factory.mktemp("fim")
    hf = save_tiny(base / "hf", seed=0, fim=True, std=0.6)
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


EOG = [2, 125, 126, 127]  # </s>, then Qwen's <|fim_pad|>, <|repo_name|>, <|file_sep|> (llama.cpp's EOG set)


def test_end_of_generation_ids_recorded_at_export_and_derived_for_older_bundles(fim_bundle, tiny_bundles, tmp_path):
    from specrt.runtime.bundle.tokenizer import Tokenizer

    info = load_manifest(fim_bundle).tokenizer
    assert info.eos_token_ids == [2] and info.eog_token_ids == EOG
    assert load_manifest(tiny_bundles["int8"]).tokenizer.eog_token_ids == [2]  # no FIM tokens: its EOS
    # a bundle exported before the field: the same set, from its EOS ids and its tokenizer's FIM tokens
    old = tmp_path / "old"
    shutil.copytree(fim_bundle, old)
    data = json.loads((old / "specrt.json").read_text())
    del data["tokenizer"]["eog_token_ids"], data["tokenizer"]["fim"]
    (old / "specrt.json").write_text(json.dumps(data))
    assert load_manifest(old).tokenizer.eog_token_ids is None
    assert Tokenizer(old, load_manifest(old).tokenizer).eog_ids == set(EOG)


def _greedy_ends(pipe, ids, n, bias) -> list[int]:
    """Target-only greedy tokens under a logit bias, running past every end token."""
    return [t for c in pipe.stream_ids(ids, max_new_tokens=n, draft="none", k=0, temperature=0, ignore_eos=True,
                                       logit_bias=bias) for t in c]


def _bias_that_ends_at(pipe, ids, eog, n) -> tuple[dict, list[int]]:
    """A logit bias on `eog` whose target-only greedy run first writes it after a few tokens (inside
    a speculative round, not at its first token), found by bisection -> (bias, tokens up to it)."""
    lo, hi = 0.0, 40.0  # no bias: never written; 40: written first
    for _ in range(30):
        bias = {eog: (lo + hi) / 2}
        toks = _greedy_ends(pipe, ids, n, bias)
        at = toks.index(eog) if eog in toks else n
        if 2 <= at < n - 1:
            return bias, toks[:at]
        lo, hi = (bias[eog], hi) if at >= n - 1 else (lo, bias[eog])
    raise AssertionError(f"no bias writes {eog} within {n} tokens")


@pytest.mark.parametrize("eog", EOG)
def test_a_request_stops_at_each_end_of_generation_token(srv, eog):
    """Every EOG id ends a FIM completion (speculative, int8 draft, k 4) as target-only decoding
    would: finish_reason stop, the text and usage end before the token, which is not in the text;
    through /infill stop_type eos. A plain completion (no suffix) stops at them too."""
    n, drafted = 24, srv.pipe.counters()["draft_tokens"]
    tok = srv.pipe.tokenizer
    ids = fim_parts(tok, PREFIX, SUFFIX).ids
    bias, want_ids = _bias_that_ends_at(srv.pipe, ids, eog, n)
    want = tok.decode(want_ids)
    body = dict(max_tokens=n, temperature=0, logit_bias={str(t): b for t, b in bias.items()})
    r = srv.client().completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, **body)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == len(want_ids)
    assert r.choices[0].text == want and tok.token(eog) not in r.choices[0].text
    got = _infill(srv, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=n, temperature=0,
                  logit_bias=body["logit_bias"]).json()
    assert got["content"] == want and got["stop_type"] == "eos" and got["tokens_predicted"] == len(want_ids)
    assert srv.pipe.counters()["draft_tokens"] > drafted  # the draft ran: the end came inside a verified run
    plain = tok.encode(PREFIX, chat=False)
    bias, want_ids = _bias_that_ends_at(srv.pipe, plain, eog, n)
    r = srv.client().completions.create(model="fim", prompt=PREFIX, max_tokens=n, temperature=0,
                                        logit_bias={str(t): b for t, b in bias.items()})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == len(want_ids)
    assert r.choices[0].text == tok.decode(want_ids)


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


def test_the_server_window_keeps_the_file_near_the_cursor_through_both_endpoints(srv):
    """ServerConfig.fim_window cuts the prefix's start and the suffix's end (text/fim.py
    FimWindow); /infill says `truncated`; both endpoints give target-only's tokens on the
    windowed prompt."""
    prefix = " ".join(f"w{10 + i}" for i in range(40)) + "\nw60 w61"
    suffix = " ".join(f"w{70 + i}" for i in range(30))
    w = FimWindow(prefix=12, suffix=6, step=4)
    ids = fim_parts(srv.pipe.tokenizer, prefix, suffix, window=w).ids
    assert len(ids) == 1 + 12 + 1 + 6 + 1 + 2  # 40 prefix words -> start 28 -> 12 kept; 6 of the suffix
    want = srv.pipe.tokenizer.decode(_target_only(srv.pipe, ids, 8))
    srv.cfg.fim_window = w
    try:
        got = _infill(srv, input_prefix=prefix.rpartition("\n")[0] + "\n", prompt="w60 w61", input_suffix=suffix,
                      n_predict=8, temperature=0, ignore_eos=True).json()
        r = srv.client().completions.create(model="fim", prompt=prefix, suffix=suffix, max_tokens=8, temperature=0,
                                            extra_body={"ignore_eos": True})
    finally:
        srv.cfg.fim_window = FimWindow()
    assert got["truncated"] is True and got["tokens_evaluated"] == len(ids) and got["content"] == want
    assert r.choices[0].text == want and r.usage.prompt_tokens == len(ids)
    whole = _infill(srv, input_prefix=prefix.rpartition("\n")[0] + "\n", prompt="w60 w61", input_suffix=suffix,
                    n_predict=1, temperature=0).json()
    assert whole["truncated"] is False and whole["tokens_evaluated"] == len(fim_parts(srv.pipe.tokenizer, prefix,
                                                                                       suffix).ids)


@pytest.mark.parametrize("body,param", [
    ({"samplers": ["top_k", "min_p"]}, "samplers"),  # a sampler not built
    ({"samplers": ["top_p", "top_k"]}, "samplers"),  # an order this server does not apply
    ({"samplers": "kpz"}, "samplers"),  # llama.cpp's characters: z is none
    ({"n_probs": 3}, "n_probs"),
    ({"repeat_penalty": 1.1}, "repeat_penalty"),
    ({"mirostat": 2}, "mirostat"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"min_p": 0.05}, "min_p"),
    ({"n_cmpl": 17}, "n_cmpl"),
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
                cache_prompt=False, seed=-1, t_max_predict_ms=-1, typical_p=1.0, id_slot=3, t_max_prompt_ms=500,
                unknown_field=1,
                response_fields=["content", "timings/prompt_n", "tokens_cached", "nothing/here"])
    got = _infill(srv, **body).json()
    assert set(got) == {"content", "timings/prompt_n", "tokens_cached"}


# ---- the editors' own bodies ------------------------------------------------------------------

def llama_vscode(prefix: str, suffix: str, prompt: str, chunks: list, nindent: int) -> dict:
    """llama.vscode's /infill body for a completion as ggml-org/llama.vscode v0.0.63 builds it:
    src/llama-server.ts `createRequestPayload(noPredict = false, ...)`, spreading its
    `defaultRequestParams`, with the settings' defaults (package.json: n_predict 128,
    max_parallel_completions 3, t_max_prompt_ms 500, t_max_predict_ms 500). `n_indent` is sent
    when the cursor's line is indented; `lora` and `model` only when those settings are set."""
    return {
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": chunks,
        "prompt": prompt,
        "n_predict": 128,
        "n_cmpl": 3,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        **({"n_indent": nindent} if nindent else {}),
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 500,
    }


def llama_vscode_warmup(chunks: list) -> dict:
    """The same file's `createRequestPayload(noPredict = true, "", "", chunks, "", ...)`, sent by
    `updateExtraContext` when its ring of extra chunks changes."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "", "n_predict": 0,
            "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}


# src/extra-context.ts' chunk shape ({text, time, filename}); src/completion.ts: the prefix's lines
# joined with a line break at the end, the cursor's line up to the cursor, the rest of it + the
# suffix's lines
CHUNKS = [{"text": "w30 w31 w32\nw33 w34", "time": 1755590000000, "filename": "/home/u/proj/util.py"}]
HEAD, LINE, TAIL = "w10 w11 w12\nw13 w14\n", "w15", "\nw16 w17\nw18 w19\n"


def _editor_ids(srv, prefix=HEAD + LINE, suffix=TAIL, chunks=CHUNKS) -> list[int]:
    return fim_parts(srv.pipe.tokenizer, prefix, suffix, [ExtraFile(c["filename"], c["text"]) for c in chunks]).ids


def test_llama_vscodes_default_bodies_are_answered(srv):
    warm = _infill(srv, **llama_vscode_warmup(CHUNKS))
    assert warm.status_code == 200, warm.text
    assert warm.json()["content"] == "" and warm.json()["tokens_predicted"] == 0
    r = _infill(srv, **llama_vscode(HEAD, TAIL, LINE, CHUNKS, 4))
    assert r.status_code == 200, r.text
    answers = r.json()  # n_cmpl 3: a list of answers, as llama.cpp gives (src/completion.ts reads each `content`)
    assert [a["index"] for a in answers] == [0, 1, 2]
    ids = _editor_ids(srv)
    for a in answers:
        assert isinstance(a["content"], str) and a["stop"] is True and a["stop_type"] in ("eos", "limit")
        assert a["tokens_evaluated"] == len(ids) and a["truncated"] is False
    warm_ids = _editor_ids(srv, "", "")
    shared = next(i for i, (a, b) in enumerate(zip(ids, warm_ids, strict=False)) if a != b)
    assert answers[0]["tokens_cached"] >= shared > len(CHUNKS[0]["text"].split())  # the warm-up's extra file


def _text(srv, ids, opts: RequestOptions, sibling: int, **kw) -> str:
    toks = [t for c in srv.pipe.stream_ids(ids, opts, sibling=sibling, **kw) for t in c]
    return srv.pipe.tokenizer.decode(toks)


def test_llama_vscodes_body_samples_llama_cpps_chain(srv):
    """With a seed, each of the three completions is the target's own (no draft) under llama.cpp's
    chain for these `samplers`: top-k 40, top-p 0.99 at T = 1 (temperature is not in the list), then
    the infill filter; without the filter the same seeds write other texts."""
    answers = _infill(srv, **llama_vscode(HEAD, TAIL, LINE, CHUNKS, 0), seed=5).json()
    ids = _editor_ids(srv)
    opts = RequestOptions(max_new_tokens=128, temperature=1.0, top_k=40, top_p=0.99, infill=True, seed=5)
    want = [_text(srv, ids, opts, i, draft="none", k=0) for i in range(3)]
    plain = [_text(srv, ids, replace(opts, infill=False), i, draft="none", k=0) for i in range(3)]
    assert [a["content"] for a in answers] == want
    assert want != plain and any(want)  # the filter changed these texts and left text in some


def test_the_infill_filter_under_speculation_equals_target_only(srv):
    ids = _editor_ids(srv)
    drafted = srv.pipe.counters()["draft_tokens"]
    for seed in range(4):
        opts = RequestOptions(max_new_tokens=64, temperature=1.0, top_k=40, top_p=0.99, infill=True, seed=seed)
        assert _text(srv, ids, opts, 0, draft="model", k=4) == _text(srv, ids, opts, 0, draft="none", k=0)
    assert srv.pipe.counters()["draft_tokens"] > drafted  # the draft ran, its proposals filtered alike


def llama_vim(prefix: str, suffix: str, middle: str, extra: list, indent: int) -> dict:
    """llama.vim's /infill body (ggml-org/llama.vim autoload/llama.vim `llama#fim`, its default
    config: n_predict 128, stop_strings [], t_max_prompt_ms 500, t_max_predict_ms 1000)."""
    return {
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": extra,
        "prompt": middle,
        "n_predict": 128,
        "stop": [],
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
        "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                            "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                            "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
                            "tokens_cached"],
    }


def test_llama_vims_body_is_answered(srv):
    r = _infill(srv, **llama_vim(HEAD, TAIL, LINE, CHUNKS, 0))
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"content", "timings/prompt_n", "timings/predicted_n", "timings/predicted_ms", "truncated",
                             "tokens_cached"}  # the fields it asks for that this server reports


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


@pytest.fixture(scope="module")
def bpe_srv(default_bundle, tmp_path_factory):
    """The default bundle (SmolLM2: a byte-level BPE tokenizer, its int8 self-draft) with three of
    its special ids recorded as FIM tokens: a real model whose typed lines end inside words and
    runs of spaces, served with the model drafter for FIM (not n-gram) so the draft's masks count."""
    folder = tmp_path_factory.mktemp("smolfim") / "smolfim"
    folder.mkdir()
    for f in default_bundle.resolve().iterdir():
        if f.name != "specrt.json":
            (folder / f.name).symlink_to(f)
    data = json.loads((default_bundle / "specrt.json").read_text())
    data["tokenizer"]["fim"] = {**data["tokenizer"]["fim"], "prefix": 1, "suffix": 2, "middle": 4}
    (folder / "specrt.json").write_text(json.dumps(data))
    s = Server(folder, api_key=KEY, max_batch=2, adaptive=False, k=4)
    s.cfg.fim_draft = None
    yield s
    s.stop()


BPE_CODE = "class Queue:\n    def __init__(self, maxsize=0):\n        self.maxsize = maxsize\n\n    def put(self, item):\n"
BPE_TAIL = "\n\n    def get(self):\n        return self.items.pop(0)\n"


@pytest.mark.parametrize("typed", ["        ", "        s", "        self.ite", "    def e"])
def test_the_cursor_lines_last_token_is_healed_and_the_output_stays_exact(bpe_srv, typed):
    """The typed line's last token is left out of the prompt and the output must begin with its
    text (runtime/sampling/text_prefix.py); the client gets what follows. Greedy speculative
    (int8 self-draft, k 4) = target-only under the same constraint, through /infill (streamed
    and whole) and `suffix`; the draft ran."""
    pipe, tok = bpe_srv.pipe, bpe_srv.pipe.tokenizer
    parts = fim_parts(tok, BPE_CODE + typed, BPE_TAIL)
    assert parts.heal and (BPE_CODE + typed).endswith(parts.heal) and parts.heal.strip(" ") in ("", "s", "ite", "e")
    assert parts.middle[1:] + tok.encode_text(parts.heal) == tok.encode_text(typed)  # the line less its last token
    raw = [t for c in pipe.stream_ids(parts.ids, max_new_tokens=16, draft="none", k=0, text_prefix=parts.heal)
           for t in c]
    text = tok.decode(raw)
    assert text.startswith(parts.heal)
    want = text[len(parts.heal):]
    drafted = pipe.counters()["draft_tokens"]
    body = dict(input_prefix=BPE_CODE, prompt=typed, input_suffix=BPE_TAIL, n_predict=16, temperature=0)
    got = _infill(bpe_srv, **body).json()
    assert got["content"] == want and got["tokens_predicted"] == len(raw)
    assert pipe.counters()["draft_tokens"] > drafted
    with httpx.stream("POST", bpe_srv.url + "/infill", json={**body, "stream": True}, headers=AUTH, timeout=60) as r:
        streamed = "".join(json.loads(ln[6:]).get("content", "") for ln in r.iter_lines() if ln.startswith("data: {"))
    assert streamed == want
    r = bpe_srv.client().completions.create(model="smolfim", prompt=BPE_CODE + typed, suffix=BPE_TAIL, max_tokens=16,
                                            temperature=0)
    assert r.choices[0].text == want and r.usage.completion_tokens == len(raw)


def test_a_grammar_reads_the_typed_line_whole(bpe_srv):
    """With a grammar the typed line stays whole in the prompt (the grammar reads the output from
    its start): the prompt and output are those of the unhealed layout."""
    tok = bpe_srv.pipe.tokenizer
    ids = fim_parts(tok, BPE_CODE + "        s", BPE_TAIL, heal=False).ids
    want = [t for c in bpe_srv.pipe.stream_ids(ids, max_new_tokens=8, draft="none", k=0,
                                                grammar=Constraint.regex("[a-z._ =()]{1,12}")) for t in c]
    r = bpe_srv.client().completions.create(model="smolfim", prompt=BPE_CODE + "        s", suffix=BPE_TAIL, max_tokens=8,
                                            temperature=0, extra_body={"guided_regex": "[a-z._ =()]{1,12}"})
    assert r.choices[0].text == tok.decode(want) and r.usage.prompt_tokens == len(ids)
