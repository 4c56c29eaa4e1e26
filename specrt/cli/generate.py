"""`specrt generate`: one prompt through the speculation loop, streamed to the terminal (or one
JSON object), with the run's statistics on stderr."""

from __future__ import annotations

import json
import sys

import click

from specrt.runtime.options import LoadOptions

from .common import engines_default, engines_option, fail, load_flags, loading

# one request: one KV slot, fixed k, no 2 MiB pages (a one-shot process does not earn back their load time)
GENERATE_LOADING = LoadOptions(max_batch=1, adaptive=False, hugepages=False, global_pool=True)


@click.command()
@click.argument("prompt", required=False)
@engines_option
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy")
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@load_flags(GENERATE_LOADING, "k", "draft", "adaptive")
@click.option("--chat/--raw", default=True, help="apply the chat template (default) or send text as is")
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object {text, token_ids, stats}")
@click.option("--stats", "show_stats", is_flag=True, help="print all statistics after the text")
@load_flags(GENERATE_LOADING, "device", "threads", "hugepages", "max_seq_len", "draft_window", "packed", "kernels")
def generate(prompt, engines, max_new_tokens, temperature, top_k, top_p, seed, chat, stop, as_json, show_stats,
             **flags):
    """Generate from PROMPT (or '-' / nothing: read stdin) with speculative decoding."""
    from specrt.runtime import MODEL_ERRORS, USER_ERRORS, RequestOptions, load

    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    o = loading(GENERATE_LOADING, flags)
    try:
        pipe = load(engines or engines_default(), o)
        draft = pipe.default_draft  # None followed the bundle
        opts = RequestOptions(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                              seed=seed, k=o.k if draft != "none" else 0, stop=stop, adaptive=o.adaptive)
        if as_json:
            out = pipe.generate(prompt, opts, chat=chat).as_dict()
            click.echo(json.dumps({**out, "kernels": pipe.parts.kernel_form}))
            return
        res = _stream(pipe, prompt, opts, chat)
    except USER_ERRORS as e:
        fail(str(e))
    except MODEL_ERRORS as e:  # the model or its export is broken, not the input
        fail(str(e), 1)
    except KeyboardInterrupt:
        click.echo("", err=True)
        sys.exit(130)
    s = res.stats
    summary = (f"[{s.new_tokens} tokens, {s.tokens_per_s:.1f} tok/s, {s.tpot_ms:.1f} ms/token, "
               f"TTFT {s.ttft_ms:.0f} ms, kernels={pipe.parts.kernel_form}, draft={draft}")
    if draft != "none":
        summary += (f", k={'adaptive' if o.adaptive else pipe.default_k}"
                    f", acceptance {s.acceptance_rate:.2f}, {s.mean_accepted_per_round:.2f} tokens/round")
    click.echo(summary + f", stop: {s.stop_reason}]", err=True)
    if show_stats:
        click.echo(json.dumps(s.as_dict(), indent=2), err=True)


def _stream(pipe, prompt: str, opts, chat: bool):
    """The text as it comes; Ctrl-C ends the request and keeps what was generated."""
    try:
        for piece in pipe.stream(prompt, opts, chat=chat):
            click.echo(piece, nl=False)
            sys.stdout.flush()
    except KeyboardInterrupt:
        click.echo("")
        if pipe.last is not None:
            pipe.last.stats.stop_reason = "interrupted"
    click.echo("")
    return pipe.last
