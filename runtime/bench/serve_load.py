"""`specrt bench serve`: closed-loop load over HTTP against OpenAI-compatible servers.

Per concurrency level, each arm's server is started fresh (llama-server takes its slot count
from the level), warmed up, then L clients (async OpenAI clients) each send a streamed chat
request, read it to the end, and send the next, until the level's request count is done. Fixed
output length (`ignore_eos`, which both specrt and llama-server accept). Per (level, arm) the
fields of vLLM's `bench serve`: request throughput, output tokens/s, TTFT, TPOT (after the
first token), ITL (gaps between streamed chunks) and end-to-end latency as mean / p50 / p90 /
p99, and errors. Arms run one after another at each level, so they never share the cores.

With `repeats` > 1 each level runs every arm that many times, in the arms' order and then in
reverse, alternately (A B, B A, A B, ...), so a slow minute of a shared host falls on both sides;
`summary` gives each arm's median output tokens/s (with its range) and median TPOT per level.
This host's minute-to-minute spread is ~10% (docs/benchmarks.md §48: two arms doing the same work
differed by 12%), as large as many of the differences measured.

A specrt arm also reports what its engine did over the level (its `/metrics` counters read after
the warm-up and after the level): the share of steps in which some request drafted, the draft
tokens accepted, and requests per step. A server without those counters (llama-server) has none.

Multi-turn workloads (`{"id", "system", "turns": [...]}` lines, configs/workloads/multiturn.jsonl):
each client plays whole conversations, one turn after another, every request resending the
system prompt and the history with the server's own earlier answers — what a chat client does.
Per arm it adds TTFT of first turns and of later turns, and the share of later turns' prompt
tokens the server reported cached (`usage.prompt_tokens_details.cached_tokens`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .conversations import turns
from .load import dist, drafting
from .report import command_line


@dataclass
class Arm:
    name: str
    cmd: list[str]  # server command line; "{port}", "{level}" and "{ctx}" (level x 2048) are filled in
    model: str  # the model id requests name
    env: dict = field(default_factory=dict)


@dataclass
class ServeBenchConfig:
    arms: list[Arm]
    prompts: list[str]
    levels: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    max_tokens: int = 128
    requests_per_client: int = 2
    min_requests: int = 4
    startup_s: float = 300.0
    conversations: list[dict] | None = None  # multi-turn: {"system", "turns"}; then prompts are unused
    repeats: int = 1  # runs of each arm per level, the arms' order reversed every other repeat


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(arm: Arm, level: int, timeout: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [c.format(port=port, level=level, ctx=2048 * level) for c in arm.cmd]
    return start_server(arm.name, cmd, port, timeout, arm.env)


def start_server(name: str, cmd: list[str], port: int, timeout: float, env: dict | None = None
                 ) -> tuple[subprocess.Popen, str]:
    """Start a server listening on 127.0.0.1:port and wait until /health answers 200.
    -> (the process, its base URL); RuntimeError if it exits or stays unhealthy."""
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at start ({proc.returncode}): {proc.stderr.read()[-800:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"{name} did not become healthy within {timeout:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _one(client, model: str, prompt: str | list[dict], max_tokens: int) -> dict:
    """One streamed chat request (a user prompt, or the whole message list)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    t0 = time.perf_counter()
    stamps, usage, text = [], None, []
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for ch in stream:
        if ch.usage is not None:
            usage = ch.usage
        if ch.choices and ch.choices[0].delta.content:
            stamps.append(time.perf_counter())
            text.append(ch.choices[0].delta.content)
    end = time.perf_counter()
    n = usage.completion_tokens if usage is not None else len(stamps)
    if not stamps:
        raise RuntimeError("no content streamed")
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    return {"ttft_ms": 1000 * (stamps[0] - t0), "e2e_ms": 1000 * (end - t0), "tokens": n,
            "tpot_ms": 1000 * (end - stamps[0]) / max(1, n - 1),
            "itl_ms": [1000 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)],
            "prompt_tokens": usage.prompt_tokens if usage is not None else None,
            "cached_tokens": (details.cached_tokens or 0) if details is not None else None, "text": "".join(text)}


async def _conversation(client, model: str, conv: dict, max_tokens: int) -> list[dict]:
    """Every turn of one conversation, each resending the history with the earlier answers."""
    messages = [{"role": "system", "content": conv["system"]}] if conv.get("system") else []
    recs = []
    for i, user in enumerate(conv["turns"]):
        messages.append({"role": "user", "content": user})
        rec = await _one(client, model, list(messages), max_tokens)
        messages.append({"role": "assistant", "content": rec.pop("text")})
        recs.append({**rec, "turn": i})
    return recs


async def _level(url: str, model: str, prompts: list, level: int, total: int, max_tokens: int,
                 conversations: bool = False) -> dict:
    """`total` jobs by `level` clients: prompts (one request each) or, with conversations=True,
    conversation dicts (every turn, in order)."""
    import httpx
    import openai

    # a new connection per request, for every server alike: llama-server closes a kept-alive
    # connection after a stream ends, and a client that reuses it fails with a connection error
    http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=600)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, http_client=http)
    queue = list(range(total))
    recs, errors = [], []

    async def worker():
        while queue:
            job = prompts[queue.pop(0) % len(prompts)]
            try:
                if conversations:
                    recs.extend(await _conversation(client, model, job, max_tokens))
                else:
                    recs.append(await _one(client, model, job, max_tokens))
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(repr(e)[:200])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(level)))
    wall = time.perf_counter() - t0
    await client.close()
    await http.aclose()
    tokens = sum(r["tokens"] for r in recs)
    out = {"requests": len(recs), "errors": len(errors), "error_samples": errors[:3], "wall_s": wall,
           "request_throughput": len(recs) / wall, "output_tokens_per_s": tokens / wall,
           "ttft_ms": dist(r["ttft_ms"] for r in recs), "tpot_ms": dist(r["tpot_ms"] for r in recs),
           "itl_ms": dist(x for r in recs for x in r["itl_ms"]), "e2e_ms": dist(r["e2e_ms"] for r in recs)}
    if conversations:
        out.update(turns(recs))
    return out


COUNTERS = {"engine_steps_total": "steps", "engine_step_rows_total": "rows",
            "engine_drafting_steps_total": "drafting_steps", "spec_decode_num_draft_tokens_total": "draft_tokens",
            "spec_decode_num_accepted_tokens_total": "accepted_tokens"}


def counters(url: str) -> dict | None:
    """A specrt server's engine counters (runtime/serve/metrics.py), or None where the server
    has no such /metrics (llama-server's is off unless asked for)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return None
    out = {}
    for line in text.splitlines():
        name = line.split("{")[0].removeprefix("specrt:")
        if line.startswith("specrt:") and name in COUNTERS:
            out[COUNTERS[name]] = float(line.rsplit(" ", 1)[1])
    return out if len(out) == len(COUNTERS) else None


def speculation(before: dict | None, after: dict | None) -> dict:
    """What the engine did between two `counters` readings: the share of steps in which some
    request drafted, the acceptance of the draft tokens, requests per step."""
    if before is None or after is None:
        return {}
    d = {k: after[k] - before[k] for k in COUNTERS.values()}
    return {**drafting(d), "draft_tokens": int(d["draft_tokens"])}


def run_serve_bench(cfg: ServeBenchConfig, progress=None) -> dict:
    if cfg.repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {cfg.repeats}")
    runs = []
    plan = [(level, arm, rep) for level in cfg.levels for rep in range(cfg.repeats)
            for arm in (cfg.arms if rep % 2 == 0 else cfg.arms[::-1])]
    for n, (level, arm, rep) in enumerate(plan):
        if progress:
            progress(n, len(plan), f"concurrency {level} {arm.name}" + (f" (run {rep + 1})" if cfg.repeats > 1 else ""))
        proc, url = _start(arm, level, cfg.startup_s)
        try:
            asyncio.run(_level(url, arm.model, ["Hello."], 1, 1, 16))  # warm-up (shares no prefix with the runs)
            before = counters(url)
            if cfg.conversations:  # every conversation once per level
                rec = asyncio.run(_level(url, arm.model, cfg.conversations, level, len(cfg.conversations),
                                         cfg.max_tokens, conversations=True))
            else:
                total = max(cfg.min_requests, cfg.requests_per_client * level)
                rec = asyncio.run(_level(url, arm.model, cfg.prompts, level, total, cfg.max_tokens))
            rec.update(speculation(before, counters(url)))
        finally:
            _stop(proc)
        rec.update(level=level, arm=arm.name, repeat=rep)
        runs.append(rec)
    return {"config": {"levels": cfg.levels, "max_tokens": cfg.max_tokens, "requests_per_client": cfg.requests_per_client,
                       "arms": {a.name: " ".join(a.cmd) for a in cfg.arms}, "repeats": cfg.repeats,
                       "conversations": len(cfg.conversations) if cfg.conversations else None},
            "runs": runs, "summary": summary(runs), "command": command_line()}


def summary(runs: list[dict]) -> list[dict]:
    """Per (level, arm), in the order first run: how many runs, the median output tokens/s with its
    range, and the medians of the runs' p50 and p99 TPOT."""
    keys = list(dict.fromkeys((r["level"], r["arm"]) for r in runs))
    out = []
    for level, arm in keys:
        rs = [r for r in runs if (r["level"], r["arm"]) == (level, arm)]
        tok = [r["output_tokens_per_s"] for r in rs]
        tpot = [[r["tpot_ms"][q] for r in rs if r["tpot_ms"][q] is not None] for q in ("p50", "p99")]
        out.append({"level": level, "arm": arm, "runs": len(rs), "output_tokens_per_s": {
            "median": float(np.median(tok)), "min": min(tok), "max": max(tok)},
            "tpot_p50_ms": float(np.median(tpot[0])) if tpot[0] else None,
            "tpot_p99_ms": float(np.median(tpot[1])) if tpot[1] else None})
    return out


def table(results: dict) -> str:
    hdr = (f"{'conc':>4} {'arm':<18} {'req/s':>6} {'tok/s':>7} {'TTFT p50':>8} {'p99':>7} {'TPOT p50':>8} {'p99':>6} "
           f"{'ITL p50':>7} {'E2E p50':>8} {'p99':>7} {'err':>4}")
    lines = [hdr, "-" * len(hdr)]
    for r in results["runs"]:
        lines.append(f"{r['level']:>4} {r['arm']:<18} {r['request_throughput']:>6.2f} {r['output_tokens_per_s']:>7.1f} "
                     f"{r['ttft_ms']['p50'] or 0:>8.0f} {r['ttft_ms']['p99'] or 0:>7.0f} {r['tpot_ms']['p50'] or 0:>8.1f} "
                     f"{r['tpot_ms']['p99'] or 0:>6.1f} {r['itl_ms']['p50'] or 0:>7.1f} {r['e2e_ms']['p50'] or 0:>8.0f} "
                     f"{r['e2e_ms']['p99'] or 0:>7.0f} {r['errors']:>4}")
    if any(m["runs"] > 1 for m in results.get("summary", [])):
        lines += ["", f"{'conc':>4} {'arm':<18} {'runs':>4} {'tok/s median':>12} {'range':>13} {'TPOT p50':>8}"]
        for m in results["summary"]:
            t = m["output_tokens_per_s"]
            lines.append(f"{m['level']:>4} {m['arm']:<18} {m['runs']:>4} {t['median']:>12.1f} "
                         f"{t['min']:>6.1f}-{t['max']:<6.1f} {m['tpot_p50_ms'] or 0:>8.1f}")
    if any("drafting_step_share" in r for r in results["runs"]):
        lines += ["", f"{'conc':>4} {'arm':<18} {'drafting steps':>14} {'draft tokens':>12} {'accepted':>8} "
                      f"{'rows/step':>9}"]
        for r in (r for r in results["runs"] if "drafting_step_share" in r):
            acc = r["acceptance_rate"]
            lines.append(f"{r['level']:>4} {r['arm']:<18} {r['drafting_step_share']:>14.2f} {r['draft_tokens']:>12} "
                         f"{'-' if acc is None else f'{acc:.2f}':>8} {r['rows_per_step']:>9.2f}")
    if any("ttft_later_turns_ms" in r for r in results["runs"]):
        lines += ["", f"{'conc':>4} {'arm':<18} {'TTFT turn 1 p50':>15} {'later turns p50':>15} {'cached share':>12} "
                      f"{'found cached':>12}"]
        for r in results["runs"]:
            share, found = r["later_turns_cached_share"], r["later_turns_found_cached"]
            lines.append(f"{r['level']:>4} {r['arm']:<18} {r['ttft_first_turn_ms']['p50'] or 0:>15.0f} "
                         f"{r['ttft_later_turns_ms']['p50'] or 0:>15.0f} "
                         f"{'-' if share is None else f'{share:.2f}':>12} {'-' if found is None else f'{found:.2f}':>12}")
    return "\n".join(lines)


def plot(results: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    per = results.get("summary") or summary(results["runs"])
    for arm in dict.fromkeys(m["arm"] for m in per):
        ms = [m for m in per if m["arm"] == arm]
        lv = [m["level"] for m in ms]
        a.plot(lv, [m["output_tokens_per_s"]["median"] for m in ms], marker="o", label=arm)
        b.plot(lv, [m["tpot_p99_ms"] or 0 for m in ms], marker="o", label=arm)
    for ax, title in ((a, "output tokens/s (median of runs)"), (b, "p99 TPOT (ms, median of runs)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    path = out / "serve.png"
    fig.savefig(path, dpi=110)
    return path
