"""The benchmark run: cost-model probes, then interleaved arms over workload prompts."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..engine import Stats
from ..pipeline import Pipeline
from ..policy.cost_cache import cpu_model
from . import peer
from .report import command_line
from .stats import alpha_from_expected, interleave, median_spread, paired_ratio, predicted_speedup

# Idle gap before each timed run. A thread pool keeps spinning for tens of ms after its last
# call (onnxruntime-genai's does), and the next arm would pay for it in TTFT. The gap puts every
# arm on the same footing whichever arm ran before it.
SETTLE_S = 0.05


@dataclass
class BenchConfig:
    bundle: Path
    workloads: list[Path]
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    drafts: list[str] = field(default_factory=lambda: ["model"])  # "model" | "ngram"
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    top_p: float = 1.0
    max_new_tokens: int = 128
    repeats: int = 1
    limit: int | None = None  # prompts per workload
    peer: str | None = None  # "ort-genai"
    peer_draft: Path | None = None  # bundle whose (plain) draft the peer's speculative arms use
    rss: bool = False  # peak RSS per arm in fresh processes (+ a long generation)
    # The CLI measures with the global pool, as `specrt generate` runs. Per-session pools that
    # stop spinning after each run are the library default (safe beside other sessions in the
    # process) and cost a little per step (docs/benchmarks.md §1).
    global_pool: bool = False
    adaptive: bool = False  # add a "<draft>-adaptive" arm per drafter
    hugepages: bool = True  # our sessions on 2 MiB pages, as Pipeline's default (services); the peer as it ships
    out: Path = Path("bench")


def load_workload(path: Path) -> list[dict]:
    """JSONL: {"id", "prompt"} per line, or a conversation {"id", "system"?, "turns": [user, ...]}."""
    items = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            it = {"id": d.get("id", str(len(items))), "workload": Path(path).stem}
            if "turns" in d:
                it.update(system=d.get("system", ""), turns=list(d["turns"]))
            else:
                it["prompt"] = d["prompt"]
            if "schema" in d:  # structured output (tools/feature_costs.py)
                it["schema"] = d["schema"]
            items.append(it)
    return items


def is_conversations(path: Path) -> bool:
    """Whether a workload file holds multi-turn conversations (not single prompts)."""
    return any("turns" in it for it in load_workload(path))


def is_plain(path: Path) -> bool:
    """Whether a workload file holds plain prompts (no conversations, no output schema): what
    `specrt bench` runs by default."""
    return not any("turns" in it or "schema" in it for it in load_workload(path))


def probe_costs(pipe: Pipeline, ks: list[int]) -> dict:
    """The pipeline's own cost probe (`adaptive.measure_costs`, also what adaptive arms start
    from), as JSON-friendly numbers: target ms per call width, draft ms, c and v(k+1)."""
    costs = pipe.costs()
    out = {"target_ms": dict(costs.target_ms), "v": {k + 1: costs.v(k + 1) for k in ks}}
    if pipe.parts.draft is not None:
        out["draft_ms"] = {1: costs.draft_ms}
        out["c"] = costs.c
    return out


def run_bench(cfg: BenchConfig, progress=None) -> dict:
    items = [it for w in cfg.workloads for it in load_workload(w)[: cfg.limit]]
    if any("turns" in it for it in items):
        raise ValueError("multi-turn workloads (conversations) run with `specrt bench --concurrency L` or `specrt bench serve`")
    pipe = Pipeline(cfg.bundle, global_pool=cfg.global_pool,  # draft: the bundle's model if it has one
                    hugepages=cfg.hugepages, cost_cache=False,  # the run's own probe: c and v of this run
                    max_batch=1,  # one request at a time, as `specrt generate` (--concurrency: bench/load.py)
                    prefix_cache=False)  # every arm computes its prompt: TTFT is prefill, arm against arm
    for it in items:
        it["ids"] = pipe.tokenizer.encode(it["prompt"])
    arms = ["target"] + [f"{d}-k{k}" for d in cfg.drafts for k in cfg.ks]
    if cfg.adaptive:
        arms += [f"{d}-adaptive" for d in cfg.drafts]
    costs = probe_costs(pipe, cfg.ks)  # measured once, before the timed runs
    genai = _genai_runners(cfg, pipe.manifest) if cfg.peer == "ort-genai" else {}
    arms += list(genai)

    # warm-up: one short run per arm
    for arm in arms:
        _run_arm(pipe, genai, arm, items[0], 0.0, cfg, max_new=16)

    runs = []
    for temp in cfg.temperatures:
        plan = interleave(arms, items, cfg.repeats)
        for n, (rep, it, arm) in enumerate(plan):
            if progress:
                progress(n, len(plan), f"T={temp} {it['id']} {arm}")
            time.sleep(SETTLE_S)  # no arm starts while the last one's thread pool still spins
            rec = _run_arm(pipe, genai, arm, it, temp, cfg, seed=rep)
            rec.update(temperature=temp, repeat=rep, prompt_id=it["id"], workload=it["workload"], arm=arm)
            runs.append(rec)
    results = {
        "machine": _machine(),
        "command": command_line(),
        "config": {"bundle": str(cfg.bundle), "workloads": [str(w) for w in cfg.workloads], "ks": cfg.ks,
                   "drafts": cfg.drafts, "temperatures": cfg.temperatures, "top_p": cfg.top_p,
                   "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats, "peer": cfg.peer,
                   "peer_draft": str(cfg.peer_draft) if cfg.peer_draft else None, "adaptive": cfg.adaptive,
                   "limit": cfg.limit, "global_pool": cfg.global_pool, "hugepages": cfg.hugepages},
        "costs": costs,
        "runs": runs,
    }
    results["summary"] = summarize(runs)
    results["greedy_agreement"] = _agreement(runs, lambda arm: arm != "target" and not arm.startswith("genai"))
    if cfg.peer:
        results["peer_agreement"] = _agreement(runs, lambda arm: arm.startswith("genai"))
    if cfg.rss:
        results["rss"] = measure_rss(cfg.bundle, items[0]["prompt"], max(cfg.ks), hugepages=cfg.hugepages)
    return results


def _genai_runners(cfg: BenchConfig, man) -> dict:
    """onnxruntime-genai's arms on the same graphs: arm name -> peer.GenaiRunner."""
    if not peer.available():
        raise RuntimeError("--peer ort-genai needs onnxruntime-genai (pip install 'specrt[bench]')")
    peers = [("genai-target", None, 0)]
    has_plain = cfg.peer_draft is not None or (man.draft is not None and not man.draft.io.hidden_in)
    peers += [(f"genai-k{k}", k, 0) for k in cfg.ks if "model" in cfg.drafts and has_plain]
    peers += [(f"genai-ngram-k{k}", k, 3) for k in cfg.ks if "ngram" in cfg.drafts]
    own = (cfg.bundle / "genai_config.json").is_file()  # bundles exported since session 6
    genai = {}
    for name, kk, ngram in peers:
        if own and (cfg.peer_draft is None or not kk or ngram):  # the bundle as services load it
            genai[name] = peer.GenaiRunner(cfg.bundle, peer.bundle_overlay(man, kk, ngram))
            continue
        folder = peer.write_config(cfg.bundle, man, cfg.out / "genai" / name, max_draft_tokens=kk,
                                   ngram_size=ngram, draft_bundle=cfg.peer_draft if kk and not ngram else None)
        genai[name] = peer.GenaiRunner(folder)
    return genai


def _run_arm(pipe, genai, arm, it, temp, cfg, seed=0, max_new=None) -> dict:
    max_new = max_new or cfg.max_new_tokens
    if arm in genai:
        r = genai[arm].generate(it["ids"], max_new, temperature=temp, top_p=cfg.top_p, seed=seed)
        toks = r["token_ids"]
        if toks and toks[-1] in pipe.tokenizer.eog_ids:
            toks = toks[:-1]
        return {"token_ids": toks, "new_tokens": len(toks), "tpot_ms": r["tpot_ms"], "ttft_ms": r["ttft_ms"],
                "decode_ms": r["decode_ms"], **({"speculative_stats": r["speculative_stats"]} if "speculative_stats" in r else {})}
    adaptive = arm.endswith("-adaptive")
    if arm == "target":
        draft, k = "none", 0
    elif adaptive:
        draft, k = arm[: -len("-adaptive")], pipe.max_k
    else:
        draft, k = arm.split("-k")[0], int(arm.split("-k")[1])
    stats = Stats()
    toks = [t for c in pipe.stream_ids(it["ids"], max_new_tokens=max_new, temperature=temp, top_p=cfg.top_p,
                                       seed=seed, k=k, draft=draft, stats=stats, adaptive=adaptive) for t in c]
    d = stats.as_dict()
    d["token_ids"] = toks
    return d


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (temperature, workload, arm): medians, speedup vs target in the same run."""
    rows = []
    keys = sorted({(r["temperature"], r["workload"], r["arm"]) for r in runs}, key=str)
    by = {}
    for r in runs:
        by.setdefault((r["temperature"], r["workload"], r["arm"]), []).append(r)
    for temp, wl, arm in keys:
        rs = by[(temp, wl, arm)]
        base = {(r["prompt_id"], r["repeat"]): r for r in by.get((temp, wl, "target"), [])}
        pairs = [(base[(r["prompt_id"], r["repeat"])]["tpot_ms"], r["tpot_ms"]) for r in rs
                 if (r["prompt_id"], r["repeat"]) in base and r["tpot_ms"] == r["tpot_ms"]]
        row = {"temperature": temp, "workload": wl, "arm": arm,
               "tpot_ms": median_spread(r["tpot_ms"] for r in rs),
               "ttft_ms": median_spread(r["ttft_ms"] for r in rs),
               "tokens_per_s": median_spread(1000 / r["tpot_ms"] for r in rs if r["tpot_ms"] > 0),
               "new_tokens": int(np.sum([r["new_tokens"] for r in rs]))}
        if pairs:
            b, o = zip(*pairs, strict=True)
            row["speedup_vs_target"] = paired_ratio(list(b), list(o))
        if "acceptance_rate" in rs[0] and arm != "target":
            acc = sum(r["accepted_tokens"] for r in rs) / max(1, sum(r["draft_tokens"] for r in rs))
            row["acceptance_rate"] = acc
            row["mean_accepted_per_round"] = float(np.mean([r["mean_accepted_per_round"] for r in rs]))
            width = max(len(r["per_position_acceptance"]) for r in rs)
            row["drafter_rounds"] = {name: int(sum(r["drafter_rounds"].get(name, 0) for r in rs))
                                     for name in {n for r in rs for n in r["drafter_rounds"]}}
            row["mean_k"] = float(np.mean([x for r in rs for x in r["k_history"]] or [0]))
            row["per_position_acceptance"] = [
                float(np.mean([r["per_position_acceptance"][j] for r in rs if len(r["per_position_acceptance"]) > j] or [0]))
                for j in range(width)]
            tot = sum(r["decode_ms"] for r in rs) or 1
            row["time_split"] = {"draft": sum(r["draft_ms"] for r in rs) / tot, "verify": sum(r["verify_ms"] for r in rs) / tot,
                                 "other": sum(r["other_ms"] for r in rs) / tot}
            t1 = step_ms(by.get((temp, wl, "target"), []))
            if "-k" in arm and t1 and sum(r["draft_tokens"] for r in rs):
                # Cost model from this run's own call times (same load as the measurement):
                # c = draft ms per proposed token / target step, v = verify ms per round / step.
                # E = measured tokens per round (per-position acceptance is not i.i.d.; the
                # i.i.d.-equivalent alpha is reported alongside).
                k = int(arm.split("-k")[1])
                c = sum(r["draft_ms"] for r in rs) / sum(r["draft_tokens"] for r in rs) / t1
                v = sum(r["verify_ms"] for r in rs) / sum(r["rounds"] for r in rs) / t1
                e_meas = row["mean_accepted_per_round"]
                alpha = alpha_from_expected(e_meas, k)
                row["cost_model"] = {"c": c, "v": v, "E": e_meas, "alpha_iid_equivalent": alpha}
                pred = predicted_speedup(alpha, k, c, v)
                row["predicted_speedup"] = pred
                if "speedup_vs_target" in row:
                    row["efficiency"] = row["speedup_vs_target"] / pred
        rows.append(row)
    return rows


def step_ms(target_runs: list[dict]) -> float | None:
    """One target step (T = 1) in ms, from the target-only runs of this bench."""
    per = [r["verify_ms"] / r["rounds"] for r in target_runs if r.get("rounds")]
    return float(np.median(per)) if per else None


def _agreement(runs: list[dict], which) -> dict:
    """Greedy runs of the arms `which(arm)` selects: is the output our target-only arm's, token
    for token (same prompt, same repeat)? Speculative arms must be (the product's promise;
    a difference can only come from a near-tie flipped by a different call width); genai arms
    show whether the two runtimes compute the same model."""
    ours = {(r["prompt_id"], r["repeat"]): r["token_ids"] for r in runs if r["arm"] == "target" and r["temperature"] == 0}
    out = {}
    for r in runs:
        if which(r["arm"]) and r["temperature"] == 0 and (r["prompt_id"], r["repeat"]) in ours:
            ref = ours[(r["prompt_id"], r["repeat"])]
            same = r["token_ids"] == ref
            first = next((i for i, (a, b) in enumerate(zip(r["token_ids"], ref, strict=False)) if a != b), None)
            out.setdefault(r["arm"], []).append({"prompt_id": r["prompt_id"], "identical": same, "first_diff": first})
    return out


RSS_CODE = r"""
import json, sys, resource, specrt
bundle, draft, k, n, prompt, huge = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6] == "1"
def rss_mb():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
pipe = specrt.load(bundle, draft=draft, hugepages=huge, max_batch=1)
ids = pipe.tokenizer.encode(prompt)
n = min(n, pipe.max_seq_len - len(ids))
samples, done = [], 0
for chunk in pipe.stream_ids(ids, max_new_tokens=n, k=k if draft != 'none' else 0, draft=draft, ignore_eos=True):
    done += len(chunk)
    if not samples or done - samples[-1][0] >= n // 10:
        samples.append((done, rss_mb()))
samples.append((done, rss_mb()))
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "samples": samples}))
"""


def measure_rss(bundle: Path, prompt: str, k: int, n_long: int = 2000, hugepages: bool = True) -> dict:
    """Fresh processes: peak RSS (kB->MB) of target-only and speculative over a long generation,
    with RSS sampled along the way (flatness)."""
    out = {}
    for draft in ("none", "model"):
        r = subprocess.run([sys.executable, "-c", RSS_CODE, str(bundle), draft, str(k), str(n_long), prompt, str(int(hugepages))],
                           capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            out[draft] = {"error": r.stderr[-500:]}
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        mb = [m for _, m in d["samples"][1:]] or [0]
        d["flatness"] = (max(mb) - min(mb)) / max(mb) if max(mb) else 0.0
        out[draft] = d
    return out


def _machine() -> dict:
    import os

    import onnxruntime as ort

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(), "onnxruntime": ort.__version__,
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
