"""The C API's tokenizer (cpp/src/tokenizer.cc) against Hugging Face tokenizers, string for
string: the default bundle's tokenizer.json (GPT-2 style ByteLevel) and byte-level BPE
tokenizers built here with Qwen2's (NFC, Split + ByteLevel) and Llama-3's (ignore_merges, a BOS
post-processor) settings, over code, prose, non-Latin text, emoji, whitespace runs, special
tokens and random strings; decoding of random ids (byte tokens that cut characters) and the
streaming decoder (runtime/bundle/tokenizer.py `StreamDecoder`, one id at a time)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from cpp_build import compile_program
from paths import DEFAULT_BUNDLE
from specrt.runtime.bundle.manifest import TokenizerInfo
from specrt.runtime.bundle.tokenizer import Tokenizer as RuntimeTokenizer

HERE = Path(__file__).resolve().parent
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
          r"\s+(?!\S)|\s+")

STRINGS = [
    "Hello, world!", "Explain KV caches in two sentences.", "I'm sure they'll say it's fine; WE'LL SEE, DON'T you THINK?",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }\r\n",
    "    indented\n        more\n  \n", "a  b   c    d\t\te\n\n\nf", " leading space", "trailing space ", "   ", "\n", "",
    "12345678901234567890 3.14159 -42 1e-9 0x1F", "价格是 12 元，谢谢！我们明天见。", "Привет, как дела? Всё хорошо.",
    "مرحبا بالعالم", "नमस्ते दुनिया", "日本語のテキストとカタカナ、ひらがな。", "한국어 문장입니다.",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇯🇵 ❤️ keycap 1️⃣", "café café naïve Å Å", "e\u0301 o\u0308 n\u0303 (decomposed)",
    "nbsp\u00a0here, ideographic\u3000space, line\u2028sep, zero\u200bwidth", "tab\tand\u000bvertical\u000cform",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> inside and <|im_end|><|im_end|> twice", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|im_start|", "a<|im_start|>b", "x" * 300, "ab" * 150, "!!!???...,,,;;;", "\U0001F600" * 5 + "\u00e9" * 5,
    "mixed 中文 and English, 数字 123 and emoji 🎉!", "https://example.com/path?q=1&r=2#frag", "C:\\Users\\me\\file.txt",
]


def random_strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x17F), (0x300, 0x36F), (0x400, 0x4FF), (0x4E00, 0x4FFF),
              (0x3040, 0x30FF), (0x1F300, 0x1F64F), (0x2000, 0x206F), (0x600, 0x6FF)]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))
    return out


def byte_bpe(path: Path, pattern: str, *, nfc: bool, ignore_merges: bool, bos: bool) -> Path:
    """A byte-level BPE tokenizer trained here on the test strings, with one family's settings."""
    tk = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials, show_progress=False)
    tk.train_from_iterator(STRINGS * 3 + random_strings(200, 1), trainer)
    if bos:
        tk.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tk.token_to_id("<|begin_of_text|>"))])
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    tk.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizers_(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tokenizers")
    return {"default": DEFAULT_BUNDLE / "tokenizer.json",
            "qwen2": byte_bpe(base / "qwen2.json", QWEN2, nfc=True, ignore_merges=False, bos=False),
            "llama3": byte_bpe(base / "llama3.json", LLAMA3, nfc=False, ignore_merges=True, bos=True)}


@pytest.fixture(scope="module")
def exe(tmp_path_factory) -> Path:
    return compile_program(HERE / "tokenize_lines.cc", tmp_path_factory.mktemp("tok") / "tokenize_lines")


def run_lines(exe: Path, path: Path, lines: list[str]) -> list[list[str]]:
    r = subprocess.run([str(exe), str(path)], input="".join(line + "\n" for line in lines), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return [row.split("\t") for row in r.stdout.split("\n")[:-1]]


def ids(field: str) -> list[int]:
    return [int(t) for t in field.split(",")] if field else []


def text(field: str) -> str:
    return bytes.fromhex(field).decode("utf-8")


@pytest.mark.parametrize("name", ["default", "qwen2", "llama3"])
def test_encode_and_decode_as_hugging_face(tokenizers_, exe, name):
    path = tokenizers_[name]
    hf = Tokenizer.from_file(str(path))
    runtime = RuntimeTokenizer(path.parent, TokenizerInfo(file=path.name))
    strings = STRINGS + random_strings(300, 2)
    rows = run_lines(exe, path, [s.encode().hex() for s in strings])
    assert len(rows) == len(strings)
    for s, (parsed, plain, added, dec, dec_skip, streamed) in zip(strings, rows, strict=True):
        want = hf.encode(s, add_special_tokens=False).ids
        assert ids(parsed) == want, s
        assert ids(plain) == runtime.encode_text(s), s  # special-token strings stay text
        assert ids(added) == hf.encode(s, add_special_tokens=True).ids, s
        assert text(dec) == hf.decode(want, skip_special_tokens=False), s
        assert text(dec_skip) == hf.decode(want, skip_special_tokens=True), s
        assert text(streamed) == hf.decode(want, skip_special_tokens=True), s


@pytest.mark.parametrize("name", ["default", "qwen2"])
def test_decode_random_ids_as_hugging_face(tokenizers_, exe, name):
    """Random ids, byte tokens among them (characters cut between tokens: U+FFFD where the bytes
    are not UTF-8), special tokens included; the streaming decoder against the Python runtime's."""
    path = tokenizers_[name]
    hf = Tokenizer.from_file(str(path))
    runtime = RuntimeTokenizer(path.parent, TokenizerInfo(file=path.name))
    rng = random.Random(3)
    vocab = hf.get_vocab_size()
    seqs = [[rng.randrange(vocab) if rng.random() < 0.7 else rng.randrange(260) for _ in range(rng.randint(1, 30))]
            for _ in range(300)]
    rows = run_lines(exe, path, ["ids:" + ",".join(map(str, s)) for s in seqs])
    for seq, (_, _, _, dec, dec_skip, streamed) in zip(seqs, rows, strict=True):
        assert text(dec) == hf.decode(seq, skip_special_tokens=False), seq
        assert text(dec_skip) == hf.decode(seq, skip_special_tokens=True), seq
        stream = runtime.stream()
        want = "".join(stream.push([t]) for t in seq) + stream.flush()
        assert text(streamed) == want, seq


def test_other_tokenizer_kinds_are_refused(tmp_path, exe):
    """A WordPiece tokenizer (not byte-level BPE): SPECRT_ERR_UNSUPPORTED with a message, at open."""
    tk = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tk.save(str(tmp_path / "wp.json"))
    r = subprocess.run([str(exe), str(tmp_path / "wp.json")], input="", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "SPECRT_ERR_UNSUPPORTED" in r.stderr and "WordPiece" in r.stderr, r.stderr
