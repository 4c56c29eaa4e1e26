"""`specrt serve`: the OpenAI-compatible server over one engine (uvicorn), or over N engine
replicas on Ray Serve (`--replicas`, runtime/serve/ray/deploy.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import click

from specrt.runtime.serve.config import SERVE_LOADING

from .common import engines_default, engines_option, fail, load_flags, loading


@click.command()
@engines_option
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (0.0.0.0: every interface)")
@click.option("--port", type=int, default=8000, show_default=True)
@load_flags(SERVE_LOADING, "max_batch", "max_seq_len", "memory_fraction", "max_queue", "draft", "adaptive", "k",
            memory_fraction=None)
@click.option("--api-key", default=None, envvar="SPECRT_API_KEY", help="require 'Authorization: Bearer KEY' on /v1/*")
@click.option("--request-timeout", type=float, default=None, help="seconds; a request still running then ends")
@click.option("--max-body-mb", type=float, default=1.0, show_default=True, help="larger request bodies get 413")
@click.option("--grace", type=float, default=30.0, show_default=True, help="seconds in-flight requests get after SIGTERM")
@load_flags(SERVE_LOADING, "threads", "hugepages", "prefix_cache", "draft_window", "packed", "kernels")
@click.option("--fim-window", default="1536,512", show_default=True, callback=lambda c, p, v: _fim_window(v),
              help="fill-in-the-middle prompts keep at most PREFIX,SUFFIX tokens of the file around the cursor "
                   "('none': the whole file)")
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
    # opts: the server's flags (runtime/serve/config.py `ServeOptions`) and the load's (`LoadOptions`)
    opts["engines"] = str(opts["engines"] or engines_default())
    if replicas is not None or min_replicas is not None or max_replicas is not None:
        if opts["max_batch"] == "auto" or memory_fraction is not None:
            # each replica would size itself to the whole machine's memory
            fail("--max-batch auto / --memory-fraction size one process: give replicas a slot count")
        return _serve_ray(host, port, ray_address, dict(opts, replicas=replicas, min_replicas=min_replicas,
                                                        max_replicas=max_replicas, router=router,
                                                        replica_cpus=replica_cpus))
    try:
        import uvicorn

        from specrt.runtime.serve.app import build_app
    except ImportError as e:
        fail(f"serve needs the serve extra (pip install 'specrt[serve]'): {e}")
    from specrt.runtime.serve.config import ServeOptions

    if memory_fraction is not None:
        opts["memory_fraction"] = memory_fraction
    load_opts = loading(SERVE_LOADING, opts)  # takes the load's flags out of opts
    o = ServeOptions(loading=load_opts, **opts)
    cfg, sizing = _size_serve(o)
    failed: list = []
    server = None

    def _stop(e):
        failed.append(e)
        server.should_exit = True

    sized = replace(o, loading=replace(o.loading, max_batch=sizing.slots, max_seq_len=sizing.seq))
    app = build_app(cfg, sized.load, on_load_error=_stop)
    click.echo(f"specrt: serving {cfg.model_id} from {o.engines} on http://{host}:{port}/v1 "
               f"({sizing.summary()}; draft={cfg.draft}{', adaptive' if cfg.adaptive else ''}; "
               f"{kernel_note(o)})", err=True)
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
        fail(f"cannot load {o.engines}: {failed[0]}")
    if not server.started:
        fail(f"could not start the server on {host}:{port} (port in use?)")


def kernel_note(o) -> str:
    """`kernels=FORM`, or where the load runs none of specrt's operators, why and what runs
    instead (runtime/kernels.form_for: e.g. a CPU with no fast form): said once, at startup."""
    from specrt.runtime import kernels
    from specrt.runtime.bundle.manifest import load_manifest

    if not o.loading.packed:
        return "kernels=none (--no-packed: the bundle graph runs)"
    packed = load_manifest(Path(o.engines)).target.packed
    form, why = kernels.form_for(bool(packed.graph and packed.kernels), o.loading.kernels)
    return f"kernels={form}" + (f": {why}" if why else "")


def _fim_window(value: str) -> str:
    from specrt.runtime.text.fim import FimWindow

    try:
        FimWindow.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def _size_serve(o):
    """(the server's config, the load's sizing), before the port opens: a load that cannot fit
    fails now, and `auto` is resolved once (the load checks that count again against what is
    available then)."""
    from specrt.runtime import USER_ERRORS
    from specrt.runtime.bundle.loader import size_load
    from specrt.runtime.bundle.manifest import load_manifest

    folder, lo = Path(o.engines), o.loading
    try:
        man = load_manifest(folder)
        cfg = o.server_config(man)
        sizing = size_load(folder, man, want_draft=man.draft is not None and cfg.draft in ("model", "auto"),
                           device="cpu", max_batch=lo.max_batch, max_seq_len=lo.max_seq_len,
                           memory_fraction=lo.memory_fraction, packed=lo.packed, draft_window=lo.draft_window)
    except USER_ERRORS as e:
        fail(str(e))
    return cfg, sizing


def _serve_ray(host: str, port: int, ray_address: str | None, args: dict) -> None:
    """`specrt serve --replicas N`: deploy on Ray Serve (a local Ray instance unless
    --ray-address), serve until SIGTERM / Ctrl-C, then drain every replica (--grace) and stop
    what this command started; exit 0."""
    try:
        import ray
        from ray import serve as rserve

        from specrt.runtime.serve.ray.deploy import APP_NAME, RayOptions, build
    except ImportError as e:
        fail(f"--replicas needs the ray extra (pip install 'specrt[ray]'): {e}")
    from specrt.runtime import USER_ERRORS

    try:
        o = RayOptions.from_args(**args)
        o.server_config()
    except (*USER_ERRORS, OSError) as e:
        fail(str(e))
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
