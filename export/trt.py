"""TensorRT engines from the `standard` lowering (optional; needs `tensorrt` and a GPU).

Loader-style functions, Polygraphy fashion: `profile_for` (pure), `unsupported_ops` (pure),
`engine_from_onnx` (builds serialized bytes), `save_engine`. tensorrt is imported lazily so
everything else in specrt works without it.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from specrt.runtime.backends.trt import gpu_tag
from specrt.runtime.bundle.manifest import ModelEntry, TRTPlan

# First TensorRT release whose ONNX parser imports each op the standard lowering emits
# (TensorRT release notes / onnx-tensorrt operator support; see docs/design.md).
MIN_TRT = {"TensorScatter": (10, 15), "Attention": (10, 14)}


class TensorRTUnavailable(RuntimeError):
    pass


def _trt():
    try:
        import tensorrt
    except ImportError as e:
        raise TensorRTUnavailable(
            "TensorRT is not installed (pip install 'specrt[trt]' on a machine with an NVIDIA GPU; "
            f"its libraries come from NVIDIA's index): {e}"
        ) from None
    return tensorrt


def profile_for(entry: ModelEntry, opt_tokens: int = 5) -> dict[str, list[list[int]]]:
    """Optimization profile: input name -> [min, opt, max] shapes. T spans 1..max_tokens_per_call
    (verification widths), the mask spans 1..S_max, KV buffers are fixed at S_max."""
    io, kv = entry.io, entry.kv
    t_max = entry.max_tokens_per_call
    opt_t = max(1, min(opt_tokens, t_max))
    prof = {
        io.input_ids: [[1, 1], [1, opt_t], [1, t_max]],
        io.attention_mask: [[1, 1], [1, kv.max_seq_len // 2], [1, kv.max_seq_len]],
    }
    if io.hidden_in:  # EAGLE draft: target features, one row per token
        H = entry.hidden_size
        prof[io.hidden_in] = [[1, 1, H], [1, opt_t, H], [1, t_max, H]]
    shape = [1, kv.kv_heads, kv.max_seq_len, kv.head_dim]
    for i in range(kv.layers):
        for name in (io.past_key, io.past_value):
            prof[name.format(i=i)] = [shape, shape, shape]
    return prof


def unsupported_ops(model: onnx.ModelProto, trt_version: tuple[int, int]) -> list[str]:
    """Ops of `model` that the given TensorRT version cannot import ([] = all importable).
    Non-default domains (contrib ops) are never importable: use the `standard` lowering."""
    bad = set()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            bad.add(f"{node.domain}::{node.op_type}")
        elif node.op_type in MIN_TRT and trt_version < MIN_TRT[node.op_type]:
            need = ".".join(map(str, MIN_TRT[node.op_type]))
            bad.add(f"{node.op_type} (needs TensorRT >= {need})")
    return sorted(bad)


def engine_from_onnx(onnx_path: Path, entry: ModelEntry, *, workspace_gb: float = 4.0) -> tuple[bytes, dict]:
    """Build a serialized engine for one model of a bundle. Returns (plan bytes, profile)."""
    trt = _trt()
    version = tuple(int(x) for x in trt.__version__.split(".")[:2])
    model = onnx.load(str(onnx_path), load_external_data=False)
    bad = unsupported_ops(model, version)
    if bad:
        raise ValueError(f"TensorRT {trt.__version__} cannot import {onnx_path}: {', '.join(bad)}")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # Precision comes from the graph's own types (fp16 exports carry fp16 tensors).
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ValueError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
    profile = builder.create_optimization_profile()
    prof = profile_for(entry)
    for name, (lo, opt, hi) in prof.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"TensorRT failed to build an engine for {onnx_path}")
    return bytes(plan), prof


def save_engine(bundle: Path, role: str, entry: ModelEntry) -> TRTPlan:
    """Build and write `<role>/model.<gpu-tag>.plan`; returns the manifest record."""
    trt = _trt()
    plan, prof = engine_from_onnx(bundle / entry.graph, entry)
    tag = gpu_tag()
    rel = f"{role}/model.{tag}.plan"
    (bundle / rel).write_bytes(plan)
    return TRTPlan(file=rel, gpu=tag, trt_version=trt.__version__, profile=prof)
