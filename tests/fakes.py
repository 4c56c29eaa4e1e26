"""A NumPy fake of the pool-model protocol (runtime/backends/ort.py `OrtModel`), so the engine's
loop, drafters and client calls run in milliseconds without onnxruntime sessions or torch.

The "model" is a table (`Table`), deterministic: the next-token logits at position p are
A[x_p] + B[x_{p-1}] + C[p], a bigram table of the last token plus two terms a cache bug would
change: x_{p-1} is read back from the KV pool (not from the call's input) and p is where the
call writes (the track's length). So a length that was not rewound, or a row left from a
rejected proposal, changes the logits, as in a real model. KV row p of a slot holds the token
at position p plus the writer's `mark` (the target 0, a draft 0.5: an int8 copy's K/V differ
from the target's); a model that finds a row below its track's length that it may not read (a
target reading a draft's row), or one never written, raises `StaleRow` instead of returning
logits. Like `OrtModel`, `run` and `run_rows` return views of one logits buffer that the next
call overwrites. `reference_greedy` is target-only greedy straight from the table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from checks import run_request as _run_request
from checks import submitted
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.backends.protocol import PoolModel
from specrt.runtime.bundle.loader import LoadedModels
from specrt.runtime.bundle.manifest import KVLayout, Manifest, ModelEntry, TokenizerInfo
from specrt.runtime.bundle.tokenizer import Tokenizer

VOCAB = 32
S_MAX = 256  # room for the cost probe's calls at a 128-token context
MAX_T = 9  # widest verification call: k <= 8
EOS = 2
TARGET_MARK, DRAFT_MARK = 0.0, 0.5
SCALES = (2.0, 1.5, 1.0)  # spread of A (last token), B (cached token before it), C (position)


class StaleRow(AssertionError):
    """A fake model found a KV row it must not read below its track's length."""


class Table:
    """logits(x_p, x_{p-1}, p) = A[x_p] + B[x_{p-1}] + C[p]; `prev` = V: no token before."""

    def __init__(self, vocab: int = VOCAB, seed: int = 0, noise: float = 0.0, like: Table | None = None,
                 s_max: int = S_MAX, scales: tuple[float, float, float] = SCALES):
        """noise > 0 with `like`: that table plus Gaussian noise of this scale (a draft that
        agrees with the target often, not always)."""
        g = np.random.default_rng(seed)
        shapes = [(vocab, vocab), (vocab + 1, vocab), (s_max, vocab)]
        if like is None:
            self.A, self.B, self.C = (g.normal(0.0, s, sh).astype(np.float32) for s, sh in zip(scales, shapes, strict=True))
        else:
            self.A, self.B, self.C = ((t + g.normal(0.0, noise, t.shape)).astype(np.float32)
                                      for t in (like.A, like.B, like.C))
        self.vocab = vocab

    def logits(self, tokens, prevs, positions) -> np.ndarray:
        """tokens [T], prevs [T], positions [T] -> float32 [T, V]."""
        return self.A[np.asarray(tokens)] + self.B[np.asarray(prevs)] + self.C[np.asarray(positions)]

    def next_logits(self, seq) -> np.ndarray:
        """[V]: logits after the whole sequence (what a correct cache gives)."""
        return self.logits([seq[-1]], [seq[-2] if len(seq) > 1 else self.vocab], [len(seq) - 1])[0]


def reference_greedy(table: Table, prompt, n: int, eos=()) -> list[int]:
    """Target-only greedy straight from the table: the output every speculative run must give."""
    seq, out = list(prompt), []
    for _ in range(n):
        t = int(table.next_logits(seq).argmax())
        if t in eos:
            break
        seq.append(t)
        out.append(t)
    return out


def new_pool(slots: int, s_max: int = S_MAX) -> KVPool:
    """A pool of one layer, one head, one value per row; NaN marks a row never written."""
    pool = KVPool(KVLayout(layers=1, kv_heads=1, head_dim=1, dtype="float32", max_seq_len=s_max), slots)
    for a in pool.host:
        a.fill(np.nan)
    return pool


def rows(pool: KVPool, slot: int, n: int) -> np.ndarray:
    """The values in rows [0, n) of a slot (token + writer's mark)."""
    return pool.host[0][slot, 0, :n, 0].copy()


class FakeModel(PoolModel):
    """The calls the scheduler makes on a pool model (`run`, `run_rows`) and the attributes it
    reads, over a `Table`. `calls` records (kind, slot or lo, tokens per row, rows)."""

    takes_hidden = False
    has_hidden_out = False
    hidden = None
    hidden_size = 0

    def __init__(self, table: Table, pool: KVPool, track: str, *, mark: float = TARGET_MARK,
                 reads: tuple[float, ...] = (TARGET_MARK,), max_t: int = MAX_T, max_prefill_t: int | None = None,
                 batch_rows: bool = True, one_token_skew: float = 0.0, min_t: int | None = None):
        """reads: the marks this model may find below its length (a self-draft reads the
        target's rows and its own). one_token_skew: a call of one token per sequence (`run` of
        T = 1, every `run_rows` row) adds this much noise to its logits, as an int8-activation
        graph's one-token kernels do (runtime/backends/ort.py `numerics_min_t`); min_t: what the
        model declares (default 2 with a skew, else 1; a test may make it lie)."""
        self.table, self.pool, self.track, self.name = table, pool, pool.track(track), track
        self.mark, self.reads = mark, reads
        self.vocab = table.vocab
        self.max_seq_len = pool.capacity
        self.max_t = max_t
        self.max_prefill_t = max_prefill_t or max_t
        self.batch_rows = batch_rows
        self.kernels = False
        self.min_t = min_t if min_t is not None else (2 if one_token_skew else 1)
        self._skew = one_token_skew * np.random.default_rng(99).standard_normal(self.vocab).astype(np.float32)
        self._logits = np.empty((max(pool.slots, self.max_prefill_t), self.vocab), dtype=np.float32)
        self.calls: list[tuple[str, int, int, int]] = []

    def _forward(self, slot: int, tokens: np.ndarray, past: int) -> np.ndarray:
        """Write the tokens' rows, then read the rows before each of them (GQA writes, then
        attends). -> logits [T, V] (a new array)."""
        kv = self.pool.host[0][slot, 0, :, 0]
        T = len(tokens)
        if past + T > self.max_seq_len:
            raise ValueError(f"{self.name}: {T} tokens at {past} exceed S_max {self.max_seq_len}")
        live = past == self.pool.length(self.track, slot) and slot in self.pool.in_use()
        if live and past:  # a call of the engine's at this track's length: its rows must be valid
            below = kv[:past]
            if np.isnan(below).any():
                raise StaleRow(f"{self.name} slot {slot}: row {int(np.flatnonzero(np.isnan(below))[0])} "
                               f"below length {past} was never written")
            marks = below - np.floor(below)
            bad = ~np.isin(marks, self.reads)
            if bad.any():
                raise StaleRow(f"{self.name} slot {slot}: row {int(np.flatnonzero(bad)[0])} below length {past} "
                               f"was written by another model (mark {marks[bad][0]})")
        kv[past : past + T] = tokens + self.mark
        prev = kv[max(0, past - 1) : past + T - 1]
        if not live:  # a cost probe's call may read rows never written
            prev = np.where(np.isnan(prev), self.vocab, prev)
        prev = prev.astype(np.int64)  # drops the writer's mark
        if past == 0:
            prev = np.concatenate(([self.vocab], prev))
        return self.table.logits(tokens, prev, np.arange(past, past + T))

    def run(self, slot: int, tokens, past_len: int, hidden=None, keep=None) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        if not 0 < T <= self.max_prefill_t:
            raise ValueError(f"{self.name}: a call takes 1..{self.max_prefill_t} tokens, got {T}")
        self.calls.append(("run", slot, T, 1))
        n = T if keep is None else max(1, min(keep, T))
        self._logits[:n] = self._forward(slot, tokens, past_len)[-n:] + (self._skew if T == 1 else 0)
        return self._logits[:n]

    def run_rows(self, lo: int, tokens, pasts, hidden=None) -> np.ndarray:
        b = len(tokens)
        if not self.batch_rows and b > 1:
            raise ValueError(f"{self.name}: this graph's lowering runs one sequence per call")
        self.calls.append(("rows", lo, 1, b))
        for j in range(b):
            self._logits[j] = self._forward(lo + j, np.asarray(tokens[j : j + 1], dtype=np.int64), int(pasts[j]))[0]
        self._logits[:b] += self._skew
        return self._logits[:b]


def write_tokenizer(folder: Path, vocab: int = VOCAB) -> TokenizerInfo:
    """A word-level tokenizer over `vocab` words (<unk> <s> </s> w3 w4 ...), torch-free."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    words = {"<unk>": 0, "<s>": 1, "</s>": EOS, **{f"w{i}": i for i in range(3, vocab)}}
    tk = HFTokenizer(models.WordLevel(words, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(["<unk>", "<s>", "</s>"])
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    return TokenizerInfo(bos_token_id=1, eos_token_ids=[EOS], pad_token_id=0)


JSON_CHARS = [*'{}[]":,', "\u0120", *"0123456789", *"abceflnrstu"]  # \u0120: byte-level space


def write_json_tokenizer(folder: Path) -> TokenizerInfo:
    """A byte-level tokenizer of 32 one-character tokens (<unk> <s> </s>, JSON punctuation, space,
    digits, the letters of true / false / null and a few words): what a grammar engine needs to
    know each token's bytes, over the fake's vocabulary."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": EOS}
    for c in JSON_CHARS:
        vocab[c] = len(vocab)
    assert len(vocab) == VOCAB, len(vocab)
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<unk>", "<s>", "</s>"])
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    return TokenizerInfo(bos_token_id=1, eos_token_ids=[EOS], pad_token_id=0)


def fake_parts(folder: Path, *, draft: str | None = "self", slots: int = 4, seed: int = 0, noise: float = 0.3,
               max_t: int = MAX_T, max_prefill_t: int = 16, batch_rows: bool = True, json_tokens: bool = False,
               tokens=None, one_token_skew: float = 0.0, min_t: int | None = None,
               draft_vocab=None) -> LoadedModels:
    """LoadedModels (runtime/bundle/loader.py) over fake models. draft: "self" (a second track on the
    target's pool, as a self-int8 draft), "separate" (a pool of its own, as another model) or
    None. The draft is the target's table plus noise: it agrees often, not always.
    json_tokens: a tokenizer of JSON characters (grammar tests) instead of words. tokens: a
    tokenizer of one's own, (vocab size, write(folder) -> TokenizerInfo) (tool-call tests).
    one_token_skew, min_t: the target's (FakeModel); the draft never skews. draft_vocab: the ids a
    vocabulary-subset draft head keeps (export/vocab_subset.py): its logits are -inf elsewhere."""
    vocab, write = tokens or (VOCAB, write_json_tokenizer if json_tokens else write_tokenizer)
    table = Table(vocab=vocab, seed=seed)
    pool = new_pool(slots)
    kw = dict(max_t=max_t, max_prefill_t=max_prefill_t, batch_rows=batch_rows)
    target = FakeModel(table, pool, "target", one_token_skew=one_token_skew, min_t=min_t, **kw)
    d = None
    if draft is not None:
        dtable = Table(vocab=vocab, seed=seed + 1, noise=noise, like=table)
        if draft_vocab is not None:
            outside = np.ones(vocab, dtype=bool)
            outside[np.asarray(draft_vocab)] = False
            dtable.C[:, outside] = -np.inf
        if draft == "self":
            d = FakeModel(dtable, pool, "draft", mark=DRAFT_MARK, reads=(TARGET_MARK, DRAFT_MARK), **kw)
        elif draft == "separate":
            d = FakeModel(dtable, new_pool(slots), "draft", mark=DRAFT_MARK, reads=(DRAFT_MARK,), **kw)
        else:
            raise ValueError(draft)
    kv = pool.layout
    entry = dict(vocab_size=vocab, max_tokens_per_call=max_t, kv=kv, lowering="ort" if batch_rows else "standard")
    man = Manifest(name="fake", target=ModelEntry(graph="target.onnx", **entry),
                   draft=None if d is None else ModelEntry(graph="draft.onnx", recipe="self-int8" if draft == "self"
                                                           else "model", **entry),
                   tokenizer=write(folder))
    return LoadedModels(folder, man, Tokenizer(folder, man.tokenizer), target, d, False, draft == "self", None, "cpu")


def constrained_reference(pipe, constraint, prompt, n, cfg=None, rng=None):
    """Target-only decoding under the grammar straight from the fake's table: at each position
    the row is masked by the grammar after the tokens so far."""
    from specrt.runtime.sampling.draws import probs
    from specrt.runtime.sampling.grammar import apply_mask

    g = pipe.grammars
    m = g.matcher(g.compile(constraint))
    seq, out = list(prompt), []
    for _ in range(n):
        row = apply_mask(pipe.parts.target.table.next_logits(seq)[None], m.masks())[0]
        t = int(row.argmax()) if cfg is None else int(rng.choice(len(row), p=probs(row, cfg)))
        if t == EOS:
            break
        m.commit([t])
        seq.append(t)
        out.append(t)
        if m.done:
            break
    return out


def fake_pipeline(folder: Path, *, costs=None, plan_batches: bool = True, adaptive: bool | None = False,
                  prefix_cache: bool = True, **kw):
    """A Pipeline (runtime/pipeline.py) over `fake_parts(folder, **kw)`. costs: what adaptive k
    starts from (default: drafting cheap against verifying, so adaptive requests draft); the
    fake's own call times are microseconds and say nothing about a real pair. adaptive: the
    pipeline's default (False: tests ask per request; None: the library's own default)."""
    from specrt.runtime.pipeline import Pipeline
    from specrt.runtime.policy.adaptive import Costs

    parts = fake_parts(folder, **kw)
    pipe = Pipeline(folder, parts=parts, hugepages=False, cost_cache=False, max_batch=parts.target.pool.slots,
                    plan_batches=plan_batches, adaptive=adaptive, prefix_cache=prefix_cache)
    pipe.store._costs = costs or Costs({1: 10.0, 2: 10.2, 5: 10.8, 9: 11.6}, draft_ms=0.5,
                                       rows_ms={1: 10.0, 2: 10.5, 4: 11.5})
    return pipe


def run_request(pipe, prompt, on_tokens=None, **kw):
    """conftest.run_request with the fake's bound: its requests take milliseconds."""
    return _run_request(pipe, prompt, on_tokens, wait_s=30, **kw)


def drive(pipe, requests) -> list[list[int]]:
    """Run checked requests (`pipe.request(...)`) to the end by calling the scheduler's steps
    from this thread (the engine thread never starts): as many decode together as there are
    slots. -> each request's tokens; a request that ended with an error raises it."""
    from collections import deque

    out = {r.id: [] for r in requests}
    errors = []

    def sink_for(r):
        def sink(kind, value):
            if kind == "tokens":
                out[r.id].extend(value)
            elif kind == "error":
                errors.append(value)
        return sink

    for r in requests:
        r.sink = sink_for(r)
    if any(r.adaptive for r in requests):
        pipe.use_costs()  # what the engine does before the first adaptive request
    waiting = deque(submitted(*requests))
    sched = pipe.scheduler
    while waiting or sched.running or sched.deferred:
        sched.step(lambda: waiting.popleft() if waiting else None)
        if errors:
            raise errors[0]
    return [out[r.id] for r in requests]
