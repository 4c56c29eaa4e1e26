"""`specrt.load(bundle)` -> Pipeline: immutable model parts (sessions, buffers, tokenizer) loaded
once; each `generate` / `stream` call is a request with its own sampling settings and stats."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import cost_cache as probe_cache
from .adaptive import AcceptanceModel, AdaptivePolicy, Calibration, Costs, PolicySet, measure_costs
from .backends.ort import OrtBackend
from .decoder import Decoder
from .drafters import AutoDrafter, EagleDrafter, ModelDrafter, NgramDrafter
from .kv import ContextOverflow
from .manifest import SELF_DRAFT_PRECISION, BundleError, load_manifest
from .sampling import SamplingConfig
from .speculate import Speculator, Stats
from .tokenizer import Tokenizer

DRAFTS = ("model", "none", "ngram", "auto")


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: Stats

    def as_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.as_dict()}


class Pipeline:
    def __init__(self, folder: str | Path, *, draft: str = "model", device: str = "cpu",
                 threads: int | None = None, k: int | None = None, global_pool: bool = False, adaptive: bool = False,
                 hugepages: bool = True, cost_cache: bool = True):
        """global_pool: one onnxruntime thread pool for the whole process (faster; but every other
        onnxruntime session in the process must then disable per-session threads).
        hugepages: put the sessions' memory on 2 MiB pages after loading (CPU; ~1-4% faster steps
        for ~0.3-1.7 s more load; repaid after ~1,500-4,000 tokens, so on for services, which is what
        embeds this class; `specrt generate` turns it off; runtime/hugepages.py).
        cost_cache: start adaptive k from this bundle's call-cost probe kept on disk for this
        machine, probing only where there is none (runtime/cost_cache.py); the bench probes
        every run."""
        self.folder = Path(folder)
        self.manifest = load_manifest(self.folder)
        man = self.manifest
        if draft not in DRAFTS:
            raise ValueError(f"draft must be one of {DRAFTS}, got {draft!r}")
        self.tokenizer = Tokenizer(self.folder, man.tokenizer)
        self.global_pool = global_pool
        self.hugepages = hugepages
        self.device, self.threads, self.cost_cache = device, threads, cost_cache
        self.eagle = man.draft is not None and bool(man.draft.io.hidden_in)  # draft reads target features
        # a quantized copy of the target (same KV layout): its cache holds the target's rows
        self.self_draft = man.draft is not None and man.draft.recipe in SELF_DRAFT_PRECISION and not self.eagle
        self.draft_decoder = None
        load_draft = man.draft is not None and draft in ("model", "auto")
        self.target = self._decoder(man.target, device, threads, "target", keep_hidden=self.eagle and load_draft)
        if load_draft:
            # a self-draft (quantized copy of the target, same KV layout) works in the target's
            # own KV buffers: its rows of committed tokens are the target's (ModelDrafter)
            self.draft_decoder = self._decoder(man.draft, device, threads, "draft",
                                               kv_from=self.target.backend if self.self_draft else None)
        if draft in ("model", "auto") and man.draft is None:
            raise BundleError(f"bundle {self.folder} has no draft model; use draft='none' or 'ngram'")
        self.default_draft = draft
        # k: the caller's, else what the exporter recommends for this draft, else 4
        self.default_k = k if k is not None else (man.draft.default_k if man.draft and man.draft.default_k else 4)
        self.default_adaptive = adaptive
        self._costs: Costs | None = None
        # per drafter kind and greedy/sampling (their confidences differ): acceptance per position
        # and P(accept | confidence), learned across requests
        self._learned: dict[tuple[str, bool], tuple[AcceptanceModel, Calibration]] = {}
        self.max_seq_len = man.target.kv.max_seq_len
        self.max_k = man.target.max_tokens_per_call - 1
        self.last: Result | None = None

    def _decoder(self, entry, device, threads, name, keep_hidden: bool = False, kv_from=None) -> Decoder:
        if device == "trt":
            return Decoder(self._trt_backend(entry, name), name, keep_hidden)
        try:
            backend = OrtBackend(self.folder / entry.graph, entry, device=device, threads=threads,
                                 global_pool=self.global_pool, hugepages=self.hugepages,
                                 kv_from=kv_from)
        except Exception as e:  # onnxruntime raises its own exception types on a bad graph
            if isinstance(e, (BundleError, ValueError)):
                raise
            raise BundleError(f"cannot load {name} graph {self.folder / entry.graph}: {str(e)[:300]}") from None
        return Decoder(backend, name, keep_hidden)

    def _trt_backend(self, entry, name):
        from .backends.trt import TrtBackend

        plans = entry.trt_plans
        if not plans:
            raise BundleError(f"bundle {self.folder} has no TensorRT plan for the {name}; "
                              "export with --lowering standard --trt on this GPU")
        try:
            from specrt.export.trt import gpu_tag

            tag = gpu_tag()
            plan = next((p for p in plans if p.gpu == tag), None)
        except ImportError:
            plan = plans[0] if len(plans) == 1 else None
        if plan is None:
            raise BundleError(f"no TensorRT plan of the {name} matches this GPU; plans: {[p.gpu for p in plans]}")
        return TrtBackend(self.folder / plan.file, entry)

    def drafter(self, draft: str):
        if draft == "none":
            return None
        if draft == "ngram":
            return NgramDrafter(max_proposal=self.max_k)
        if draft in ("model", "auto"):
            if self.draft_decoder is None:
                raise BundleError(f"bundle {self.folder} has no draft model (or it was not loaded); "
                                  "use draft='none' or 'ngram'")
            # a self-draft (quantized copy of the target) keeps the target's K/V rows of committed
            # tokens: shares its buffers on the host, else copies the rows
            kv_source = self.target if self.self_draft else None
            model = (EagleDrafter(self.draft_decoder, self.target) if self.eagle
                     else ModelDrafter(self.draft_decoder, kv_source))
            return model if draft == "model" else AutoDrafter(model, NgramDrafter(max_proposal=self.max_k))
        raise ValueError(f"draft must be one of {DRAFTS}, got {draft!r}")

    def costs(self) -> Costs:
        """Call costs on this machine: the cached probe, else measured once (first adaptive
        request) and cached."""
        if self._costs is None:
            key = None
            if self.cost_cache:
                try:  # a cache problem of any kind means a fresh probe, never a failed request
                    key = probe_cache.key(
                        self.folder, self.manifest, threads=self.threads,
                        device=getattr(self.target.backend, "device_type", self.device),
                        extra=(f"draft={self.draft_decoder is not None} pool={self.global_pool} "
                               f"hugepages={self.hugepages}"))
                    self._costs = probe_cache.load(key)
                except Exception:
                    key = None
            if self._costs is None:
                self._costs = measure_costs(self.target, self.draft_decoder, self.max_k + 1)
                if key:
                    probe_cache.save(key, self._costs)  # never raises: no cache then
        return self._costs

    def policy(self, draft: str, greedy: bool = True) -> AdaptivePolicy | PolicySet:
        """A fresh policy per request over the learned state of this drafter kind; `auto` gets
        one per route (its n-gram rounds learn apart, its model rounds share the model's state)."""
        if draft == "auto":
            return PolicySet({"ngram": self._policy("auto:ngram", True, greedy),
                              "model": self._policy("model", False, greedy)})
        return self._policy(draft, draft == "ngram", greedy)

    def _policy(self, key: str, lookup: bool, greedy: bool) -> AdaptivePolicy:
        base = self.costs()
        # a copy per request (it is updated online); a lookup costs next to nothing
        draft_ms = 0.01 * base.target_ms[1] if lookup else base.draft_ms
        costs = Costs(dict(base.target_ms), draft_ms=draft_ms)
        if (key, greedy) not in self._learned:
            self._learned[(key, greedy)] = (AcceptanceModel(self.max_k), Calibration())
        acc, cal = self._learned[(key, greedy)]
        return AdaptivePolicy(costs, self.max_k, acceptance=acc, calibration=cal)

    def check_request(self, n_prompt: int, max_new_tokens: int, k: int):
        if n_prompt == 0:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not 0 <= k <= self.max_k:
            raise ValueError(f"k must be between 0 and {self.max_k} (the bundle's max_tokens_per_call - 1), got {k}")
        if n_prompt + max_new_tokens > self.max_seq_len:
            raise ContextOverflow(
                f"prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the bundle's "
                f"context of {self.max_seq_len} tokens; shorten the prompt, lower max_new_tokens to at most "
                f"{max(0, self.max_seq_len - n_prompt)}, or re-export with a larger --max-seq-len"
            )

    def stream_ids(self, prompt_ids: list[int], *, max_new_tokens: int = 128, temperature: float = 0.0,
                   top_k: int = 0, top_p: float = 1.0, seed: int | None = 0, k: int | None = None,
                   draft: str | None = None, stats: Stats | None = None,
                   ignore_eos: bool = False, adaptive: bool | None = None) -> Iterator[list[int]]:
        """Token-level generation: yields committed chunks of new token ids.
        ignore_eos: run to max_new_tokens (benchmarks)."""
        cfg = SamplingConfig(temperature, top_k, top_p)
        k = self.default_k if k is None else k
        self.check_request(len(prompt_ids), max_new_tokens, k)
        draft = draft or self.default_draft
        adaptive = self.default_adaptive if adaptive is None else adaptive
        policy = self.policy(draft, cfg.greedy) if adaptive and draft != "none" else None
        spec = Speculator(self.target, self.drafter(draft), policy)
        yield from spec.run(list(prompt_ids), cfg, k=k, max_new_tokens=max_new_tokens,
                            eos_ids=set() if ignore_eos else self.tokenizer.eos_ids, seed=seed, stats=stats)

    def stream(self, prompt: str, *, chat: bool = True, stop: list[str] | None = None, **kw) -> Iterator[str]:
        """Yields text pieces as tokens are committed; the full Result is in `self.last` after.
        With stop strings, text that could be the start of one is held back until resolved."""
        ids = self.tokenizer.encode(prompt, chat=chat)
        stats = Stats()
        out: list[int] = []
        dec = self.tokenizer.stream()
        stops = [s for s in (stop or []) if s]
        hold = max((len(s) for s in stops), default=1) - 1
        full, emitted = "", 0
        gen = self.stream_ids(ids, stats=stats, **kw)
        try:
            for chunk in gen:
                out.extend(chunk)
                full += dec.push(chunk)
                cut = _find_stop(full, stops, max(0, emitted - hold))
                if cut is not None:
                    full = full[:cut]
                    stats.stop_reason = "stop"
                    break
                safe = len(full) - hold
                if safe > emitted:
                    yield full[emitted:safe]
                    emitted = safe
            else:
                full += dec.flush()
        finally:
            gen.close()
            self.last = Result(full, out, stats)
        if len(full) > emitted:  # not in `finally`: a closed generator must not yield
            yield full[emitted:]

    def generate(self, prompt: str, **kw) -> Result:
        for _ in self.stream(prompt, **kw):
            pass
        return self.last


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    """Earliest index >= start where any stop string begins in text."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def load(folder: str | Path = "engines/default", **kw) -> Pipeline:
    return Pipeline(folder, **kw)
