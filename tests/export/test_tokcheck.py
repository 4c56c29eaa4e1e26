"""The bundled tokenizer against its GGUF's own tokens (export/tokcheck.py): a real GGUF file
written here (metadata only) and the tiny tokenizer, made to agree and then to differ."""

from __future__ import annotations

import pytest

from specrt.export import tokcheck
from specrt.export.sources import SourceError
from specrt.runtime.bundle.manifest import TokenizerInfo
from tiny import CHAT_TEMPLATE, VOCAB, tiny_tokenizer


def write_gguf(path, tokens, types, eos=2, template=CHAT_TEMPLATE):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_eos_token_id(eos)
    w.add_bos_token_id(1)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny(tmp_path):
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    types = [tokcheck.CONTROL if t in ("<s>", "</s>") else 1 for t in tokens]
    info = TokenizerInfo(file="tokenizer.json", chat_template=CHAT_TEMPLATE, bos_token_id=1, eos_token_ids=[2])
    return tmp_path, tokens, types, info


def test_tokenizer_matching_its_gguf_passes(tiny):
    tmp, tokens, types, info = tiny
    g = tokcheck.read_gguf_tokens(write_gguf(tmp / "m.gguf", tokens, types))
    assert g.vocab_size == VOCAB and g.specials == {1: "<s>", 2: "</s>"} and g.eos == 2
    assert tokcheck.check(g, tmp / "tok" / "tokenizer.json", info) == {
        "special_tokens_checked": 2, "eos": 2, "bos": 1, "ends": {"eos": 2}, "added_beyond_gguf": [],
        "chat_template_as_shipped": True}


def test_the_ggufs_own_end_tokens_are_read(tiny):
    """eot / eom / fim_pad / fim_rep / fim_sep ids in the metadata: the exporter adds them to
    the bundle's end-of-generation ids (llama.cpp's EOG set has them whatever their names)."""
    import gguf

    tmp, tokens, types, info = tiny
    w = gguf.GGUFWriter(str(tmp / "m.gguf"), "llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_eos_token_id(2)
    w.add_uint32("tokenizer.ggml.eot_token_id", 7)
    w.add_uint32("tokenizer.ggml.fim_sep_token_id", 9)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert tokcheck.read_gguf_tokens(tmp / "m.gguf").ends == {"eos": 2, "eot": 7, "fim_sep": 9}


def test_special_token_not_special_in_bundle_is_refused(tiny):
    tmp, tokens, types, info = tiny
    # the GGUF puts "w8" at id 7 and marks it user-defined; the bundled tokenizer says id 8
    tokens[7], tokens[8] = tokens[8], tokens[7]
    types[7] = tokcheck.USER_DEFINED
    g = tokcheck.read_gguf_tokens(write_gguf(tmp / "m.gguf", tokens, types))
    with pytest.raises(SourceError, match=r"1 special tokens do not encode to their GGUF id alone: 'w8' -> \[8\] \(GGUF id 7\)"):
        tokcheck.check(g, tmp / "tok" / "tokenizer.json", info)


def test_missing_special_token_and_template_and_eos_named(tiny):
    tmp, tokens, types, info = tiny
    tokens[5], types[5] = "<|im_start|>", tokcheck.CONTROL  # not in the bundled vocabulary at all
    g = tokcheck.read_gguf_tokens(write_gguf(tmp / "m.gguf", tokens, types, eos=5, template="{{ other }}"))
    with pytest.raises(SourceError) as e:
        tokcheck.check(g, tmp / "tok" / "tokenizer.json", info)
    msg = str(e.value)
    assert "'<|im_start|>'" in msg and "end-of-sequence token 5" in msg and "chat template differs" in msg


def test_vocabulary_size_difference_named(tiny):
    tmp, tokens, types, info = tiny
    g = tokcheck.read_gguf_tokens(write_gguf(tmp / "m.gguf", tokens + ["extra"], types + [1]))
    with pytest.raises(SourceError, match=f"vocabulary size {VOCAB} \\(GGUF {VOCAB + 1}\\)"):
        tokcheck.check(g, tmp / "tok" / "tokenizer.json", info)
