"""Each token's bytes (runtime/bundle/pieces.py), as llama.cpp's token_to_piece gives them: on the
default bundle's byte-level BPE (SmolLM2), on a SentencePiece-style tokenizer made by code
(Llama's decoder: ▁ for a space, byte fallback), and on the tiny word-level FIM tokenizer."""

from __future__ import annotations

import pytest

from specrt.runtime.bundle.manifest import TokenizerInfo, load_manifest
from specrt.runtime.bundle.pieces import piece_json, pieces
from specrt.runtime.bundle.tokenizer import Tokenizer
from tiny import tiny_tokenizer

TEXT = "def naïve(x):\n    return 'café — 日本語 🙂'  # <|im_end|>\n"


@pytest.fixture(scope="module")
def smol(default_bundle):
    return Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """Llama-style: BPE with byte fallback, ▁ for spaces, decoded by Replace + ByteFallback + Fuse + Strip."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    words = ["<unk>", "<s>", "</s>", "\u2581He", "llo", "\u2581", "<0xC3>", "<0xA9>", "H", "e", "l", "o", "\u2581H", "ll"]
    merges = [("\u2581", "H"), ("\u2581H", "e"), ("l", "l"), ("ll", "o")]
    tk = HFTokenizer(models.BPE({w: i for i, w in enumerate(words)}, merges, unk_token="<unk>", byte_fallback=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens([AddedToken("</s>", special=True)])
    folder = tmp_path_factory.mktemp("spm")
    tk.save(str(folder / "tokenizer.json"))
    return Tokenizer(folder, TokenizerInfo(eos_token_ids=[2]))


def test_byte_level_pieces_are_each_tokens_bytes(smol):
    ids = smol.tk.encode(TEXT, add_special_tokens=False).ids
    got = [pieces(smol).piece(t) for t in ids]
    assert b"".join(got) == TEXT.encode()
    assert any(isinstance(piece_json(p), list) for p in got)  # a token holding part of a character: its bytes
    end = smol.tk.token_to_id("<|im_end|>")
    assert end in ids and pieces(smol).piece(end) == b"<|im_end|>"
    assert pieces(smol).piece(end, special=False) == b""  # a control token renders as nothing without special


def test_sentencepiece_pieces_keep_the_leading_space_and_single_bytes(spm):
    ids = spm.tk.encode("Hello é", add_special_tokens=False).ids
    assert ids == [3, 4, 5, 6, 7]
    p = pieces(spm)
    assert [p.piece(t) for t in ids] == [b" He", b"llo", b" ", b"\xc3", b"\xa9"]
    assert spm.tk.decode([3]) == "He"  # what HF's decoder says of the token alone
    assert p.piece(2) == b"</s>" and p.piece(2, special=False) == b""


def test_the_table_covers_a_models_padded_rows(tmp_path):
    tiny_tokenizer(fim=True).save_pretrained(tmp_path)
    tok = Tokenizer(tmp_path, TokenizerInfo(eos_token_ids=[2]))
    table = pieces(tok).table(130, special=False)
    assert table[10] == b"w10" and table[122] == b"<|fim_prefix|>"  # an added token that is not special
    assert table[2] == b"" and table[128:] == (b"", b"")  # EOS; ids past the tokenizer's 128
