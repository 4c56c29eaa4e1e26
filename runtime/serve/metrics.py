"""/metrics in Prometheus text format, with vLLM's metric names under a `specrt:` prefix.

Engine totals (requests running / waiting, speculation counters) are read from the engine's
counters at scrape time (one source of truth, nothing double-counted); latencies are
histograms the server observes per request. Acceptance rate = accepted / draft tokens; mean
acceptance length = 1 + accepted / drafts (as vLLM defines them).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TTFT = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)
_TPOT = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
_E2E = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class _EngineCollector:
    def __init__(self, counters, model: str):
        self.counters, self.model = counters, model

    def collect(self):
        c = self.counters()
        lab = ["model_name"]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(f"specrt:{name}", doc, labels=lab)
            g.add_metric([self.model], value)
            return g

        def counter(name, doc, value):
            m = CounterMetricFamily(f"specrt:{name}", doc, labels=lab)
            m.add_metric([self.model], value)
            return m

        yield gauge("num_requests_running", "Requests in KV slots (prefill or decode).", c["running"])
        yield gauge("num_requests_waiting", "Requests waiting for a slot.", c["waiting"])
        yield gauge("num_slots", "KV slots allocated at load.", c["slots"])
        yield gauge("kv_cache_bytes", "Bytes of the KV pools allocated at load (every slot and pool).", c["kv_bytes"])
        yield counter("spec_decode_num_drafts", "Verification rounds with at least one draft token.", c["drafts"])
        yield counter("spec_decode_num_draft_tokens", "Draft tokens proposed.", c["draft_tokens"])
        yield counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.", c["accepted_tokens"])
        per = CounterMetricFamily("specrt:spec_decode_num_accepted_tokens_per_pos",
                                  "Rounds whose draft token at this position was accepted.", labels=lab + ["position"])
        for j, v in enumerate(c["accepted_per_position"]):
            per.add_metric([self.model, str(j)], v)
        yield per
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", c["prefix_cache_queries"])
        yield counter("prefix_cache_hits", "Prompt tokens whose KV rows were reused from the prefix cache.",
                      c["prefix_cache_hits"])
        yield counter("engine_steps", "Scheduler decode steps.", c["steps"])
        yield counter("engine_step_rows", "Decoding requests summed over steps (rows / steps = batch).", c["rows"])
        yield counter("engine_drafting_steps", "Steps in which at least one request drafted.", c["drafting_steps"])


class Metrics:
    def __init__(self, model: str, counters):
        """counters() -> the engine's snapshot (read at scrape time; its `kv_bytes`: the KV
        pools' size, fixed at load)."""
        self.model = model
        self.registry = r = CollectorRegistry()
        lab = ["model_name"]
        self.prompt_tokens = Counter("specrt:prompt_tokens", "Prompt tokens of finished requests.", lab, registry=r)
        self.generation_tokens = Counter("specrt:generation_tokens", "Generated tokens.", lab, registry=r)
        self.request_success = Counter("specrt:request_success", "Finished requests by finish reason.",
                                       lab + ["finished_reason"], registry=r)
        self.request_errors = Counter("specrt:request_errors", "Requests answered with an error, by HTTP status.",
                                      lab + ["status"], registry=r)
        self.ttft = Histogram("specrt:time_to_first_token_seconds", "Time to first token.", lab, buckets=_TTFT, registry=r)
        self.tpot = Histogram("specrt:time_per_output_token_seconds", "Time per output token after the first.", lab,
                              buckets=_TPOT, registry=r)
        self.e2e = Histogram("specrt:e2e_request_latency_seconds", "End-to-end request latency.", lab, buckets=_E2E,
                             registry=r)
        r.register(_EngineCollector(counters, model))

    def finished(self, prompt_tokens: int, new_tokens: int, reason: str, ttft_s: float | None, tpot_s: float | None,
                 e2e_s: float) -> None:
        m = self.model
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(new_tokens)
        self.request_success.labels(m, reason).inc()
        if ttft_s is not None:
            self.ttft.labels(m).observe(ttft_s)
        if tpot_s is not None:
            self.tpot.labels(m).observe(tpot_s)
        self.e2e.labels(m).observe(e2e_s)

    def error(self, status: int) -> None:
        self.request_errors.labels(self.model, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
