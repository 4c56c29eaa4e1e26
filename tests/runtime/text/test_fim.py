"""The FIM prompt layout (runtime/text/fim.py) per source of FIM tokens, user text tokenized as
text, and the editor stops (n_indent, the time budget) on a real BPE tokenizer."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from specrt.runtime.bundle.manifest import FimTokens, TokenizerInfo, load_manifest
from specrt.runtime.bundle.tokenizer import Tokenizer, find_fim_tokens
from specrt.runtime.text.fim import EditorText, ExtraFile, FimWindow, NoFim, fim_parts
from specrt.runtime.text.textstream import TextStream
from tiny import FIM, tiny_tokenizer

P, M, S, PAD, REPO, SEP = (122 + FIM.index(t) for t in FIM)  # the tiny FIM tokenizer's ids


@pytest.fixture(scope="module")
def fim_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fimtok")
    tiny_tokenizer(fim=True).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_fim(fim_folder):
    """The tiny word-level tokenizer with Qwen's FIM tokens, as a bundle's tokenizer whose
    manifest did not record them (found in the vocabulary)."""
    return Tokenizer(fim_folder, TokenizerInfo())


def test_fim_tokens_are_found_in_the_vocabulary_or_taken_from_the_manifest(tiny_fim, fim_folder, default_bundle):
    assert tiny_fim.fim == FimTokens(prefix=P, suffix=S, middle=M, pad=PAD, repo_name=REPO, file_sep=SEP)
    assert find_fim_tokens({"<fim_prefix>": 7, "<fim_suffix>": 8, "<fim_middle>": 9}).usable  # StarCoder's names
    # SmolLM2 (the default bundle) has StarCoder's file tokens but no prefix/suffix/middle
    smol = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    assert smol.fim.repo_name == 3 and smol.fim.file_sep == 5 and not smol.fim.usable
    with pytest.raises(NoFim) as e:
        fim_parts(smol, "def f(", ")", field="input_prefix")
    assert e.value.param == "input_prefix"
    # a recorded entry wins over the vocabulary (recorded: nothing)
    recorded = Tokenizer(fim_folder, TokenizerInfo(fim=FimTokens()))
    assert not recorded.fim.usable


def test_layout_plain_and_repo_level(tiny_fim):
    enc = tiny_fim.encode_text
    parts = fim_parts(tiny_fim, "w10 w11\nw12 w13", "w14\nw15")
    # whole lines of the prefix after <|fim_prefix|>, the cursor's line after <|fim_middle|>
    assert parts.ids == [P, 10, 11, S, 14, 15, M, 12, 13]
    extra = [ExtraFile("a.py", "w20 w21"), ExtraFile("b.py", "w22")]
    parts = fim_parts(tiny_fim, "w10\n", "w14", extra, path="c.py")
    assert parts.ids == ([REPO] + enc("project\n") + [SEP] + enc("a.py\nw20 w21") + [SEP] + enc("b.py\nw22")
                         + [SEP] + enc("c.py\n") + [P, 10, S, 14, M])
    # a keystroke on the cursor's line changes only the tokens after <|fim_middle|>
    a, b = (fim_parts(tiny_fim, p, "w14", extra, heal=False).ids for p in ("w10\nw12", "w10\nw12 w13"))
    assert b[: len(a)] == a and b[len(a):] == [13]


def test_literal_fim_strings_in_user_text_stay_text(tiny_fim, default_bundle):
    ids = fim_parts(tiny_fim, "w10 <|fim_middle|>\n<|fim_prefix|>", "<|fim_suffix|> w14").ids
    assert ids == [P, 10, 0, S, 0, 14, M, 0]  # each literal is a word this vocabulary lacks: <unk>
    assert tiny_fim.tk.encode("w10 <|fim_middle|>", add_special_tokens=False).ids == [10, M]  # what parsing gives
    # a real byte-level BPE tokenizer (SmolLM2): special and added tokens stay characters; text
    # without them gets exactly the tokenizer's own ids
    smol = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    code = "def f(x):\n    return '<|im_start|>' + x  # <file_sep>\n"
    ids = smol.encode_text(code)
    assert 1 not in ids and 5 not in ids and smol.tk.decode(ids) == code
    plain = "def f(x):\n    return x * 2  # ok\n\tpass\n"
    assert smol.encode_text(plain) == smol.tk.encode(plain, add_special_tokens=False).ids


def test_fit_trims_extra_files_then_prefix_then_suffix(tiny_fim):
    parts = fim_parts(tiny_fim, "w10 w11 w12\nw13", "w14 w15 w16", [ExtraFile("a", "w20 w21")])
    n = len(parts.ids)
    assert parts.fit(n) is parts
    cut = parts.fit(n - len(parts.extra))
    assert cut.extra == [] and cut.prefix == parts.prefix and cut.suffix == parts.suffix
    cut = parts.fit(n - len(parts.extra) - 2)
    assert cut.prefix == [P, 12] and cut.suffix == parts.suffix and cut.middle == parts.middle
    cut = parts.fit(len(parts.middle) + 2)
    assert cut.prefix == [P] and cut.suffix == [S] and cut.middle == parts.middle
    with pytest.raises(ValueError):
        parts.fit(len(parts.middle) + 1)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _run(tok, text: str, clock=None, per_push=1, **kw) -> tuple[str, str, EditorText]:
    """Push text's tokens in chunks of per_push -> (what was streamed, the whole text, the stream)."""
    ids = tok.encode_text(text)
    ed = EditorText(TextStream(tok, kw.pop("stop", None)), clock=clock or Clock(), **kw)
    streamed = ""
    for i in range(0, len(ids), per_push):
        streamed += ed.push(ids[i : i + per_push])
        if ed.stopped:
            break
    else:
        ed.flush()
    rest = ed.tail()
    return streamed, streamed + rest, ed


CODE = "x = 1\n        y = 2\n        if y:\n            z = 3\n    return z\nprint(1)\n"


@pytest.mark.parametrize("per_push", [1, 3, 100])  # a speculative round commits several tokens at once
def test_n_indent_ends_before_a_line_indented_less(default_bundle, per_push):
    tok = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    streamed, whole, ed = _run(tok, CODE, per_push=per_push, n_indent=8)
    assert whole == "x = 1\n        y = 2\n        if y:\n            z = 3"
    assert ed.stopped and whole.startswith(streamed)  # nothing streamed was taken back
    assert tok.decode(ed.ids).startswith(whole + "\n    ")  # ids end at the token that showed the line
    assert len(ed.ids) < len(tok.encode_text(CODE))
    streamed, whole, ed = _run(tok, CODE, per_push=per_push)  # n_indent 0: no cut
    assert whole == CODE and not ed.stopped


def test_time_budget_ends_at_the_next_line_break(default_bundle):
    tok = Tokenizer(default_bundle, load_manifest(default_bundle).tokenizer)
    clock = Clock()
    ids = tok.encode_text(CODE)
    ed = EditorText(TextStream(tok), t_max_s=0.5, clock=clock)
    out = ed.push(ids[:2])  # "x =": the budget starts at the first token
    clock.t = 1.0
    for t in ids[2:]:
        out += ed.push([t])
        if ed.stopped:
            break
    assert ed.stopped and out + ed.tail() == "x = 1"
    # within its budget nothing is cut; stop strings still apply
    streamed, whole, ed = _run(tok, CODE, t_max_s=5.0, stop=["if"])
    assert whole == "x = 1\n        y = 2\n        " and ed.stopped


def test_manifest_round_trips_the_fim_entry(tmp_path):
    from specrt.runtime.bundle.manifest import Manifest, manifest_from_dict

    m = Manifest(tokenizer=TokenizerInfo(fim=FimTokens(prefix=1, suffix=2, middle=3)))
    back = manifest_from_dict(json.loads(m.to_json()))
    assert back.tokenizer.fim == FimTokens(prefix=1, suffix=2, middle=3)
    assert manifest_from_dict({"schema_version": 2, "tokenizer": {}}).tokenizer.fim is None  # older bundles
    assert dataclasses.asdict(back)["tokenizer"]["fim"]["pad"] is None


def _words(text: str) -> list[str]:
    """A toy tokenizer for the window's arithmetic: each word a token, each line break one."""
    return re.findall(r"\S+|\n", text)


def _starts(ids: list[str]) -> list[int]:
    return [i + 1 for i, t in enumerate(ids) if t == "\n"]


def test_window_keeps_whole_lines_near_the_cursor_from_a_stable_start():
    w = FimWindow(prefix=10, suffix=4, step=4)
    text = "".join(f"a{i} b{i} c{i} d{i}\n" for i in range(6))  # 6 lines of 5 tokens: lines start at 0, 5, 10, ...

    def cut(n_lines):
        t = "".join(text.splitlines(keepends=True)[:n_lines])
        return w.cut_prefix(t, _words(t), _starts(_words(t)), _words)

    assert cut(2) == _words(text)[:10]  # fits: all of it
    # 30 tokens: over by 20 -> a start at 20 (a multiple of 4) -> the line starting there: line 4
    assert cut(6) == _words(text)[20:]
    # 25 -> over by 15 -> 16 -> the next line start: 20 (line 4); 20 -> 10 -> 12 -> line 3
    assert cut(5) == _words(text)[20:25] and cut(4) == _words(text)[15:20]
    # a cursor moving down a line keeps the start while it stays within a step
    w8 = FimWindow(prefix=17, suffix=4, step=16)
    t5 = "".join(text.splitlines(keepends=True)[:5])
    a = w8.cut_prefix(t5, _words(t5), _starts(_words(t5)), _words)
    b = w8.cut_prefix(text, _words(text), _starts(_words(text)), _words)
    assert a[0] == b[0] == "a4" and b[: len(a)] == a
    # no line starts after the start: cut at the token
    long = " ".join(f"x{i}" for i in range(13)) + "\n"
    assert w.cut_prefix(long, _words(long), _starts(_words(long)), _words) == _words(long)[4:]
    # the suffix: whole lines within the budget, else the first line cut at the token
    assert w.cut_suffix(text, _words(text), _starts(_words(text)), _words) == _words(text)[:4]
    w12 = FimWindow(prefix=10, suffix=12, step=4)
    assert w12.cut_suffix(text, _words(text), _starts(_words(text)), _words) == _words(text)[:10]
    assert FimWindow.parse("none") is None and FimWindow.parse("1536,512") == FimWindow(1536, 512, 256)
    assert FimWindow.parse("100,20") == FimWindow(100, 20, 100)
    for bad in ("1536", "0,10", "a,b", "10,-1"):
        with pytest.raises(ValueError):
            FimWindow.parse(bad)


@pytest.fixture(scope="module")
def bpe_fim(default_bundle):
    """SmolLM2's byte-level BPE tokenizer (the default bundle) with three of its ids recorded as
    FIM tokens: a real tokenizer whose line breaks are tokens of their own or inside others."""
    info = dataclasses.replace(load_manifest(default_bundle).tokenizer, fim=FimTokens(prefix=1, suffix=2, middle=3))
    return Tokenizer(default_bundle, info)


def _code(n_lines: int) -> list[str]:
    return [f"    value_{i} = compute(items[{i}], scale={i % 7})  # step {i}\n" for i in range(n_lines)]


def test_a_windowed_prompt_keeps_lines_near_the_cursor_and_its_cache_as_the_cursor_moves(bpe_fim):
    w = FimWindow(prefix=600, suffix=100, step=512)
    lines = _code(120)
    whole = fim_parts(bpe_fim, "".join(lines[:80]), "".join(lines[80:]))
    parts = fim_parts(bpe_fim, "".join(lines[:80]), "".join(lines[80:]), window=w)
    pre, suf = bpe_fim.tk.decode(parts.prefix[1:]), bpe_fim.tk.decode(parts.suffix[1:])
    assert w.prefix - w.step - 40 < len(parts.prefix) - 1 <= w.prefix and len(parts.suffix) - 1 <= w.suffix
    assert pre in "".join(lines[:80]) and pre.startswith("    value_") and pre.endswith("\n")  # whole lines
    assert "".join(lines[80:]).startswith(suf) and suf.endswith("\n") and len(suf) > 0
    assert parts.left_out == len(whole.ids) - len(parts.ids) > 0
    assert parts.middle == whole.middle
    # the cursor two lines further down: the same start, so every row up to the old cursor is
    # cached (but the last line break's, which BPE merges with the next line's indentation)
    moved = fim_parts(bpe_fim, "".join(lines[:82]), "".join(lines[82:]), window=w)
    assert moved.prefix[: len(parts.prefix) - 1] == parts.prefix[:-1]
    # a keystroke on the cursor's line: only the middle changes
    typed = fim_parts(bpe_fim, "".join(lines[:80]) + "    val", "".join(lines[80:]), window=w)
    assert typed.prefix == parts.prefix and typed.suffix == parts.suffix and typed.middle != parts.middle
    # no window, or a file inside it: the whole file
    assert fim_parts(bpe_fim, "".join(lines[:5]), "".join(lines[5:8]), window=w) == \
        fim_parts(bpe_fim, "".join(lines[:5]), "".join(lines[5:8]))


def test_the_cursor_lines_last_token_is_healed_on_a_byte_level_vocabulary(bpe_fim, tiny_fim):
    enc = bpe_fim.encode_text
    for typed, heal in (("        ", "        "), ("        s", " s"), ("    def e", " e"), ("x = f(", "(")):
        parts = fim_parts(bpe_fim, "a = 1\n" + typed, "\nb = 2\n")
        assert parts.heal == heal and parts.middle == [3] + enc(typed)[:-1], typed
        assert fim_parts(bpe_fim, "a = 1\n" + typed, "\nb = 2\n", heal=False).middle == [3] + enc(typed)
    assert fim_parts(bpe_fim, "a = 1\n", "b").heal == ""  # nothing typed: nothing to heal
    # a last token that holds part of a character takes the token before it too: the healed
    # text is whole characters
    typed = "    s = '\u4e2d\u6587\u5b57"
    parts = fim_parts(bpe_fim, typed, "")
    assert parts.heal and typed.endswith(parts.heal) and bpe_fim.tk.decode(parts.middle[1:]) + parts.heal == typed
    assert fim_parts(tiny_fim, "w10\nw12", "w14").heal == ""  # whole-word tokens: nothing to heal
