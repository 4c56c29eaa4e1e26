"""`specrt bench`: target-only vs speculative (vs onnxruntime-genai), interleaved; with
--concurrency, many requests on one engine (prompts: runtime/bench/load.py; conversations:
runtime/bench/conversations.py). `bench serve` (bench_serve.py) goes over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specrt.runtime.options import LoadOptions

from .common import engines_default, engines_option, fail, load_flags, progress

DEFAULT_KS = "1,2,4,8"


@click.group(invoke_without_command=True)
@click.pass_context
@engines_option
@click.option("--workload", "workloads", multiple=True, type=click.Path(exists=True, dir_okay=False), help="JSONL prompts (default configs/workloads/*.jsonl, conversations excepted)")
@click.option("--k", "ks", default=None, help=f"comma-separated draft lengths (default {DEFAULT_KS}); with --concurrency "
              "one, the fixed-k arm's (default: the bundle's)")
@click.option("--draft", "drafts", default="model", show_default=True, help="comma-separated drafters: model,ngram,auto")
@click.option("--adaptive", is_flag=True, help="add an adaptive-k arm per drafter")
@click.option("--temperature", "temps", default="0", show_default=True, help="comma-separated temperatures")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=1, show_default=True)
@click.option("--limit", type=int, default=None, help="prompts per workload")
@click.option("--peer", type=click.Choice(["ort-genai"]), default=None, help="also run onnxruntime-genai on the same graphs")
@click.option("--peer-draft", type=click.Path(), default=None,
              help="bundle whose plain draft model the peer's speculative arms use (genai cannot run an EAGLE head)")
@click.option("--rss", is_flag=True, help="measure peak RSS per arm in fresh processes (long generation)")
@click.option("--out", type=click.Path(), default="bench", show_default=True)
@click.option("--markdown", "md", type=click.Path(), default=None, help="update the generated section of this file")
@load_flags(LoadOptions(), "hugepages")
@click.option("--concurrency", default=None,
              help="comma-separated levels (e.g. 1,2,4,8,16): closed-loop load on one engine, arms off / fixed k / policy")
@click.option("--soak-minutes", type=float, default=None,
              help="with --concurrency N: closed-loop load at N for this long, RSS sampled (memory flatness)")
def bench(ctx, engines, workloads, ks, drafts, adaptive, temps, top_p, max_new_tokens, repeats, limit, peer, peer_draft,
          rss, out, md, hugepages, concurrency, soak_minutes):
    """Target-only vs speculative (vs onnxruntime-genai), interleaved in one run; with
    --concurrency, many requests at once on one engine; `bench serve`: over HTTP."""
    if ctx.invoked_subcommand is not None:
        return
    from specrt.runtime.bench.runner import BenchConfig, is_conversations, is_plain

    # by default every plain-prompt workload (conversations run with --concurrency or `bench serve`,
    # schemas with tools/feature_costs.py)
    wl = [Path(w) for w in workloads] or [w for w in sorted(Path("configs/workloads").glob("*.jsonl")) if is_plain(w)]
    if not wl:
        fail("no workloads: pass --workload FILE (JSONL with a 'prompt' field per line)")
    convs = [w for w in wl if is_conversations(w)]
    if convs and len(convs) != len(wl):
        fail("conversation workloads (turns) and prompt workloads run separately")
    bundle = Path(engines or engines_default())
    if convs:
        if not concurrency:
            fail("multi-turn workloads run with --concurrency L (in process) or `specrt bench serve`")
        return _bench_conversations(bundle, wl, concurrency, max_new_tokens, repeats, out, hugepages)
    if concurrency:
        return _bench_load(bundle, wl, concurrency, ks, max_new_tokens, repeats, limit, out, hugepages, soak_minutes)
    cfg = BenchConfig(
        bundle=bundle, workloads=wl, ks=_ints(ks or DEFAULT_KS, "--k"), drafts=[d for d in drafts.split(",") if d],
        temperatures=[float(t) for t in temps.split(",") if t], top_p=top_p, max_new_tokens=max_new_tokens,
        repeats=repeats, limit=limit, peer=peer, rss=rss, out=Path(out), adaptive=adaptive,
        peer_draft=Path(peer_draft) if peer_draft else None,
        global_pool=True,  # what `specrt generate` runs with (docs/design.md, "Benchmark")
        hugepages=hugepages,
    )
    _bench_interleaved(cfg, md)


def _bench_interleaved(cfg, md: str | None) -> None:
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bench import report
    from specrt.runtime.bench.runner import run_bench

    try:
        results = run_bench(cfg, progress)
    except (RuntimeError, *USER_ERRORS) as e:
        fail(str(e))
    click.echo("", err=True)
    click.echo(report.table(results))
    path = report.write_json(results, cfg.out)
    try:
        png = report.plot(results, cfg.out)
        click.echo(f"wrote {path} and {png}")
    except ImportError:
        click.echo(f"wrote {path} (no plot: matplotlib not installed; pip install 'specrt[bench]')")
    if md:
        report.update_markdown(results, Path(md))
        click.echo(f"updated {md}")


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        fail(f"{flag} takes comma-separated integers, got {text!r}")


def _levels(concurrency: str) -> list[int]:
    levels = _ints(concurrency, "--concurrency")
    if not levels or min(levels) < 1:
        fail(f"--concurrency levels must be >= 1, got {concurrency!r}")
    return levels


def _load_k(ks: str | None) -> int | None:
    """The fixed-k arm's k under --concurrency: one value, or None (the bundle's). A list is
    refused: the load bench runs one fixed-k arm, and taking one of several would be a guess."""
    if ks is None:
        return None
    k = _ints(ks, "--k")
    if len(k) != 1:
        fail(f"with --concurrency, --k takes one value (the fixed-k arm's), got {ks!r}")
    return k[0]


def _bench_conversations(bundle: Path, wl, concurrency, max_new_tokens, repeats, out, hugepages):
    """Multi-turn conversations in process: prefix reuse on against off (bench/conversations.py)."""
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bench.conversations import ConversationConfig, run_conversations, table
    from specrt.runtime.bench.runner import load_workload

    cfg = ConversationConfig(bundle, [it for w in wl for it in load_workload(w)], _levels(concurrency),
                             max_new_tokens=max_new_tokens, repeats=max(1, repeats), hugepages=hugepages)
    try:
        results = run_conversations(cfg, progress)
    except (RuntimeError, *USER_ERRORS) as e:
        fail(str(e))
    _report(results, table(results), Path(out) / "conversations.json")


def _report(results: dict, text: str, path: Path) -> None:
    """An in-process load run's table on the terminal and its JSON (with the command) at `path`."""
    from specrt.runtime.bench.report import command_line

    click.echo("", err=True)
    click.echo(text)
    results["command"] = command_line()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    click.echo(f"wrote {path}")


def _bench_load(bundle: Path, wl, concurrency, ks, max_new_tokens, repeats, limit, out, hugepages, soak_minutes=None):
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bench import load
    from specrt.runtime.bench.runner import load_workload

    levels, k = _levels(concurrency), _load_k(ks)
    if soak_minutes and len(levels) != 1:
        fail("--soak-minutes takes one --concurrency level")
    prompts = [it["prompt"] for w in wl for it in load_workload(w)[:limit]]
    cfg = load.LoadConfig(bundle, prompts, levels=levels, max_new_tokens=max_new_tokens, k=k,
                          repeats=max(1, repeats), hugepages=hugepages)
    if soak_minutes:
        res = load.soak(cfg, levels[0], soak_minutes)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "soak.json").write_text(json.dumps(res, indent=1))
        lo, hi = res["rss_after_first_minute_mb"]
        click.echo(f"{res['requests']} requests in {soak_minutes} min at concurrency {levels[0]}: RSS after the first "
                   f"minute {lo:.0f}-{hi:.0f} MB ({100 * res['flatness']:.1f}%); KV {res['kv_bytes_per_slot'] / 2**20:.0f} MiB per slot")
        return
    try:
        results = load.run_load(cfg, progress)
    except (RuntimeError, *USER_ERRORS) as e:
        fail(str(e))
    _report(results, load.table(results), Path(out) / "load.json")
