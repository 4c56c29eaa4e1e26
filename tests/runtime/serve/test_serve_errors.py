"""The serve layer's one error mapping (runtime/serve/errors.py) and the param a runtime refusal
carries to the client: raised with the exception, mapped onto the request's own field names."""

from __future__ import annotations

import pytest

from fakes import VOCAB, fake_pipeline
from specrt.runtime.engine import EngineBusy, EngineClosed
from specrt.runtime.serve.config import ServeOptions, ServerConfig
from specrt.runtime.serve.errors import APIError, ReplicaFailed, as_api_error, stream_error
from specrt.runtime.serve.openai.outputs import ChatOutput
from specrt.runtime.serve.openai.schema_chat import ChatCompletionRequest
from specrt.runtime.serve.openai.schema_completion import CompletionRequest
from specrt.runtime.serve.serving import LocalClient


def test_unavailable_engines_are_503s_with_retry_after():
    busy = as_api_error(EngineBusy("queue full"))
    assert (busy.status_code, busy.info.code, busy.info.message, busy.headers) == (
        503, "queue_full", "queue full", {"Retry-After": "1"})
    closed = as_api_error(EngineClosed())
    assert (closed.status_code, closed.info.code, closed.headers) == (503, "shutting_down", None)
    failed = as_api_error(ReplicaFailed("the replica died; retry", {"x-specrt-replica": "r1"}))
    assert (failed.status_code, failed.info.type, failed.info.code) == (503, "server_error", "replica_failed")
    assert failed.headers == {"Retry-After": "1", "x-specrt-replica": "r1"}
    bug = as_api_error(RuntimeError("oops"), "POST", "/v1/x")
    assert (bug.status_code, bug.info.message) == (500, "internal server error")  # never the exception's text
    mine = APIError(418, "teapot")
    assert as_api_error(mine) is mine


def test_a_stream_ends_with_the_same_mapping():
    info = stream_error(ReplicaFailed("the replica serving this request failed (RayActorError); retry"))
    assert (info.code, info.type) == ("replica_failed", "server_error") and "RayActorError" in info.message
    info = stream_error(RuntimeError("boom"))
    assert (info.message, info.type, info.code) == ("generation failed: boom", "server_error", None)


def test_options_map_onto_the_request_fields():
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.field_of("max_new_tokens") == "max_tokens"
    newer = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                  "max_completion_tokens": 5})
    assert newer.field_of("max_new_tokens") == "max_completion_tokens"
    comp = CompletionRequest.model_validate({"model": "m", "prompt": "hi"})
    assert comp.field_of("max_new_tokens") == "max_tokens" and comp.field_of("logit_bias") == "logit_bias"
    for server_side in ("timeout_s", "k", "draft", "adaptive", None):  # the client did not send these
        assert comp.field_of(server_side) is None


@pytest.fixture
def client(tmp_path):
    pipe = fake_pipeline(tmp_path, draft="self")
    b = LocalClient(ServerConfig(model_id="fake"), lambda: pipe)
    b.load()
    yield b
    b.close()


def _start(client, **body):
    req = ChatCompletionRequest.model_validate({"model": "fake", "messages": [{"role": "user", "content": "w3"}],
                                                **body})
    ids = [4, 5, 6]
    with pytest.raises(APIError) as e:
        client.start(req, ids, "messages", ChatOutput("fake"))
    return e.value


@pytest.mark.parametrize("body,param,code", [
    ({"logit_bias": {str(VOCAB + 1): 5}}, "logit_bias", None),  # the vocabulary: checked by the pipeline
    ({"max_tokens": 10**6}, "max_tokens", None),  # ContextOverflow
    ({"max_completion_tokens": 10**6}, "max_completion_tokens", None),
    ({"max_tokens": 2, "min_tokens": 3}, "min_tokens", None),  # RequestOptions' own check
    ({"guided_regex": "a+", "ignore_eos": True}, "ignore_eos", None),
    ({"guided_regex": "("}, "guided_regex", "invalid_grammar"),
])
def test_runtime_refusals_reach_the_client_with_their_field(client, body, param, code):
    err = _start(client, **body)
    assert (err.status_code, err.info.param, err.info.code, err.info.type) == (400, param, code,
                                                                               "invalid_request_error")
    if code is None:
        assert err.info.message.endswith(f"(prompt: 3 tokens, context: {client.pipe.max_seq_len})")


def test_a_prompt_that_fills_the_context_is_blamed_on_the_prompt(client):
    req = CompletionRequest.model_validate({"model": "fake", "prompt": "w3"})
    with pytest.raises(APIError) as e:
        client.start(req, [4] * client.pipe.max_seq_len, "prompt", ChatOutput("fake"))
    assert (e.value.info.param, e.value.info.code) == ("prompt", "context_length_exceeded")


def test_serve_options_follow_the_bundle(tiny_bundles, monkeypatch):
    monkeypatch.delenv("SPECRT_API_KEY", raising=False)
    with_draft = ServeOptions(engines=str(tiny_bundles["int8"]), request_timeout=5, max_body_mb=0.5)
    cfg = with_draft.server_config()
    assert (cfg.model_id, cfg.draft, cfg.adaptive, cfg.request_timeout_s, cfg.max_body_bytes) == (
        "int8", "model", True, 5, 2**19)
    assert cfg.server_options() == {"draft": "model", "adaptive": True, "timeout_s": 5}
    alone = ServeOptions(engines=str(tiny_bundles["none"])).server_config()
    assert (alone.draft, alone.adaptive) == ("none", False)  # no draft model: target-only, nothing to adapt
    monkeypatch.setenv("SPECRT_API_KEY", "sk-env")
    assert ServeOptions(engines=str(tiny_bundles["none"])).server_config().api_key == "sk-env"
