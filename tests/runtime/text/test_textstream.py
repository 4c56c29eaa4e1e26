"""Token chunks -> text (runtime/text/textstream.py, runtime/bundle/tokenizer.py `StreamDecoder`): streaming
detokenization that never shows half a character, and stop strings that cut the text without
retracting anything shown. Tokenizers made by code (torch-free); the pipeline tests run on the
fake backend (tests/fakes.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from fakes import fake_pipeline, write_tokenizer
from specrt.runtime.bundle.manifest import TokenizerInfo
from specrt.runtime.bundle.tokenizer import Tokenizer
from specrt.runtime.text.textstream import TextStream

TEXT = "naïve café — 日本語 🙂🚀 ok"


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    """Word-level: w3 .. w31, decoded with a space between words."""
    folder = tmp_path_factory.mktemp("words")
    return Tokenizer(folder, write_tokenizer(folder))


@pytest.fixture(scope="module")
def bytes_tok(tmp_path_factory):
    """Byte-level BPE trained on ASCII only: every non-ASCII character is 2-4 byte tokens."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("bytes")
    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["hello world, naive cafe ok"] * 10,
                           trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    tk.save(str(folder / "tokenizer.json"))
    return Tokenizer(folder, TokenizerInfo(eos_token_ids=[2]))


def test_stream_decoder_never_splits_a_character(bytes_tok):
    ids = bytes_tok.encode(TEXT, chat=False)
    assert len(ids) > len(TEXT)  # multi-byte characters really span tokens
    s = bytes_tok.stream()
    shown = ""
    for i in range(len(ids)):
        piece = s.push([ids[i]])
        assert "\ufffd" not in piece
        shown += piece
        now = bytes_tok.decode(ids[: i + 1])
        assert now.startswith(shown)
        if not now.endswith("\ufffd"):  # held back only while the last character is incomplete
            assert shown == now
    assert shown + s.flush() == bytes_tok.decode(ids) == TEXT


def test_stream_decoder_chunks_of_any_size(bytes_tok):
    ids = bytes_tok.encode(TEXT, chat=False)
    for size in (2, 3, 5, len(ids)):
        s = bytes_tok.stream()
        pieces = [s.push(ids[i : i + size]) for i in range(0, len(ids), size)]
        assert "".join(pieces) + s.flush() == TEXT and not any("\ufffd" in p for p in pieces)


def _push_all(stream: TextStream, chunks, shown: list[str] | None = None, end: bool = True) -> list[str]:
    """Push chunks until the stream stops (then flush, if the tokens `end` there); -> the pieces
    shown so far, each of which must stay in the final text."""
    shown = [] if shown is None else shown
    for c in chunks:
        shown.append(stream.push(c))
        assert stream.full.startswith("".join(shown))  # nothing shown is ever taken back
        if stream.stopped:
            return shown
    if end:
        stream.flush()
    return shown


@pytest.mark.parametrize("chunks", [[[5], [6], [7], [8], [9]], [[5, 6, 7, 8, 9]], [[5, 6], [7], [8, 9]]])
def test_stop_string_across_tokens_cuts_where_it_begins(words, chunks):
    ts = TextStream(words, stop=["w7 w8"])
    shown = _push_all(ts, chunks)
    assert ts.stopped and ts.full == "w5 w6 "
    assert "".join(shown) + ts.tail() == "w5 w6 "
    assert ts.ids[:4] == [5, 6, 7, 8]


def test_text_that_could_begin_a_stop_string_is_held_then_released(words):
    ts = TextStream(words, stop=["w7 w9"])
    shown = _push_all(ts, [[5], [6], [7]], end=False)
    assert "w7" not in "".join(shown)  # could be the start of "w7 w9": held
    _push_all(ts, [[8], [10]], shown)
    assert not ts.stopped and "".join(shown) + ts.tail() == "w5 w6 w7 w8 w10" == words.decode([5, 6, 7, 8, 10])


def test_earliest_stop_string_wins_and_empty_ones_are_ignored(words):
    ts = TextStream(words, stop=["", "w9", "w6 w7"])
    _push_all(ts, [[5, 6, 7, 8, 9]])
    assert ts.stopped and ts.full == "w5 " and ts.stop == "w6 w7"  # the one that matched (Anthropic's stop_sequence)
    plain = TextStream(words, stop=[""])
    assert plain.push([5, 6]) == "w5 w6" and not plain.stopped and plain.stop is None  # no stop strings: nothing held back


def test_of_two_stop_strings_one_token_completes_the_shorter_matched(words):
    ts = TextStream(words, stop=[" w6", " w"])  # the token " w6" completes both, where both begin
    _push_all(ts, [[5, 6, 7]])
    assert ts.stopped and ts.full == "w5" and ts.stop == " w"


def test_stop_string_ends_the_request_early(tmp_path):
    """Through the pipeline: the text is cut where the stop string begins, the stats say "stop",
    the streamed pieces are the text, and the request was ended then (fewer tokens than a run
    without it). The fake target is slowed to a few ms a call: at the fake's microseconds the
    engine could finish all 40 tokens before the client read the chunk that holds the stop."""
    pipe = fake_pipeline(tmp_path, draft="self")
    real = pipe.parts.target.run
    pipe.parts.target.run = lambda *a, **kw: time.sleep(0.005) or real(*a, **kw)
    try:
        prompt = "<s> w5 w9 w7"
        full = pipe.generate(prompt, max_new_tokens=40, chat=False, ignore_eos=True, k=3)
        words_out = full.text.split()
        stop = " ".join(words_out[6:8])  # two words, first seen after the sixth word
        cut = full.text[: full.text.index(stop)]
        pieces = list(pipe.stream(prompt, max_new_tokens=40, chat=False, ignore_eos=True, k=3, stop=[stop]))
        res = pipe.last
        assert "".join(pieces) == res.text == cut and res.stats.stop_reason == "stop"
        assert res.stats.new_tokens < full.stats.new_tokens and pipe.counters()["running"] == 0
        assert asyncio.run(pipe.agenerate(prompt, max_new_tokens=40, chat=False, ignore_eos=True, k=3,
                                          stop=[stop])).text == cut
    finally:
        pipe.close()


def test_text_of_a_finished_request_is_its_tokens(tmp_path):
    pipe = fake_pipeline(tmp_path, draft="separate")
    try:
        res = pipe.generate("<s> w5 w9 w7", max_new_tokens=25, chat=False, ignore_eos=True, k=4)
        assert res.text == pipe.tokenizer.decode(res.token_ids) and len(res.token_ids) == 25
        assert res.stats.stop_reason == "length"
    finally:
        pipe.close()


def test_a_stop_string_in_a_finished_requests_last_chunk_is_the_outputs_stop_reason_not_the_engines(words):
    """The engine ended the request by length, and its last chunk holds a stop string: the
    output (finish reason, Result) says "stop"; the request's own stats, which the engine owns,
    keep "length" (the text layer writes nothing into the request)."""
    from specrt.runtime.engine import Request, Stats
    from specrt.runtime.sampling.draws import SamplingConfig
    from specrt.runtime.text.output import TextOutput

    def chunks(*cs):  # a generator: TextOutput closes its chunk iterator
        yield from cs

    r = Request([1, 5], SamplingConfig(0.0), max_new_tokens=4, eos_ids=frozenset(), k=0, stats=Stats(stop_reason="length"))
    out = TextOutput(r, chunks([5, 9], [7, 8]), words, stop=["w7"])
    assert "".join(out) == "w5 w9 "
    assert out.stop_reason == "stop" and out.finish_reason() == "stop" and out.stop_sequence == "w7"
    assert out.result().stats.stop_reason == "stop" and r.stats.stop_reason == "length"
    plain = TextOutput(r, chunks([5, 9]), words)
    assert "".join(plain) == "w5 w9" and plain.result().stats is r.stats  # nothing to copy
