"""OpenAI request bodies -> checked generation settings; errors in OpenAI's shape.

Pure (no HTTP framework): the app parses the body with `json.loads`, hands the dict here, and
turns an `APIError` into `{"error": {"message", "type", "param", "code"}}` with its status.
Unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


@dataclass
class GenParams:
    chat: bool
    model: str
    messages: list[dict] | None = None  # chat
    prompt: str | None = None  # completions
    max_tokens: int | None = None  # None: the server's default for the endpoint
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False  # extension (vLLM): run to max_tokens (load tests)


def _number(body: dict, name: str, default, lo: float, hi: float, integer: bool = False, lo_open: bool = False):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"'{name}' must be {'an integer' if integer else 'a number'}, got {type(v).__name__} {v!r}", name)
    try:
        v = float(v) if not integer or isinstance(v, float) else v
        finite = math.isfinite(float(v))
    except OverflowError:  # an integer literal too large for a float
        finite = False
    if integer and finite and not float(v).is_integer():
        raise bad(f"'{name}' must be an integer, got {v!r}", name)
    if not finite or v < lo or v > hi or (lo_open and v == lo):
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise bad(f"'{name}' must be in {rng}, got {str(v)[:40]}", name)
    return int(v) if integer else float(v)


def _content(m, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts: only text is supported
        texts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise bad(f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                          f"messages[{i}].content")
            texts.append(p["text"])
        return "".join(texts)
    if c is None and m.get("role") == "assistant":
        return ""
    raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def parse(body, chat: bool) -> GenParams:
    """body: the decoded JSON of a /v1/chat/completions (chat=True) or /v1/completions request."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required (a string: see GET /v1/models)", "model")
    p = GenParams(chat=chat, model=model)
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise bad("'messages' must be a non-empty list of {role, content}", "messages")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
                raise bad(f"messages[{i}] must be an object with role system, user or assistant", f"messages[{i}]")
            role = "system" if m["role"] == "developer" else m["role"]
            out.append({"role": role, "content": _content(m, i)})
        p.messages = out
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise bad("'prompt' must be a string (one prompt per request)", "prompt")
        if not prompt:
            raise bad("'prompt' is empty", "prompt")
        p.prompt = prompt
    n = _number(body, "n", 1, 1, 1e9, integer=True)
    if n != 1:
        raise bad(f"'n' must be 1 (one choice per request), got {n}", "n", "unsupported_value")
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            p.max_tokens = _number(body, name, None, 1, 1e12, integer=True)
            break
    p.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    p.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    p.top_k = _number(body, "top_k", 0, 0, 1e9, integer=True)  # extension (vLLM, llama.cpp); 0 = off
    if p.top_k < 0:
        raise bad("'top_k' must be >= 0 (0 = off)", "top_k")
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise bad(f"'seed' must be an integer, got {seed!r}", "seed")
        p.seed = seed
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 16):
        raise bad("'stop' must be a string or a list of at most 16 strings", "stop")
    p.stop = [s for s in (stop or []) if s]
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream")
    p.stream = bool(stream)
    ie = body.get("ignore_eos", False)
    if not isinstance(ie, bool):
        raise bad("'ignore_eos' must be a boolean", "ignore_eos")
    p.ignore_eos = ie
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("'stream_options' must be an object", "stream_options")
        p.include_usage = bool(so.get("include_usage", False))
    return p
