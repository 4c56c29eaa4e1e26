"""The options, each as one frozen value checked once: what one request asks for
(`RequestOptions`: sampling, penalties, logprobs, a grammar, stop strings, the seed, the length,
a timeout, and how to speculate) and how a bundle is loaded and served (`LoadOptions`, below).

Every entry point builds one: `Pipeline.request` / `generate` / `stream` / `choices` take it
(their keyword arguments build it), the HTTP protocol converts a request body into it
(runtime/serve/schema.py `to_options`), the CLI builds it from its flags. It checks what it
can check alone, in `__post_init__` (an `InvalidRequest` naming the field); what needs the
bundle (the vocabulary, the context, the largest k, a loaded draft model) the pipeline checks.
Plain Python: the runtime installs without the serve extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .bundle.memory import AUTO, DEFAULT_MEMORY_FRACTION
from .errors import InvalidRequest
from .sampling.draws import SamplingConfig
from .sampling.grammar import Constraint
from .sampling.logits import Penalties

# Penalties' field for each option (logits.py checks each; the option's name is what a caller wrote)
_PENALTY_FIELDS = (("frequency_penalty", "frequency"), ("presence_penalty", "presence"),
                   ("repetition_penalty", "repetition"), ("min_tokens", "min_tokens"), ("logit_bias", "logit_bias"))


@dataclass(frozen=True)
class RequestOptions:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    infill: bool = False  # llama.cpp's infill sampler after top-p (runtime/sampling/infill.py; editors' FIM)
    seed: int | None = 0  # numpy Generator seed (any int, reduced mod 2**64); None: fresh entropy
    stop: tuple[str, ...] = ()  # the text ends where one of these begins (runtime/text/textstream.py); "" ignored
    ignore_eos: bool = False  # run to max_new_tokens (benchmarks)
    frequency_penalty: float = 0.0  # OpenAI's, [-2, 2], on new tokens (runtime/sampling/logits.py)
    presence_penalty: float = 0.0  # OpenAI's, [-2, 2], on new tokens
    repetition_penalty: float = 1.0  # > 0, 1 = off; prompt and new tokens
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # token id -> bias in [-100, 100]
    min_tokens: int = 0  # EOS masked until this many new tokens
    logprobs: int | None = None  # report each new token's logprob and this many alternatives (0-20); None: off
    grammar: Constraint | None = None  # the output must match it (runtime/sampling/grammar.py); None: free
    # the tokens must write this text first, and it is not part of the output's text: the prompt's
    # last token taken back (token healing, runtime/sampling/text_prefix.py); "": none
    text_prefix: str = ""
    timeout_s: float | None = None  # from submission; a request still running then ends (stop_reason "timeout")
    k: int | None = None  # draft tokens per round (the ceiling with adaptive k); None: the pipeline's default
    draft: str | None = None  # "model" | "none" | "ngram" | "auto"; None: the pipeline's default
    adaptive: bool | None = None  # choose k per round (runtime/policy/adaptive.py); None: the pipeline's default

    def __post_init__(self):
        stop = (self.stop,) if isinstance(self.stop, str) else (self.stop or ())
        object.__setattr__(self, "stop", tuple(s for s in stop if s))
        object.__setattr__(self, "logit_bias", dict(self.logit_bias or {}))
        self._check_limits()
        self.penalties()
        if self.min_tokens > self.max_new_tokens:
            raise InvalidRequest(f"min_tokens ({self.min_tokens}) exceeds max_new_tokens ({self.max_new_tokens})",
                                 "min_tokens")
        self.sampling()  # InvalidSampling names its field
        self._check_grammar()
        if self.max_new_tokens < 1:
            raise InvalidRequest(f"max_new_tokens must be >= 1, got {self.max_new_tokens}", "max_new_tokens")

    def _check_limits(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise InvalidRequest(f"timeout_s must be > 0, got {self.timeout_s}", "timeout_s")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequest(f"logprobs must be between 0 and 20 alternatives, got {self.logprobs}", "logprobs")

    def _check_grammar(self) -> None:
        if self.grammar is not None and self.text_prefix:
            raise InvalidRequest("text_prefix cannot be combined with a grammar (the grammar reads the output's "
                                 "text from its start)", "text_prefix")
        if self.grammar is None:
            return
        for name in ("ignore_eos", "min_tokens"):  # a complete grammar allows only EOS
            if getattr(self, name):
                raise InvalidRequest(f"{name} cannot be combined with a grammar (the grammar decides where the "
                                     "output ends)", name)

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def penalties(self) -> Penalties:
        """The logits processing these options ask for (`active` False: none)."""
        for param, name in _PENALTY_FIELDS:  # each alone, so the error names its option
            try:
                Penalties(**{name: getattr(self, param)})
            except ValueError as e:
                raise InvalidRequest(str(e), param) from None
        return Penalties(self.frequency_penalty, self.presence_penalty, self.repetition_penalty,
                         dict(self.logit_bias), self.min_tokens)

    def check_vocab(self, vocab: int) -> None:
        """logit_bias's token ids against a vocabulary of `vocab` tokens (the pipeline's check)."""
        try:
            self.penalties().check_vocab(vocab)
        except ValueError as e:
            raise InvalidRequest(str(e), "logit_bias") from None

    def stream_seed(self, sibling: int = 0) -> int | list[int] | None:
        """The random stream of choice `sibling` of one prompt (OpenAI's `n`): [seed, i], choice
        0 the seed's own, so the same seed gives the same choices."""
        if self.seed is None:
            return None
        return self.seed % 2**64 if sibling == 0 else [self.seed % 2**64, sibling]


def request_options(options: RequestOptions | None = None, **overrides) -> RequestOptions:
    """`options` with `overrides` (RequestOptions' field names) replaced; no options: the
    defaults. The keyword form of `Pipeline.generate(prompt, max_new_tokens=...)` lands here."""
    if options is None:
        return RequestOptions(**overrides)
    return replace(options, **overrides) if overrides else options


def default_draft(asked: str | None, has_draft_model: bool) -> str:
    """The drafter a load or request uses: the one asked for, else the bundle's draft model if it
    has one, else none."""
    return asked or ("model" if has_draft_model else "none")


DRAFTS = ("model", "none", "ngram", "auto")  # drafters: the bundle's draft model, none, prompt lookup, either
DEVICES = ("cpu", "cuda", "trt")  # onnxruntime's CPU / CUDA provider, or the bundle's TensorRT plans
DEFAULT_MAX_BATCH = 4  # KV slots allocated at load (`kv_bytes_per_slot` each; docs/benchmarks.md §5)
DEFAULT_DRAFT_WINDOW = 256  # a separate draft reads at most this much of a long prompt (docs/benchmarks.md §18)


@dataclass(frozen=True)
class LoadOptions:
    """How a bundle is loaded and run: the one list of these options. `specrt.load` and
    `Pipeline` take it (or its fields as keywords), the server's and Ray's options hold one
    (runtime/serve/config.py), and the CLI's flags are declared from its fields
    (specrt/cli/common.py). Checked here, once; what needs the bundle (S_max, the widest call,
    whether it has a draft model) is checked at load."""

    draft: str | None = None  # one of DRAFTS; None: the bundle's draft model if it has one, else none
    device: str = "cpu"  # one of DEVICES
    threads: int | None = None  # intra-op threads (None: onnxruntime's default, all cores)
    k: int | None = None  # draft tokens per round (None: the bundle's default_k, else 4)
    adaptive: bool | None = None  # k per round (runtime/policy/adaptive.py); None: on when max_batch > 1
    max_batch: int | str = DEFAULT_MAX_BATCH  # KV slots (requests decoded at once), or "auto": as many as fit
    max_seq_len: int | None = None  # tokens per slot, at most the bundle's S_max (None: S_max)
    memory_fraction: float = DEFAULT_MEMORY_FRACTION  # share of the available memory "auto" fills
    max_queue: int = 64  # requests that may wait for a slot; beyond, calls raise EngineBusy
    prefix_cache: bool = True  # reuse the KV rows of prompt prefixes that slots hold (runtime/engine/prefix.py)
    plan_batches: bool = True  # adaptive rows draft only where it pays in the batch (runtime/policy/plan.py)
    global_pool: bool = False  # one onnxruntime thread pool for the process (then every session must share it)
    hugepages: bool = True  # the sessions' memory on 2 MiB pages after loading (CPU; docs/benchmarks.md §1)
    cost_cache: bool = True  # adaptive k starts from this machine's cached call-cost probe (runtime/policy/cost_cache.py)
    draft_window: int | None = DEFAULT_DRAFT_WINDOW  # committed tokens a separate draft reads to catch up
    #                                                  (runtime/drafters/model.py); None: all of them
    packed: bool = True  # the target's packed graph where the bundle has one: one call per step for
    #                     every row (runtime/backends/packed.py); False: the bundle's graph as before
    kernels: bool = True  # those packed graphs on specrt's own operator where the bundle has them and
    #                      the kernel library is built (`make kernels`; docs/design.md "Our own kernel")

    def __post_init__(self):
        if self.draft is not None and self.draft not in DRAFTS:
            raise ValueError(f"draft must be one of {DRAFTS}, got {self.draft!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        mb = self.max_batch
        if mb != AUTO and (not isinstance(mb, int) or isinstance(mb, bool) or mb < 1):
            raise ValueError(f"max_batch must be a positive integer or 'auto', got {mb!r}")
        self._check_counts()
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory fraction must be in (0, 1], got {self.memory_fraction}")

    def _check_counts(self) -> None:
        for name, least in (("threads", 0), ("k", 0)):  # max_seq_len: the bundle bounds it (at load)
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise ValueError(f"{name} must be an integer >= {least} or None, got {value!r}")
        w = self.draft_window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise ValueError(f"draft_window must be an integer >= 1 or None, got {w!r}")
        if not isinstance(self.max_queue, int) or self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")

    @property
    def want_draft(self) -> bool:
        """Whether the load builds the bundle's draft model (if it has one)."""
        return self.draft in (None, "model", "auto")


def load_options(options: LoadOptions | None = None, **overrides) -> LoadOptions:
    """`options` with `overrides` (LoadOptions' field names) replaced; no options: the defaults.
    `specrt.load(folder, max_batch=8)` lands here."""
    if options is None:
        return LoadOptions(**overrides)
    return replace(options, **overrides) if overrides else options
