"""Token healing (runtime/sampling/text_prefix.py): the tokens a "the output begins with these
bytes" constraint allows, on a real byte-level BPE tokenizer (SmolLM2's, the default bundle),
and the text the client gets (runtime/text/textstream.py `skip`)."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.bundle.pieces import pieces
from specrt.runtime.bundle.tokenizer import Tokenizer
from specrt.runtime.sampling.text_prefix import TextPrefix, prefix_index
from specrt.runtime.text.textstream import TextStream


@pytest.fixture(scope="module")
def smol(default_bundle):
    return Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)


@pytest.fixture(scope="module")
def index(smol, default_bundle):
    return prefix_index(smol, load_manifest(default_bundle).target.vocab_size)


def _id(tok, text):
    ids = tok.encode_text(text)
    assert len(ids) == 1, ids
    return ids[0]


def test_the_allowed_tokens_are_those_that_keep_the_text_on_course(smol, index):
    table = pieces(smol).table(index.vocab, special=True)
    want = "        "  # 8 spaces: one token alone; "7 spaces" + " self" in code
    m = TextPrefix(index, want)
    allowed = m.masks()[0]
    expect = np.array([bool(b) and i not in pieces(smol).added and (b.startswith(want.encode())
                                                                     or want.encode().startswith(b))
                       for i, b in enumerate(table)])
    assert np.array_equal(allowed, expect)  # the brute-force definition, token for token
    seven, eight, self_ = _id(smol, " " * 7), _id(smol, " " * 8), _id(smol, " self")
    assert allowed[seven] and allowed[eight] and allowed[_id(smol, " ")] and not allowed[self_]
    assert not any(allowed[t] for t in smol.eog_ids)  # the output cannot end before the text is written
    # after 7 spaces, one space is left: " self" writes it and more
    rows = m.masks([seven])
    assert rows.shape == (2, index.vocab) and rows[1][self_] and not rows[1][_id(smol, "self")]
    assert m.valid_prefix([seven, self_, _id(smol, ".")]) == 3  # once written, anything goes
    assert m.valid_prefix([self_]) == 0 and m.valid_prefix([seven, _id(smol, "self")]) == 1
    assert m.valid_prefix([seven, seven]) == 2  # 14 spaces begin with 8 too
    assert m.mask_after([seven, self_]).all()
    m.commit([seven])
    assert not m.spent and m.written == 7
    m.commit([self_])
    assert m.spent and m.masks().all() and not m.done
    with pytest.raises(ValueError):
        TextPrefix(index, want).commit([self_])


def test_a_rest_beyond_the_last_byte_value_and_a_word(smol, index):
    m = TextPrefix(index, " e")  # "def e": " e" then "mpty", or " empty" at once
    row = m.masks()[0]
    assert row[_id(smol, " empty")] and row[_id(smol, " e")] and row[_id(smol, " ")] and not row[_id(smol, "e")]
    assert TextPrefix(index, "\u00e9").masks()[0].any()  # a character of two bytes: its byte tokens


def test_the_text_stream_leaves_the_healed_text_out(smol):
    ids = smol.encode_text("        self.maxsize = 1\n")
    ts = TextStream(smol, stop=["= 1"], skip="        s")
    out = ""
    for t in ids:
        out += ts.push([t])
        if ts.stopped:
            break
    assert out + ts.tail() == "elf.maxsize " and ts.ids == ids[: len(ts.ids)] and len(ts.ids) < len(ids)
    short = TextStream(smol, skip="        s")  # max_tokens ended before the healed text was written
    short.push(smol.encode_text("       "))
    short.flush()
    assert short.tail() == ""
