"""Fixtures: tiny random-weight models made by code (one per supported family), their bundles,
and the real default bundle built by `make export`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))  # the research scripts run as files (tests/tools)
DEFAULT_BUNDLE = Path(os.environ.get("SPECRT_TEST_BUNDLE", ROOT / "engines" / "default"))
VOCAB = 128

CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)


def tiny_config(family: str, seed_std: float = 0.3):
    """A 2-layer config of each family; larger init std gives decisive (non-tied) greedy logits."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  initializer_range=seed_std, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        return tf.LlamaConfig(**common, tie_word_embeddings=True)
    if family == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return tf.Qwen2Config(**common)
    if family == "qwen3":
        return tf.Qwen3Config(**common)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**common, sliding_window=8, query_pre_attn_scalar=16,
                                   layer_types=["sliding_attention", "full_attention"])
    raise ValueError(family)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3"]


def tiny_model(family: str, seed: int = 0):
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_config(family)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


def tiny_tokenizer(shift: int = 0):
    """Word-level tokenizer over VOCAB tokens; `shift` renames words (a different vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, VOCAB):
        vocab[f"w{i + shift}"] = i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tiny(folder: Path, family: str = "llama", seed: int = 0, shift: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tiny_model(family, seed).save_pretrained(folder)
    tiny_tokenizer(shift).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """HF folders: target, a random-weights draft (same vocab), and a draft with another vocab."""
    base = tmp_path_factory.mktemp("tiny")
    return {
        "target": save_tiny(base / "target", seed=0),
        "bad_draft": save_tiny(base / "bad_draft", seed=1),
        "other_vocab": save_tiny(base / "other_vocab", seed=2, shift=1000),
    }


def tiny_head(target_dir: Path, out: Path, seed: int = 0) -> Path:
    """An untrained EAGLE head for the tiny target (its starting point: the target's last layer),
    with its fc nudged off the identity so the head is not a copy of anything."""
    import torch
    import transformers as tf

    from specrt.export.eagle import head_module, save_head

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = head_module(model)
    with torch.no_grad():
        head.fc.weight.add_(0.05 * torch.randn_like(head.fc.weight))
    return save_head(head, out, target_sha256="", config=model.config)


@pytest.fixture(scope="session", autouse=True)
def _private_cost_cache(tmp_path_factory):
    """Cost probes (runtime/cost_cache.py) go to a temporary folder, never to ~/.cache; the CLI
    subprocesses inherit it."""
    old = os.environ.get("SPECRT_CACHE_DIR")
    os.environ["SPECRT_CACHE_DIR"] = str(tmp_path_factory.mktemp("specrt-cache"))
    yield
    if old is None:
        os.environ.pop("SPECRT_CACHE_DIR", None)
    else:
        os.environ["SPECRT_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tiny_bundles(tiny_dirs, tmp_path_factory):
    """Bundles over the tiny target: good draft (the same model), bad draft, self-int4, self-int8, none, and an
    (untrained) EAGLE head."""
    from specrt.export import export_bundle

    base = tmp_path_factory.mktemp("bundles")
    t = str(tiny_dirs["target"])
    kw = dict(max_seq_len=256, max_draft_tokens=8, echo=None)
    drafts = {"good": t, "bad": str(tiny_dirs["bad_draft"]), "int4": "self-int4", "int8": "self-int8", "none": "none",
              "eagle": "eagle:" + str(tiny_head(tiny_dirs["target"], base / "head.safetensors"))}
    for name, draft in drafts.items():
        export_bundle(t, base / name, draft=draft, **kw)
    return {name: base / name for name in drafts}


@pytest.fixture(scope="session")
def default_bundle():
    if not (DEFAULT_BUNDLE / "specrt.json").is_file():
        pytest.fail(f"the default bundle {DEFAULT_BUNDLE} is missing: run `make export` first "
                    "(`make test` does it)")
    return DEFAULT_BUNDLE


def assert_same_greedy(got: list[int], want: list[int], margins=None, tie: float = 1e-4):
    """Token-for-token equality; a difference is only tolerated at a near-tie (reference top-2
    logit margin below `tie` at the first differing position) and the test says so."""
    n = min(len(got), len(want))
    for i in range(n):
        if got[i] != want[i]:
            assert margins is not None and margins[i] < tie, (
                f"greedy outputs differ at token {i}: {got[i]} vs {want[i]} "
                f"(margin {None if margins is None else margins[i]}); not a near-tie"
            )
            return i
    assert len(got) == len(want), f"lengths differ: {len(got)} vs {len(want)}"
    return None


def assert_follows(counts, exact, n: int) -> None:
    """Sampled token counts [V] from n draws follow the distribution `exact` [V]: chi-square
    (expected counts under 5 pooled into one cell), p > 1e-3."""
    from scipy import stats as sps

    e = exact * n
    big = e >= 5
    obs, exp = np.append(counts[big], counts[~big].sum()), np.append(e[big], e[~big].sum())
    keep = exp > 0
    assert sps.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue > 1e-3


def run_request(pipe, prompt, on_tokens=None, *, wait_s: float = 120, **kw):
    """One request through the pipeline's engine; on_tokens(request) runs on the engine thread
    at each committed chunk, while the request's slot and KV tracks are live.
    -> (tokens, Stats); a request that ends with an error raises it, and so does a failing hook.
    wait_s: the longest wait for the next event."""
    import queue

    r = pipe.request(prompt, **kw)
    events: queue.SimpleQueue = queue.SimpleQueue()
    failed: list[Exception] = []  # a hook's failure, re-raised here (the engine would cancel the request)

    def sink(kind, value):
        if kind == "tokens" and on_tokens is not None and not failed:
            try:
                on_tokens(r)
            except Exception as e:  # noqa: BLE001
                failed.append(e)
        events.put((kind, value))

    r.sink = sink
    pipe.engine.submit(r)
    out = []
    while True:
        kind, value = events.get(timeout=wait_s)
        if kind == "tokens":
            out += value
        elif kind == "logprobs":
            r.token_logprobs.extend(value)
        elif kind == "error":
            raise value
        elif failed:
            raise failed[0]
        else:
            return out, value


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.fixture
def make(tmp_path):
    """make(**kw) -> a fake pipeline (tests/fakes.py `fake_pipeline`), closed after the test.
    Each test builds its own, so nothing adaptive k learns in one test reaches another."""
    from fakes import fake_pipeline

    made = []

    def make(**kw):
        made.append(fake_pipeline(tmp_path / f"p{len(made)}", **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def second_token_dist(pipe, prompt, cfg, prepack: bool = True):
    """Exact target distribution of the 2nd new token: sum_x p(x) p(. | x), via the target graph
    (a session of its own: the pipeline's pool stays the engine's). cfg: a SamplingConfig.
    prepack=False: that second session without prepacking (a big target: half its load peak)."""
    from specrt.runtime.backends.ort import OrtBackend
    from specrt.runtime.decoder import Decoder
    from specrt.runtime.sampling import probs

    man = pipe.manifest
    dec = Decoder(OrtBackend(pipe.folder / man.target.graph, man.target, prepack=prepack))
    p1 = probs(dec.prefill(prompt), cfg)
    base = dec.length
    total = np.zeros_like(p1)
    for x in np.flatnonzero(p1 > 0):
        dec.rewind(base)
        total += p1[x] * probs(dec.forward([x])[0], cfg)
    return total
