"""`specrt.json`: the bundle manifest, as typed dataclasses (schema: docs/bundle.md).

Written by the exporter, read by the runtime and by anything else (C++ services) that loads the
graphs itself. Plain JSON; every field has a default so older writers stay readable.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

SCHEMA_VERSION = 2  # 2 added io.hidden_out / io.hidden_in (EAGLE pairs); 1 reads as 2 without them
READABLE_VERSIONS = (1, 2)
MANIFEST = "specrt.json"
# draft recipes that are weight-quantized copies of the target (same architecture, same KV layout)
SELF_DRAFT_PRECISION = {"self-int4": "int4", "self-int8": "int8"}
# graph precision -> dtype of its activations and KV buffers (int4/int8 quantize weights only)
KV_DTYPE = {"fp32": "float32", "fp16": "float16", "int4": "float32", "int8": "float32", "gguf": "float32"}


class BundleError(Exception):
    """A bundle is missing, incomplete, corrupt or from an unsupported schema."""


@dataclass
class IONames:
    input_ids: str = "input_ids"  # int64 [B, T]
    attention_mask: str = "attention_mask"  # int64 [B, P+T], all ones; length = P + T
    logits: str = "logits"  # float32 [B, T, V]
    past_key: str = "past_key_values.{i}.key"  # [B, Hkv, S_max, D], bound to the same buffer
    past_value: str = "past_key_values.{i}.value"  #   as the matching present output
    present_key: str = "present.{i}.key"
    present_value: str = "present.{i}.value"
    hidden_out: str = ""  # float32 [B, T, H] final-norm hidden states ("" = not an output)
    hidden_in: str = ""  # float32 [B, T, H] target features (EAGLE draft input; "" = none)
    # int64 [1] input with a default: logits for the last n positions only ("" = the graph
    # always returns all T rows). Optional and additive, so schema_version stays 2.
    logits_to_keep: str = ""


@dataclass
class KVLayout:
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    dtype: str = "float32"  # numpy dtype name of the KV buffers
    max_seq_len: int = 0  # S_max: buffer length, also the rotary table length

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.itemsize


@dataclass
class TRTPlan:
    file: str = ""  # relative to the bundle
    gpu: str = ""  # device name + compute capability the plan was built on
    trt_version: str = ""
    profile: dict = field(default_factory=dict)  # input name -> [min, opt, max] shapes


@dataclass
class PackedIO:
    """Names of a packed graph's IO (docs/bundle.md "Packed calls"; export/packed.py);
    `{i}` is the layer, `{r}` the lane."""

    lane_index: str = "lane_index.{r}"  # int64 [T_r]: lane r's tokens, indices into the N
    lane_seqlens: str = "lane_seqlens"  # int32 [lanes]: per lane, total length - 1
    unpack_index: str = "unpack_index"  # int64 [N]: token i's row in the lanes' outputs
    logits_index: str = "logits_index"  # int64 [n]: the tokens that get logits
    past_key: str = "past_key_values.{i}.key.lane{r}"  # [1, Hkv, S, D], bound with its present
    past_value: str = "past_key_values.{i}.value.lane{r}"
    present_key: str = "present.{i}.key.lane{r}"
    present_value: str = "present.{i}.value.lane{r}"


@dataclass
class PackedGraph:
    """The target's packed form, when the bundle has one (additive: readers that ignore it run
    `graph` as before)."""

    graph: str = ""  # ONNX file per lane count, relative to the bundle, "{lanes}" in its name
    #                  ("" = none); every one shares the entry's `data`
    lanes: list[int] = field(default_factory=list)  # the lane counts written (sequences one call carries)
    io: PackedIO = field(default_factory=PackedIO)
    kernels: str = ""  # the same graphs with their block-quantized projections on specrt's own
    #                    operators (export/kernel_graph.py, runtime/kernels), "{lanes}" in the name ("" = none)
    kernel_data: str = ""  # the weights file those graphs add (relative to the bundle)
    # every node of the kernel graphs computes a row the same bits at any call width, one row
    # included (export/kernel_graph.py `one_row`): a lone token needs no filler row after it
    # (runtime/backends/packed.py). False (and bundles before it): fillers, as on the portable graphs
    one_row: bool = False

    def file(self, lanes: int) -> str:
        return self.graph.format(lanes=lanes)

    def kernel_file(self, lanes: int) -> str:
        return self.kernels.format(lanes=lanes)

    def lanes_for(self, slots: int) -> int:
        """The fewest lanes that hold `slots` sequences (each lane costs every call a little),
        else the most there are (calls of more rows are split)."""
        return min((n for n in self.lanes if n >= slots), default=max(self.lanes))


@dataclass
class ModelEntry:
    graph: str = ""  # ONNX file, relative to the bundle
    data: str | None = None  # external weights file next to the graph
    lowering: str = "ort"  # "ort" (contrib ops) | "standard" (plain ONNX, TensorRT-ready)
    precision: str = "fp32"  # "fp32" | "fp16" | "int4" | "int8"
    family: str = ""  # specrt architecture family
    model_type: str = ""  # HF config.model_type
    vocab_size: int = 0
    hidden_size: int = 0  # model width (for runtimes that want it, e.g. a genai_config.json)
    num_heads: int = 0  # query heads
    max_tokens_per_call: int = 17  # widest multi-token (verification) call exercised at export
    io: IONames = field(default_factory=IONames)
    kv: KVLayout = field(default_factory=KVLayout)
    source: dict = field(default_factory=dict)  # {kind, ref, sha256}
    recipe: str = ""  # how the weights were made: "export", "self-int4", "self-int8", ...
    default_k: int = 0  # draft entry: draft tokens per round the exporter recommends (0: runtime default)
    parity: dict = field(default_factory=dict)  # numbers measured at export (docs/bundle.md)
    # weight-only targets: method (rtn | gguf), accuracy_level, and per GGUF tensor type its
    # count and the form it took (docs/bundle.md); {} for float graphs
    quantization: dict = field(default_factory=dict)
    trt_plans: list[TRTPlan] = field(default_factory=list)
    packed: PackedGraph = field(default_factory=PackedGraph)  # its packed graphs (export/packed.py)
    # a draft whose LM head computes a frequency-ranked subset of the vocabulary (export/vocab_subset.py):
    # size, corpus, heldout_coverage, ids_sha256, rows_equal, agreement_full_head; {} for a full head
    vocab_subset: dict = field(default_factory=dict)
    # whether the bundle holds the portable graphs (`graph`, `packed.graph`: onnxruntime's own
    # operators, what CUDA, onnxruntime-genai, `--no-kernels` and a CPU without a fast kernel form
    # run). False: only the kernel graphs (`packed.kernels`), whose weights are `packed.kernel_data`
    # and `data` (the rest: embedding, norms); `graph` / `packed.graph` name where
    # `python -m specrt.export.portable BUNDLE` writes them (docs/design.md "Weights stored once")
    portable: bool = True

    @property
    def portable_missing(self) -> bool:
        return not self.portable and bool(self.packed.kernels)


ADD_PORTABLE = "python -m specrt.export.portable {folder}"


def needs_portable(folder, role: str, why: str) -> BundleError:
    """The one line a reader gives where a bundle exported without its portable graphs cannot run."""
    return BundleError(f"bundle {folder} holds only its {role}'s kernel graphs (exported with portable = false) and "
                       f"this load needs its portable graphs ({why}); add them with: {ADD_PORTABLE.format(folder=folder)}")


@dataclass
class FimTokens:
    """Fill-in-the-middle token ids (docs/bundle.md); None where the vocabulary has no such token.
    A FIM prompt needs prefix, suffix and middle; repo_name / file_sep lay out extra files."""

    prefix: int | None = None  # <|fim_prefix|>: the code before the cursor follows
    suffix: int | None = None  # <|fim_suffix|>: the code after the cursor follows
    middle: int | None = None  # <|fim_middle|>: the model writes what goes between
    pad: int | None = None  # <|fim_pad|>
    repo_name: int | None = None  # <|repo_name|>: the repository's name follows (repo-level layout)
    file_sep: int | None = None  # <|file_sep|>: a file's path and text follow

    @property
    def usable(self) -> bool:
        return None not in (self.prefix, self.suffix, self.middle)


@dataclass
class TokenizerInfo:
    file: str = "tokenizer.json"
    config: str = "tokenizer_config.json"
    chat_template: str | None = None  # Jinja template; None: not a chat model
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)  # the model's EOS and end-of-turn tokens
    pad_token_id: int | None = None
    # end of generation: every request stops at any of these (eos_token_ids + the FIM tokens that
    # end a middle or a file + the GGUF's eot/eom/fim ids, as llama.cpp's EOG set); None: a bundle
    # exported before the field, whose set the runtime derives at load (Tokenizer.eog_ids)
    eog_token_ids: list[int] | None = None
    # recorded at export (all None: the vocabulary has none); None: a bundle exported before
    # FIM support, whose tokenizer the runtime searches at load (runtime/bundle/tokenizer.py)
    fim: FimTokens | None = None


@dataclass
class Manifest:
    schema_version: int = SCHEMA_VERSION
    name: str = ""
    exporter_version: str = ""
    created: str = ""
    target: ModelEntry = field(default_factory=ModelEntry)
    draft: ModelEntry | None = None
    tokenizer: TokenizerInfo = field(default_factory=TokenizerInfo)
    # how it was exported: export_bundle's arguments (sources as given, local files made absolute),
    # what `python -m specrt.export.portable` re-runs; {} for bundles exported before the field
    export: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def save(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST
        path.write_text(self.to_json() + "\n")
        return path


def _build(cls, data):
    """Dataclass from a dict, recursing into nested dataclass fields; unknown keys ignored."""
    if data is None:
        return None
    kwargs = {}
    hints = {f.name: f for f in fields(cls)}
    for key, val in data.items():
        f = hints.get(key)
        if f is None:
            continue
        sub = _NESTED.get((cls, key))
        if sub is not None and isinstance(val, list):
            val = [_build(sub, v) for v in val]
        elif sub is not None:
            val = _build(sub, val)
        kwargs[key] = val
    return cls(**kwargs)


_NESTED = {
    (ModelEntry, "io"): IONames,
    (ModelEntry, "kv"): KVLayout,
    (ModelEntry, "trt_plans"): TRTPlan,
    (ModelEntry, "packed"): PackedGraph,
    (PackedGraph, "io"): PackedIO,
    (Manifest, "target"): ModelEntry,
    (Manifest, "draft"): ModelEntry,
    (Manifest, "tokenizer"): TokenizerInfo,
    (TokenizerInfo, "fim"): FimTokens,
}


def manifest_from_dict(data: dict) -> Manifest:
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise BundleError(
            f"unsupported bundle schema_version {version!r}; this specrt reads versions "
            f"{list(READABLE_VERSIONS)} (re-export the bundle with this version of specrt)"
        )
    return _build(Manifest, data)


def load_manifest(folder: str | Path) -> Manifest:
    """Read and check `<folder>/specrt.json`: files it names must exist."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise BundleError(f"no bundle at {folder}: folder does not exist (run `make export` or `specrt export`)")
    if not path.is_file():
        raise BundleError(f"{folder} is not a specrt bundle: {MANIFEST} is missing")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path} is corrupt: {e}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path} is corrupt: expected a JSON object")
    try:
        man = manifest_from_dict(data)
    except TypeError as e:
        raise BundleError(f"{path} is corrupt: {e}") from None
    _check_files(folder, man)
    return man


def _check_files(folder: Path, man: Manifest) -> None:
    """Every file the manifest names exists (an interrupted copy is not a bundle)."""
    named = [(role, rel) for role, entry in (("target", man.target), ("draft", man.draft)) if entry is not None
             for rel in filter(None, [None if entry.portable_missing else entry.graph, entry.data])]
    named += [(role, entry.packed.file(n)) for role, entry in (("target", man.target), ("draft", man.draft))
              if entry is not None and entry.packed.graph and not entry.portable_missing for n in entry.packed.lanes]
    named += [(role, rel) for role, entry in (("target", man.target), ("draft", man.draft))
              if entry is not None and entry.packed.kernels
              for rel in [entry.packed.kernel_data] + [entry.packed.kernel_file(n) for n in entry.packed.lanes]]
    for role, rel in named + [("tokenizer", man.tokenizer.file)]:
        if not (folder / rel).is_file():
            what = rel if role == "tokenizer" else f"{role} file {rel}"
            raise BundleError(f"bundle {folder} is incomplete: {what} is missing")
