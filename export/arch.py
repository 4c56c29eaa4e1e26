"""Normalize a Hugging Face config + model into the few numbers the graph emitter needs."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from .families import Family, family_for


@dataclass
class Arch:
    family: Family
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    attn_scale: float
    tie_embeddings: bool
    windows: list[int]  # per layer: sliding window length, 0 = full attention
    rope_kind: list[str]  # per layer: key into `rope`
    rope: dict[str, tuple[np.ndarray, np.ndarray]]  # kind -> (cos, sin), each [S_max, head_dim]


def arch_from_model(model, max_seq_len: int) -> Arch:
    """Read an HF causal LM (torch) into an `Arch`; rotary tables come from the model's own
    rotary module so every rope type transformers implements is reproduced exactly."""
    import torch

    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    fam = family_for(cfg.model_type)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    scale_base = getattr(cfg, fam.attn_scale_key) if fam.attn_scale_key else head_dim
    layer_types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)
    window = getattr(cfg, "sliding_window", None) or 0
    windows = [window if t == "sliding_attention" else 0 for t in layer_types]
    if cfg.model_type == "mistral" and window and window < max_seq_len:
        windows = [window] * cfg.num_hidden_layers

    rotary = model.model.rotary_emb
    pos = torch.arange(max_seq_len).unsqueeze(0)
    x = torch.zeros(1, dtype=torch.float32)
    takes_type = "layer_type" in inspect.signature(rotary.forward).parameters
    rope = {}
    kinds = sorted(set(layer_types)) if takes_type else ["full_attention"]
    with torch.no_grad():
        for kind in kinds:
            cos, sin = rotary(x, pos, kind) if takes_type else rotary(x, pos)
            rope[kind] = (cos[0].float().numpy(), sin[0].float().numpy())
    rope_kind = layer_types if takes_type else ["full_attention"] * cfg.num_hidden_layers

    return Arch(
        family=fam,
        model_type=cfg.model_type,
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        eps=float(cfg.rms_norm_eps),
        attn_scale=float(scale_base) ** -0.5,
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        windows=windows,
        rope_kind=rope_kind,
        rope=rope,
    )


def numpy_weights(model) -> dict[str, np.ndarray]:
    """State dict as fp32 NumPy arrays (copies; the torch model can be dropped after)."""
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
