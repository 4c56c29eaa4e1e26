"""`specrt serve --replicas N`: the same HTTP API on Ray Serve, in Ray Serve LLM's layers.

- `SpecrtIngress` (one replica, no CPU reserved): the FastAPI app of app.py over the same
  `OpenAIServing` as the single-process server — it parses, authorizes, tokenizes (the router
  needs the prompt's token ids) and maps errors (errors.py) — with `RayClient` as its engine client,
  which calls the engine deployment through a `DeploymentHandle` (`stream=True`); a replica
  that fails is a `ReplicaFailed`, mapped as every other error. It records the latency
  histograms; engine counters are the replicas' own, summed from their routing stats.
- `SpecrtEngine` (N replicas, each loads the bundle once): a thin shell over `EngineServer`,
  the single-process `LocalClient`, whose `generate` yields values — a `Head` (the replica, or
  the error the request got), then SSE lines or the JSON body, then `Finished` (what /metrics
  records). `check_health` fails
  when the engine cannot serve; `record_routing_stats` reports slots in use, queue depth, the
  block hashes its idle slots hold and its counters.
- The handle's router (router.py): prefix affinity (`--router prefix`) or Ray's default
  power-of-two choices (`pow2`).

`build(args)` is the application builder that `serve run` / `serve deploy` call with a config
file's `args` (configs/ray_serve.yaml); the CLI calls it too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi.responses import JSONResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from ...bundle.manifest import load_manifest
from ...bundle.memory import AUTO
from ...bundle.tokenizer import Tokenizer
from ...engine import EngineBusy
from ...engine.counters import Counters
from ..app import make_app
from ..config import ServeOptions, ServerConfig
from ..errors import APIError, ReplicaFailed, as_api_error
from ..metrics import Metrics
from ..schema import ErrorInfo, dump
from ..serving import LocalClient, OpenAIServing
from ..shape import sse_error
from ..streaming import SSE_HEADERS, Stream, watch_disconnect
from .affinity import BLOCK, block_hashes, replica_stats
from .router import PowerOfTwoRouter, PrefixAffinityRouter

log = logging.getLogger("specrt.serve")
REPLICA_HEADER = "x-specrt-replica"  # names the engine replica that served a request
APP_NAME = "specrt"
ENGINE = "SpecrtEngine"
RETRIES = 2  # a request whose replica died before answering is sent again this many times
INGRESS_MAX = 4096  # requests one ingress replica holds at once (HTTP relays, no CPU work)
ROUTERS = {"prefix": PrefixAffinityRouter, "pow2": PowerOfTwoRouter}
_REPLICA_GONE = (RayActorError, ActorUnavailableError)  # a replica died under a request


@dataclass(frozen=True)
class RayOptions(ServeOptions):
    """What `specrt serve --replicas` and a config file's `args` set (flat, the CLI's names:
    `from_args`): the single-process server's options (config.py; loading.max_batch a count: KV
    slots per replica, loading.threads: intra-op threads per replica) and the deployment's."""

    replicas: int | None = None  # fixed count (with min/max: the initial count)
    min_replicas: int | None = None  # autoscaling between min and max (both needed)
    max_replicas: int | None = None
    replica_cpus: float | None = None  # CPUs each engine replica reserves (None: threads, else 1)
    router: str = "prefix"  # "prefix" (affinity) or "pow2" (Ray's default)
    imbalance: int = 2  # prefix router: requests more than the least loaded replica past which affinity yields

    def __post_init__(self):
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {sorted(ROUTERS)}, got {self.router!r}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("min_replicas and max_replicas go together")
        if self.min_replicas is not None and not 0 < self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 < min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.replicas is not None and self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.loading.max_batch == AUTO:  # each replica would size itself to the whole machine's memory
            raise ValueError("max_batch 'auto' sizes one process: give replicas a slot count")

    @property
    def cpus(self) -> float:
        return self.replica_cpus if self.replica_cpus is not None else float(self.loading.threads or 1)


# ---- what travels between the ingress and an engine replica ---------------------------------

@dataclass
class EngineRequest:
    """One generation call: the validated body, its prompt's token ids (the router hashes
    them), the field a too-long prompt is blamed on, and the response shape (`ChatOutput` /
    `CompletionOutput` of outputs.py, whose id the ingress chose)."""

    body: object
    ids: list[int]
    prompt_param: str
    out: object


@dataclass
class Head:
    """First value of every reply: the replica, and the error if the request was refused."""

    replica: str
    status: int = 200
    error: ErrorInfo | None = None
    headers: dict = field(default_factory=dict)


@dataclass
class Finished:
    """Last value of a reply that ended normally: `Metrics.finished`'s arguments."""

    record: tuple


# ---- the engine side ------------------------------------------------------------------------

def _held_blocks(prefixes: list[list[int]], block: int) -> list[int]:
    """Block hashes of the token runs the replica's idle slots hold."""
    return sorted({h for toks in prefixes for h in block_hashes(toks, block)})


class EngineServer:
    """One replica's pipeline (the single-process server's engine client) behind value-yielding
    calls; no Ray here (tests drive it directly)."""

    def __init__(self, cfg: ServerConfig, load, replica: str):
        """load() -> Pipeline, run now: the replica is ready when constructed (raises if not)."""
        self.replica = replica
        self.local = LocalClient(cfg, load)
        self.local.load()
        if self.local.pipe is None:
            raise RuntimeError(f"cannot load {cfg.model_id}: {self.local.error}")

    async def generate(self, req: EngineRequest):
        """Head, then SSE lines (`stream: true`) or one JSON body (a dict), then Finished when
        the request ended normally. Closing the generator cancels the request."""
        try:
            reply = self.local.start(req.body, req.ids, req.prompt_param, req.out)
        except Exception as e:  # noqa: BLE001 - an error value, mapped as the single-process server does
            err = as_api_error(e, "POST", "engine")
            yield Head(self.replica, err.status_code, err.info, dict(err.headers or {}))
            return
        try:  # however this generator ends (even closed at its first yield), the requests stop
            yield Head(self.replica)
            if req.body.stream:
                async for line in reply.sse(req.body.include_usage):
                    yield line
            else:
                yield dump(await reply.collect())
            for record in reply.finished:  # one per choice that ended normally
                yield Finished(record)
        finally:
            reply.cancel()  # requests that already finished ignore it

    def unhealthy(self) -> str | None:
        """Why this replica cannot serve, or None."""
        return None if self.local.pipe.alive() else "the engine thread is dead or the engine closed"

    def routing_stats(self) -> dict:
        pipe = self.local.pipe
        c = pipe.counters()
        return {"running": c["running"], "waiting": c["waiting"], "slots": c["slots"], "block": BLOCK,
                "held_blocks": _held_blocks(pipe.held_prefixes(), BLOCK), "counters": c}

    def close(self) -> None:
        self.local.close()


@serve.deployment(name=ENGINE)
class SpecrtEngine:
    """An engine replica: loads the bundle once and serves `generate` calls."""

    def __init__(self, opts: dict):
        o = RayOptions.from_args(**opts)
        replica = serve.get_replica_context().replica_id.unique_id
        self.server = EngineServer(o.server_config(), o.load, replica)

    async def generate(self, req: EngineRequest):
        async for item in self.server.generate(req):
            yield item

    def record_routing_stats(self) -> dict:
        return self.server.routing_stats()

    def check_health(self) -> None:
        reason = self.server.unhealthy()
        if reason:
            raise RuntimeError(reason)

    def __del__(self):  # Serve calls it when the replica stops, after its requests drained
        server = getattr(self, "server", None)
        if server is not None:
            server.close()


# ---- the ingress side -----------------------------------------------------------------------

@dataclass
class _Frontend:
    """What the shared routes need of a pipeline: the tokenizer and the context length."""

    tokenizer: Tokenizer
    max_seq_len: int


def sum_counters(snapshots: list[dict]) -> dict:
    """Engine counters of several replicas summed (per-position lists element-wise; a slot's
    KV bytes, the same in every replica, are not a total: the largest); zeros for none, so
    /metrics names every series before the first request."""
    out = Counters().snapshot() | {"running": 0, "waiting": 0, "slots": 0, "kv_bytes_per_slot": 0, "kv_bytes": 0}
    for c in snapshots:
        for k, v in c.items():
            if k == "kv_bytes_per_slot":
                out[k] = max(out[k], v)
            elif isinstance(v, list):
                acc = out.setdefault(k, [])
                acc.extend([0] * (len(v) - len(acc)))
                out[k] = [a + b for a, b in zip(acc, v + [0] * (len(acc) - len(v)), strict=True)]
            elif isinstance(v, (int, float)):
                out[k] = out.get(k, 0) + v
    return out


def _replica_failed(e: Exception, headers: dict | None = None) -> ReplicaFailed:
    return ReplicaFailed(f"the replica serving this request failed ({type(e).__name__}); retry", headers)


class RayClient:
    """`OpenAIServing`'s engine client (serving.py) over the engine deployment: the prompt goes to a
    replica chosen by the handle's router, the reply comes back as values (`EngineServer`)."""

    def __init__(self, cfg: ServerConfig, folder: Path, engine: DeploymentHandle, engine_name: str = ENGINE,
                 max_seq_len: int | None = None):
        """max_seq_len: the replicas' context per slot (None: the bundle's S_max)."""
        man = load_manifest(folder)
        self.front = _Frontend(Tokenizer(folder, man.tokenizer), max_seq_len or man.target.kv.max_seq_len)
        self.engine = engine.options(stream=True)
        self.engine_name = engine_name
        self.metrics = Metrics(cfg.model_id, self.engine_counters)
        self._health: tuple[float, tuple] = (0.0, (503, {}))

    def ready(self):
        return self.front  # requests wait in the router's queue while no replica runs (bounded: 503)

    def close(self) -> None:
        pass  # the replicas stop with their deployment

    def engine_counters(self) -> dict:
        """The replicas' engine counters summed (from their latest routing stats, ~1 s old)."""
        return sum_counters([s["counters"] for s in replica_stats(self.engine_name).values() if "counters" in s])

    async def health(self) -> tuple[int, dict]:
        """200 while at least one engine replica is running (asked of the Serve controller,
        at most once a second)."""
        t, answer = self._health
        if time.monotonic() - t > 1.0:
            answer = await asyncio.to_thread(self._ask_health)
            self._health = (time.monotonic(), answer)
        return answer

    def _ask_health(self) -> tuple[int, dict]:
        try:
            app = serve.status().applications[serve.get_replica_context().app_name]
            states = app.deployments[self.engine_name].replica_states
        except Exception as e:  # noqa: BLE001 - no answer from the controller is not ready
            return 503, {"status": "error", "error": f"cannot read the deployment's status: {e}"}
        running = states.get("RUNNING", 0)
        if running:
            return 200, {"status": "ok", "replicas": running}
        return 503, {"status": "loading", "replicas": 0, "replica_states": {str(k): v for k, v in states.items()}}

    async def respond(self, req, ids: list[int], prompt_param: str, out, request):
        gen, head = await self._open(EngineRequest(req, ids, prompt_param, out))
        headers = {REPLICA_HEADER: head.replica}
        if head.error is not None:
            raise APIError(head.status, head.error.message, head.error.type, head.error.param, head.error.code,
                           {**head.headers, **headers})
        if req.stream:
            return Stream(self._relay(gen, out), gen.cancel, media_type="text/event-stream",
                          headers={**SSE_HEADERS, **headers})
        return await self._collect(gen, request, headers)

    async def _open(self, call: EngineRequest):
        """Send the call and wait for its Head. A replica that died before answering: sent
        again (the router picks a live one); a full queue: 503."""
        for attempt in range(RETRIES + 1):
            gen = self.engine.generate.remote(call)
            try:
                return gen, await gen.__anext__()
            except BackPressureError as e:
                raise EngineBusy(f"every replica and the queue are full ({e}); retry later") from None
            except (*_REPLICA_GONE, DeploymentUnavailableError) as e:
                log.warning("specrt: replica failed before answering (try %d): %s", attempt + 1, e)
        raise ReplicaFailed("the engine replicas failed; retry later")

    async def _collect(self, gen, request, headers: dict):
        watcher = asyncio.ensure_future(watch_disconnect(request, gen.cancel))
        body = None
        try:
            async for item in gen:
                if isinstance(item, Finished):
                    self.metrics.finished(*item.record)
                else:
                    body = item
        except _REPLICA_GONE as e:
            raise _replica_failed(e, headers) from None
        finally:
            watcher.cancel()
        return JSONResponse(body, headers=headers)

    async def _relay(self, gen, out):
        """The replica's SSE lines; a replica that dies mid-stream ends the stream with an
        error chunk and [DONE], never a hang."""
        try:
            async for item in gen:
                if isinstance(item, Finished):
                    self.metrics.finished(*item.record)
                else:
                    yield item
        except _REPLICA_GONE as e:
            log.error("specrt: replica failed mid-stream of %s: %s", out.id, e)
            yield sse_error(_replica_failed(e))


@serve.deployment(name="SpecrtIngress")
@serve.ingress()
class SpecrtIngress:
    """The HTTP API (app.py's routes) over `OpenAIServing` with the engine replicas as its engine client."""

    def __init__(self, engine: DeploymentHandle, opts: dict):
        o = RayOptions.from_args(**opts)
        cfg = o.server_config()
        self.serving = OpenAIServing(cfg, RayClient(cfg, o.folder, engine, max_seq_len=o.loading.max_seq_len))

    def __serve_build_asgi_app__(self):
        return make_app(self.serving)


# ---- the application ------------------------------------------------------------------------

def engine_options(o: RayOptions) -> dict:
    """The engine deployment's Ray Serve options. A replica takes as many requests as it has
    slots (`max_ongoing_requests`): the rest wait in the router, which can still choose where
    they go, and a replica that dies loses only requests it was running. Autoscaling targets
    the slots too: a deployment whose replicas are full and whose router holds more grows."""
    slots = o.loading.max_batch
    opts = dict(max_ongoing_requests=slots, max_queued_requests=o.loading.max_queue,
                ray_actor_options={"num_cpus": o.cpus}, graceful_shutdown_timeout_s=o.grace,
                health_check_period_s=2.0, health_check_timeout_s=30.0,
                request_router_config=RequestRouterConfig(
                    request_router_class=ROUTERS[o.router],
                    request_router_kwargs={"imbalance": o.imbalance} if o.router == "prefix" else {},
                    request_routing_stats_period_s=1.0, request_routing_stats_timeout_s=5.0))
    if o.min_replicas is not None:
        opts["autoscaling_config"] = AutoscalingConfig(
            min_replicas=o.min_replicas, max_replicas=o.max_replicas,
            initial_replicas=o.replicas if o.replicas is not None else o.min_replicas,
            target_ongoing_requests=slots, upscale_delay_s=5.0, downscale_delay_s=60.0)
    else:
        opts["num_replicas"] = o.replicas or 1
    return opts


def build(args: dict):
    """Ray Serve application builder (`import_path: specrt.runtime.serve.ray.deploy:build`):
    `args` are `RayOptions.from_args`'s (flat: the CLI's names). The bundle is checked here,
    before any replica starts."""
    o = RayOptions.from_args(**args)
    o.server_config()  # the bundle's manifest reads, or the deploy fails now with its error
    opts = o.args() | {"engines": str(o.folder)}
    engine = SpecrtEngine.options(**engine_options(o)).bind(opts)
    # the ingress only relays: it takes every request (Ray's default of 5 would queue them at
    # the proxy, unbounded) and the engine's router queue is the bound that answers 503
    return SpecrtIngress.options(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_MAX,
                                 graceful_shutdown_timeout_s=o.grace).bind(engine, opts)
