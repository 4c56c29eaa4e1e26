"""`specrt bench serve`: closed-loop HTTP load against `specrt serve` and llama-server, each arm a
server started per level (runtime/bench/serve_load.py; the arms: runtime/bench/arms.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from specrt.runtime.options import LoadOptions

from .bench import bench
from .common import engines_default, engines_option, fail, load_flags, progress


@bench.command("serve")
@engines_option
@click.option("--workload", "workloads", multiple=True, type=click.Path(exists=True, dir_okay=False), help="JSONL prompts or conversations (default chat)")
@click.option("--levels", default="1,2,4,8,16", show_default=True, help="comma-separated concurrency levels")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="output tokens per request (EOS ignored)")
@click.option("--arms", default="specrt-off,specrt-fixed,specrt-policy", show_default=True,
              help="comma-separated: specrt-off, specrt-fixed, specrt-policy, specrt-nocache, specrt-unpacked, "
                   "specrt-nokernels, specrt-off-nokernels, "
                   "rayN (specrt-policy on N Ray Serve replicas, prefix affinity), rayN-pow2 (Ray's default router), "
                   "llama, llama-draft; NAME@ISA pins an instruction set: specrt-policy@avx2 "
                   "(SPECRT_KERNELS_ISA), llama@avx2 (llama.cpp's build-avx2 beside --llama-server's)")
@click.option("--k", "k", type=int, default=None, help="specrt-fixed's k (default: the bundle's)")
@click.option("--llama-server", type=click.Path(), default=None,
              help="llama-server binary (arms llama, llama-draft; default: what `make llama-server` built)")
@click.option("--llama-model", type=click.Path(), default=None,
              help="GGUF of the same weights (default: the GGUF the bundle's target was exported from, if cached)")
@click.option("--llama-draft", type=click.Path(), default=None,
              help="GGUF draft for llama-draft (-md; default: the GGUF of the bundle's draft, if cached)")
@click.option("--llama-draft-max", type=int, default=8, show_default=True)
@load_flags(LoadOptions(), "threads")
@click.option("--requests-per-client", type=int, default=2, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="runs of each arm per level, the arms' order reversed every other run; medians reported")
@click.option("--out", type=click.Path(), default="bench", show_default=True)
def bench_serve(engines, workloads, levels, max_tokens, arms, k, llama_server, llama_model, llama_draft,
                llama_draft_max, threads, requests_per_client, repeats, out):
    """Closed-loop HTTP load (vLLM bench-serve fields) against specrt serve and llama-server."""
    from specrt.runtime.bench import arms as bench_arms
    from specrt.runtime.bench.runner import load_workload
    from specrt.runtime.bench.serve_load import ServeBenchConfig, plot, run_serve_bench, table

    try:
        lv = [int(x) for x in levels.split(",") if x]
    except ValueError:
        fail(f"--levels takes comma-separated integers, got {levels!r}")
    wl = [Path(w) for w in workloads] or [Path("configs/workloads/chat.jsonl")]
    try:
        items = [it for w in wl for it in load_workload(w)]
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot read the workload: {e}")
    convs = [it for it in items if "turns" in it]
    if convs and len(convs) != len(items):
        fail("a workload is either prompts or conversations (turns), not both")
    prompts = [it["prompt"] for it in items if "prompt" in it]
    folder = Path(engines or engines_default())
    llama_model, llama_draft = _ggufs(folder, llama_model, llama_draft)
    servers = bench_arms.Servers(folder, max(lv), threads or os.cpu_count() or 1, k,
                                 llama_server or bench_arms.llama_server(), llama_model, llama_draft, llama_draft_max)
    try:
        chosen = bench_arms.arms([a for a in arms.split(",") if a], servers)
    except ValueError as e:
        fail(str(e))
    cfg = ServeBenchConfig(chosen, prompts, lv, max_tokens, requests_per_client, conversations=convs or None,
                           repeats=repeats)
    try:
        results = run_serve_bench(cfg, progress)
    except RuntimeError as e:
        fail(str(e))
    click.echo("", err=True)
    click.echo(table(results))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "serve.json").write_text(json.dumps(results, indent=1))
    try:
        click.echo(f"wrote {Path(out) / 'serve.json'} and {plot(results, Path(out))}")
    except ImportError:
        click.echo(f"wrote {Path(out) / 'serve.json'}")


def _ggufs(folder: Path, model: str | None, draft: str | None) -> tuple[str | None, str | None]:
    """The GGUF files the llama arms load: the flags', else the ones the bundle came from."""
    from specrt.runtime.bench.arms import gguf_of
    from specrt.runtime.bundle.manifest import BundleError, load_manifest

    try:
        man = load_manifest(folder)
    except BundleError:
        return model, draft  # the specrt arms report the bundle's problem
    return model or gguf_of(man.target), draft or (gguf_of(man.draft) if man.draft else None)
