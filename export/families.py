"""Per-architecture knowledge as data: one `Family` record per transformer family.

The graph emitter (`graph.py`) reads only these fields; adding a Llama-like family is a new
record here, not a new code path. Weight names follow the Hugging Face checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # HF `config.model_type` values this record covers
    qkv_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before rotary (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # RMSNorm applies (offset + w); Gemma stores w - 1
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size) (Gemma)
    activation: str = "silu"  # gated MLP activation: "silu" | "gelu_tanh"
    sandwich_norm: bool = False  # extra norms after attention and after the MLP (Gemma 3)
    attn_scale_key: str | None = None  # config field whose ^-0.5 scales q·k; None: head_dim
    # Weight names below the layer prefix `model.layers.{i}.`
    mlp_norm: str = "post_attention_layernorm"  # norm in front of the MLP
    attn_out_norm: str | None = None  # norm applied to the attention output (sandwich)
    mlp_out_norm: str | None = None  # norm applied to the MLP output (sandwich)


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama", "mistral", "smollm", "smollm2")),
    Family("qwen2", ("qwen2",), qkv_bias=True),
    Family("qwen3", ("qwen3",), qk_norm=True),
    Family(
        "gemma3",
        ("gemma3_text", "gemma3"),
        qk_norm=True,
        norm_offset=1.0,
        embed_scale=True,
        activation="gelu_tanh",
        sandwich_norm=True,
        attn_scale_key="query_pre_attn_scalar",
        mlp_norm="pre_feedforward_layernorm",
        attn_out_norm="post_attention_layernorm",
        mlp_out_norm="post_feedforward_layernorm",
    ),
)

SUPPORTED_MODEL_TYPES = tuple(t for f in FAMILIES for t in f.model_types)


class UnsupportedArchitecture(ValueError):
    pass


def family_for(model_type: str) -> Family:
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    raise UnsupportedArchitecture(
        f"architecture {model_type!r} is not supported; supported model types: "
        + ", ".join(SUPPORTED_MODEL_TYPES)
    )
