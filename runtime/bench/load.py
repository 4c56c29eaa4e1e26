"""`specrt bench --concurrency 1,2,4,8,16`: closed-loop load on one in-process engine.

Per concurrency level L, L client threads each send a request, wait for its last token, and
send the next (prompts cycle through the workloads; a fixed output length, EOS ignored). Arms
— drafting off, fixed k, the scheduler's policy (adaptive k capped by the batch plan) — run
back to back at each level in A B C C B A order, so drift on a shared machine hits them alike.
Per (level, arm): aggregate output tokens/s (all tokens / wall time), request throughput,
TTFT, TPOT (after the first token), ITL (gaps between streamed chunks), end-to-end latency
(mean, p50, p90, p99), errors, and the engine's counters over the run (rows and tokens per
step, share of steps that drafted, acceptance).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..pipeline import Pipeline

ARMS = ("off", "fixed", "policy")


@dataclass
class LoadConfig:
    bundle: Path
    prompts: list[str]
    levels: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    max_new_tokens: int = 128
    requests_per_client: int = 2  # per arm and level (at least `min_requests` in all)
    min_requests: int = 4
    k: int | None = None  # fixed arm's k (default: the bundle's)
    repeats: int = 2  # A B C, C B A, ...
    hugepages: bool = True
    arms: tuple[str, ...] = ARMS
    global_pool: bool = True  # as `specrt generate` / `serve` run (the process's one onnxruntime pool)


def dist(xs) -> dict:
    a = np.asarray(list(xs), dtype=float)
    if a.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "n": 0}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99), "n": int(a.size)}


def drafting(d: dict) -> dict:
    """From engine counter deltas `d` (runtime/engine/counters.py): requests per step, the share of
    steps in which some request drafted, and the acceptance of the draft tokens (None: none drafted)."""
    return {"rows_per_step": d["rows"] / d["steps"] if d["steps"] else 0.0,
            "drafting_step_share": d["drafting_steps"] / d["steps"] if d["steps"] else 0.0,
            "acceptance_rate": d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else None}


def run_clients(n: int, client) -> float:
    """Run client() in n threads at once until every one returns -> wall seconds."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def _arm_kwargs(arm: str, pipe: Pipeline, k: int | None) -> dict:
    if arm == "off":
        return {"draft": "none", "k": 0, "adaptive": False}
    if arm == "fixed":
        return {"draft": "model", "k": k if k is not None else pipe.default_k, "adaptive": False}
    return {"draft": "model", "k": pipe.max_k, "adaptive": True}


def run_level(pipe: Pipeline, ids: list[list[int]], level: int, arm: str, cfg: LoadConfig) -> dict:
    kw = _arm_kwargs(arm, pipe, cfg.k)
    total = max(cfg.min_requests, cfg.requests_per_client * level)
    counter = iter(range(total))
    lock = threading.Lock()
    recs, errors = [], []

    def client():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t0 = time.perf_counter()
            stamps = []
            n = 0
            try:
                for chunk in pipe.stream_ids(ids[i % len(ids)], max_new_tokens=cfg.max_new_tokens, ignore_eos=True, **kw):
                    stamps.append(time.perf_counter())
                    n += len(chunk)
            except Exception as e:  # noqa: BLE001 - counted, reported
                errors.append(repr(e)[:200])
                continue
            end = stamps[-1]
            ttft = stamps[0] - t0
            recs.append({"ttft_ms": 1000 * ttft, "e2e_ms": 1000 * (end - t0), "tokens": n,
                         "tpot_ms": 1000 * (end - stamps[0]) / max(1, n - 1),
                         "itl_ms": [1000 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]})

    before = pipe.counters()
    wall = run_clients(level, client)
    after = pipe.counters()
    d = {k: after[k] - before[k] for k in ("steps", "rows", "tokens", "drafting_steps", "draft_tokens",
                                          "accepted_tokens", "drafts", "target_calls", "draft_calls")}
    tokens = sum(r["tokens"] for r in recs)
    return {
        "level": level, "arm": arm, "requests": len(recs), "errors": len(errors), "error_samples": errors[:3],
        "wall_s": wall, "output_tokens_per_s": tokens / wall if wall else 0.0,
        "request_throughput": len(recs) / wall if wall else 0.0,
        "ttft_ms": dist(r["ttft_ms"] for r in recs), "tpot_ms": dist(r["tpot_ms"] for r in recs),
        "itl_ms": dist(x for r in recs for x in r["itl_ms"]), "e2e_ms": dist(r["e2e_ms"] for r in recs),
        **drafting(d),
        "tokens_per_step": d["tokens"] / d["steps"] if d["steps"] else 0.0,
        "mean_acceptance_length": 1 + d["accepted_tokens"] / d["drafts"] if d["drafts"] else None,
        "counters": d,
    }


def run_load(cfg: LoadConfig, progress=None) -> dict:
    # no prefix reuse: every arm and level computes its prompts (a workload's prompts repeat across
    # arms, and the arm that ran first would pay for the others); reuse is measured by `bench serve`
    pipe = Pipeline(cfg.bundle, draft="model", global_pool=cfg.global_pool, hugepages=cfg.hugepages, cost_cache=False,
                    max_batch=max(cfg.levels), max_queue=max(cfg.levels), prefix_cache=False)
    try:
        ids = [pipe.tokenizer.encode(p) for p in cfg.prompts]
        costs = pipe.use_costs()  # the run's own probe, before any request (the policy arm's costs)
        for arm in cfg.arms:  # warm-up
            run_level(pipe, ids, 1, arm, LoadConfig(cfg.bundle, cfg.prompts, max_new_tokens=16, min_requests=1,
                                                      requests_per_client=1))
        runs = []
        plan = []
        for level in cfg.levels:
            for rep in range(cfg.repeats):
                order = list(cfg.arms) if rep % 2 == 0 else list(reversed(cfg.arms))
                plan += [(level, rep, arm) for arm in order]
        for n, (level, rep, arm) in enumerate(plan):
            if progress:
                progress(n, len(plan), f"concurrency {level} {arm} (repeat {rep})")
            rec = run_level(pipe, ids, level, arm, cfg)
            rec["repeat"] = rep
            runs.append(rec)
        out = {"config": {"bundle": str(cfg.bundle), "levels": cfg.levels, "max_new_tokens": cfg.max_new_tokens,
                          "requests_per_client": cfg.requests_per_client, "k": cfg.k or pipe.default_k,
                          "repeats": cfg.repeats, "slots": max(cfg.levels), "hugepages": cfg.hugepages,
                          "kv_bytes_per_slot": pipe.kv_bytes_per_slot},
               "costs": {"target_ms": costs.target_ms, "rows_ms": costs.rows_ms, "draft_ms": costs.draft_ms,
                         "draft_rows_ms": costs.draft_rows_ms},
               "runs": runs}
        out["summary"] = summarize(runs)
        return out
    finally:
        pipe.close()


def _rss_mb() -> float:
    import resource

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def soak(cfg: LoadConfig, level: int, minutes: float, arm: str = "policy", every_s: float = 10.0) -> dict:
    """Closed-loop load at one level for `minutes`, RSS sampled every `every_s`: the slots are
    allocated at load, so RSS should stay flat after the first requests."""
    pipe = Pipeline(cfg.bundle, draft="model", global_pool=cfg.global_pool, hugepages=cfg.hugepages, cost_cache=False,
                    max_batch=level, max_queue=level, prefix_cache=False)
    try:
        ids = [pipe.tokenizer.encode(p) for p in cfg.prompts]
        pipe.use_costs()
        kw = _arm_kwargs(arm, pipe, cfg.k)
        stop = time.perf_counter() + 60 * minutes
        done = [0]

        def client(c):
            i = c
            while time.perf_counter() < stop:
                for _ in pipe.stream_ids(ids[i % len(ids)], max_new_tokens=cfg.max_new_tokens, ignore_eos=True, **kw):
                    pass
                done[0] += 1
                i += level

        samples = [(0.0, _rss_mb())]
        threads = [threading.Thread(target=client, args=(c,)) for c in range(level)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(every_s)
            samples.append((time.perf_counter() - t0, _rss_mb()))
        after = [mb for t, mb in samples if t >= 60] or [mb for _, mb in samples]
        return {"level": level, "arm": arm, "minutes": minutes, "requests": done[0], "samples": samples,
                "kv_bytes_per_slot": pipe.kv_bytes_per_slot, "rss_after_first_minute_mb": [min(after), max(after)],
                "flatness": (max(after) - min(after)) / max(after)}
    finally:
        pipe.close()


def summarize(runs: list[dict]) -> list[dict]:
    """Per (level, arm): the median over repeats of tokens/s, and the ratio to the level-1
    drafting-off rate and to the other arms at the same level."""
    rows = []
    base = [r["output_tokens_per_s"] for r in runs if r["level"] == min(x["level"] for x in runs) and r["arm"] == "off"]
    base1 = float(np.median(base)) if base else None
    for level in sorted({r["level"] for r in runs}):
        at = [r for r in runs if r["level"] == level]
        meds = {arm: float(np.median([r["output_tokens_per_s"] for r in at if r["arm"] == arm]))
                for arm in sorted({r["arm"] for r in at})}
        for arm, tps in meds.items():
            rs = [r for r in at if r["arm"] == arm]
            rows.append({
                "level": level, "arm": arm, "output_tokens_per_s": tps,
                "vs_level1_off": tps / base1 if base1 else None,
                "vs_best_other": tps / max(v for a, v in meds.items() if a != arm) if len(meds) > 1 else None,
                "ttft_p50_ms": float(np.median([r["ttft_ms"]["p50"] for r in rs])),
                "ttft_p99_ms": float(np.median([r["ttft_ms"]["p99"] for r in rs])),
                "tpot_p50_ms": float(np.median([r["tpot_ms"]["p50"] for r in rs])),
                "tpot_p99_ms": float(np.median([r["tpot_ms"]["p99"] for r in rs])),
                "rows_per_step": float(np.median([r["rows_per_step"] for r in rs])),
                "tokens_per_step": float(np.median([r["tokens_per_step"] for r in rs])),
                "drafting_step_share": float(np.median([r["drafting_step_share"] for r in rs])),
                "acceptance_rate": rs[0]["acceptance_rate"],
                "errors": sum(r["errors"] for r in rs),
            })
    return rows


def table(results: dict) -> str:
    hdr = (f"{'conc':>4} {'arm':<7} {'tok/s':>7} {'x c1-off':>8} {'x best':>7} {'TTFT p50':>9} {'p99':>7} "
           f"{'TPOT p50':>9} {'p99':>7} {'rows/st':>7} {'tok/st':>6} {'draft%':>6} {'accept':>6} {'err':>4}")
    lines = [hdr, "-" * len(hdr)]
    for r in results["summary"]:
        def f(key, fmt, r=r):
            return fmt % r[key] if r.get(key) is not None else "-"
        lines.append(f"{r['level']:>4} {r['arm']:<7} {r['output_tokens_per_s']:>7.1f} {f('vs_level1_off', '%.2fx'):>8} "
                     f"{f('vs_best_other', '%.2fx'):>7} {r['ttft_p50_ms']:>9.0f} {r['ttft_p99_ms']:>7.0f} "
                     f"{r['tpot_p50_ms']:>9.1f} {r['tpot_p99_ms']:>7.1f} {r['rows_per_step']:>7.2f} "
                     f"{r['tokens_per_step']:>6.2f} {100 * r['drafting_step_share']:>5.0f}% "
                     f"{f('acceptance_rate', '%.2f'):>6} {r['errors']:>4}")
    return "\n".join(lines)
