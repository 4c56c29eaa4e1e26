"""llama.cpp's /tokenize and /detokenize (serve/llama/tokens.py): over HTTP on a real server over the
tiny FIM bundle (llama.vscode's body, pieces, mixed content, errors), and the tokenizer rules on
the default bundle's byte-level BPE and on a tokenizer that adds BOS and EOS."""

from __future__ import annotations

import httpx
import pytest
from test_serve import KEY, Server
from test_serve_infill import fim_bundle  # noqa: F401 - the module's bundle fixture

from specrt.runtime.bundle.manifest import TokenizerInfo, load_manifest
from specrt.runtime.bundle.tokenizer import Tokenizer
from specrt.runtime.serve.llama.schema_tokenize import DetokenizeRequest, TokenizeRequest
from specrt.runtime.serve.llama.tokens import detokenize, tokenize

AUTH = {"Authorization": f"Bearer {KEY}"}
FIM_PREFIX = 122  # the tiny FIM tokenizer's <|fim_prefix|>


@pytest.fixture(scope="module")
def srv(fim_bundle):  # noqa: F811
    s = Server(fim_bundle, api_key=KEY, max_batch=1, draft="none")
    yield s
    s.stop()


def _post(srv, path: str, body, headers=AUTH) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=headers, timeout=30)


def test_llama_vscodes_token_count_body(srv):
    """llama.vscode's countTextTokens (src/llama-server.ts): special-token text is read as the token."""
    text = "w10 w11\n<|fim_prefix|> w12"
    r = _post(srv, "/tokenize", {"content": text, "add_special": False, "parse_special": True})
    assert r.status_code == 200, r.text
    assert r.json() == {"tokens": [10, 11, FIM_PREFIX, 12]}
    # parse_special false: all of it is text, as FIM user text is read
    r = _post(srv, "/tokenize", {"content": text, "parse_special": False})
    assert r.json()["tokens"] == srv.pipe.tokenizer.encode_text(text) and FIM_PREFIX not in r.json()["tokens"]


def test_pieces_mixed_content_and_detokenize(srv):
    r = _post(srv, "/tokenize", {"content": ["w10", 11, "<|fim_prefix|> w12"], "with_pieces": True})
    assert r.json() == {"tokens": [{"id": 10, "piece": "w10"}, {"id": 11, "piece": "w11"},
                                   {"id": FIM_PREFIX, "piece": "<|fim_prefix|>"}, {"id": 12, "piece": "w12"}]}
    r = _post(srv, "/detokenize", {"tokens": [10, FIM_PREFIX, 2]})
    assert r.json() == {"content": "w10<|fim_prefix|></s>"}  # pieces joined, special tokens written out
    assert _post(srv, "/detokenize", {}).json() == {"content": ""}


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {"content": "w10", "model": "other"}, 404, "model"),
    ("/tokenize", {}, 400, "content"),
    ("/tokenize", {"content": ["w10", 5000]}, 400, "content[1]"),
    ("/tokenize", {"content": "w10", "with_pieces": "yes"}, 400, "with_pieces"),
    ("/detokenize", {"tokens": [10, 128]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
])
def test_errors_name_the_field(srv, path, body, status, param):
    r = _post(srv, path, body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_the_api_key_is_required(srv):
    assert _post(srv, "/tokenize", {"content": "w10"}, headers={}).status_code == 401
    assert _post(srv, "/detokenize", {"tokens": [10]}, headers={}).status_code == 401


def test_byte_level_round_trip_and_pieces(default_bundle):
    smol = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    text = "def naïve(x):\n    return '日本語 🙂'<|im_end|>"
    got = tokenize(smol, TokenizeRequest(content=text, with_pieces=True)).tokens
    ids = [t.id for t in got]
    assert ids == smol.tk.encode(text, add_special_tokens=False).ids
    assert any(isinstance(t.piece, list) for t in got)  # part of a character: its bytes
    assert detokenize(smol, DetokenizeRequest(tokens=ids)).content == text


def test_add_special_wraps_the_first_text_part(tmp_path):
    """A tokenizer whose post-processor adds BOS and EOS (as llama.cpp's add_bos / add_eos)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, processors

    tk = HFTokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    tk.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path, TokenizerInfo(eos_token_ids=[2]))
    ask = lambda content, **kw: tokenize(tok, TokenizeRequest(content=content, **kw)).tokens  # noqa: E731
    assert ask("a b") == [3, 4] and ask("a b", add_special=True) == [1, 3, 4, 2]
    assert ask("a b", add_special=True, parse_special=False) == [1, 3, 4, 2]
    assert ask(["a", 4, "b"], add_special=True) == [1, 3, 2, 4, 4]  # llama.cpp: the first part only
    assert ask([4, "a"], add_special=True) == [4, 3]  # a first part that is an id: nothing added
