"""`specrt bench --concurrency L --workload configs/workloads/multiturn.jsonl`: conversations in process.

L client threads play whole conversations on one engine, turn after turn, each prompt being
the system prompt + the history + the engine's own earlier answers through the bundle's chat
template (what a chat client resends). Two arms, each on a pipeline of its own: prefix reuse on
("reuse", the default) and off ("cold"), alternating A B B A over repeats; the reuse
pipeline's cached prefixes are dropped before each of its runs, so every run starts cold. Per
(level, arm): TTFT of first turns, of later turns and per turn, the share of later turns'
prompt tokens reused, output tokens/s (`turns`, shared with `bench serve`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..engine import Stats
from ..pipeline import Pipeline
from .load import dist, run_clients

ARMS = ("reuse", "cold")


@dataclass
class ConversationConfig:
    bundle: Path
    conversations: list[dict]  # {"system", "turns": [user message, ...]}
    levels: list[int]
    max_new_tokens: int = 48
    repeats: int = 2
    hugepages: bool = True
    global_pool: bool = True


def turns(recs: list[dict]) -> dict:
    """Multi-turn fields over records {turn, ttft_ms, prompt_tokens, cached_tokens (None: not
    reported)}: TTFT of first and later turns and per turn, the share of later turns' prompt
    tokens reused, and the share of later turns that found anything cached."""
    later = [r for r in recs if r["turn"] > 0]
    known = [r for r in later if r["cached_tokens"] is not None and r["prompt_tokens"]]
    by_turn = sorted({r["turn"] for r in recs})
    return {"ttft_first_turn_ms": dist(r["ttft_ms"] for r in recs if r["turn"] == 0),
            "ttft_later_turns_ms": dist(r["ttft_ms"] for r in later),
            "ttft_by_turn_ms": {t: dist(r["ttft_ms"] for r in recs if r["turn"] == t)["p50"] for t in by_turn},
            "prompt_tokens_by_turn": {t: dist(r["prompt_tokens"] or 0 for r in recs if r["turn"] == t)["p50"]
                                      for t in by_turn},
            "later_turns_cached_share": (sum(r["cached_tokens"] for r in known) / sum(r["prompt_tokens"] for r in known)
                                         if known else None),
            "later_turns_found_cached": (sum(r["cached_tokens"] > 0 for r in known) / len(known) if known else None)}


def play(pipe: Pipeline, conv: dict, max_new_tokens: int) -> list[dict]:
    """Every turn of one conversation (greedy, the model's own answers fed back)."""
    messages = [{"role": "system", "content": conv["system"]}] if conv.get("system") else []
    recs = []
    for i, user in enumerate(conv["turns"]):
        messages.append({"role": "user", "content": user})
        ids = pipe.tokenizer.encode_messages(messages)
        st = Stats()
        t0 = time.perf_counter()
        first, out = None, []
        for chunk in pipe.stream_ids(ids, max_new_tokens=max_new_tokens, stats=st):
            first = first or time.perf_counter()
            out += chunk
        messages.append({"role": "assistant", "content": pipe.tokenizer.decode(out)})
        recs.append({"turn": i, "ttft_ms": 1000 * ((first or time.perf_counter()) - t0), "tokens": len(out),
                     "prompt_tokens": len(ids), "cached_tokens": st.cached_tokens})
    return recs


def run_level(pipe: Pipeline, convs: list[dict], level: int, max_new_tokens: int) -> dict:
    queue, lock, recs, errors = list(convs), threading.Lock(), [], []

    def client():
        while True:
            with lock:
                if not queue:
                    return
                conv = queue.pop(0)
            try:
                recs.extend(play(pipe, conv, max_new_tokens))
            except Exception as e:  # noqa: BLE001 - counted, reported
                errors.append(repr(e)[:200])

    wall = run_clients(level, client)
    return {"level": level, "requests": len(recs), "errors": len(errors), "error_samples": errors[:3],
            "wall_s": wall, "output_tokens_per_s": sum(r["tokens"] for r in recs) / wall, **turns(recs)}


def run_conversations(cfg: ConversationConfig, progress=None) -> dict:
    kw = dict(draft="model", global_pool=cfg.global_pool, hugepages=cfg.hugepages, cost_cache=False,
              max_batch=max(cfg.levels), max_queue=max(cfg.levels))
    pipes = {"reuse": Pipeline(cfg.bundle, **kw), "cold": Pipeline(cfg.bundle, prefix_cache=False, **kw)}
    try:
        for pipe in pipes.values():  # warm-up (shares no prefix with the runs) and the cost probe
            pipe.use_costs()
            pipe.generate("Hello.", max_new_tokens=8)
        plan = [(level, rep, arm) for level in cfg.levels for rep in range(cfg.repeats)
                for arm in (ARMS if rep % 2 == 0 else ARMS[::-1])]
        runs = []
        for n, (level, rep, arm) in enumerate(plan):
            if progress:
                progress(n, len(plan), f"concurrency {level} {arm} (repeat {rep})")
            pipes[arm].forget_prefixes()  # every run starts from an empty cache
            rec = run_level(pipes[arm], cfg.conversations, level, cfg.max_new_tokens)
            runs.append({**rec, "arm": arm, "repeat": rep})
        return {"config": {"bundle": str(cfg.bundle), "levels": cfg.levels, "max_new_tokens": cfg.max_new_tokens,
                           "repeats": cfg.repeats, "conversations": len(cfg.conversations), "slots": max(cfg.levels)},
                "runs": runs}
    finally:
        for pipe in pipes.values():
            pipe.close()


def table(results: dict) -> str:
    hdr = (f"{'conc':>4} {'arm':<6} {'rep':>3} {'tok/s':>7} {'TTFT turn 1 p50':>15} {'later p50':>9} "
           f"{'later p90':>9} {'cached share':>12} {'found cached':>12} {'err':>4}")
    lines = [hdr, "-" * len(hdr)]
    for r in results["runs"]:
        share, found = r["later_turns_cached_share"], r["later_turns_found_cached"]
        lines.append(f"{r['level']:>4} {r['arm']:<6} {r['repeat']:>3} {r['output_tokens_per_s']:>7.1f} "
                     f"{r['ttft_first_turn_ms']['p50'] or 0:>15.0f} {r['ttft_later_turns_ms']['p50'] or 0:>9.0f} "
                     f"{r['ttft_later_turns_ms']['p90'] or 0:>9.0f} {'-' if share is None else f'{share:.2f}':>12} "
                     f"{'-' if found is None else f'{found:.2f}':>12} {r['errors']:>4}")
    return "\n".join(lines)
