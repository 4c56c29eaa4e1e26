"""EAGLE-style draft head (Li et al. 2024): one decoder layer that reads the target's own
features instead of starting from scratch.

At sequence position p the head gets the pair (f_p, x_{p+1}): f_p = the target's final-norm
hidden state at p (what its LM head turns into the logits that chose x_{p+1}) and the token
x_{p+1}. It predicts f_{p+1}; the target's (tied) LM head turns the prediction into draft logits
for x_{p+2}. Drafting further feeds the head its own predicted features. One layer of the
target's width is a small fraction of a whole target step, so the draft is cheap; its accuracy comes
from self-distillation on the target's own outputs (`tools/train_eagle.py`).

A head file is safetensors: `fc.weight` [H, 2H], `fc.bias` [H], `layer.*` (the HF decoder-layer
keys), `norm.weight` [H]; metadata `format`, `hidden_size`, `vocab_size`, `model_type`,
`target_sha256` (the target source it was trained for; the exporter refuses another).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .arch import Arch

FORMAT = "specrt-eagle-1"
SUPPORTED = ("llama",)  # the decoder-layer class the trainer instantiates


class HeadError(ValueError):
    """A head file that is missing, malformed or made for another target."""


def target_features(model, seqs) -> list:
    """The features a head reads: `model`'s final-norm hidden states of each int token array in
    `seqs`, one teacher-forced pass each -> list of torch [T, H]."""
    import torch

    with torch.no_grad():
        return [model.model(input_ids=torch.from_numpy(s[None].astype(np.int64))).last_hidden_state[0] for s in seqs]


def head_module(target):
    """A trainable head (torch) bound to the frozen embedding and LM head of `target`; its layer
    starts as a copy of the target's last layer, its norm as the target's final norm."""
    import torch
    from torch import nn

    cfg = target.config
    if cfg.model_type not in SUPPORTED:
        raise HeadError(f"EAGLE heads are implemented for {SUPPORTED} targets, not {cfg.model_type!r}")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    H = cfg.hidden_size
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2 * H, H, bias=True)
            self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
            self.norm = nn.RMSNorm(H, eps=cfg.rms_norm_eps)
            self.layer.load_state_dict(target.model.layers[-1].state_dict())
            self.norm.weight.data.copy_(target.model.norm.weight.data)
            with torch.no_grad():  # start by passing the feature through: fc = [0 | I]
                self.fc.weight.zero_()
                self.fc.weight[:, H:] = torch.eye(H)
                self.fc.bias.zero_()
            self._rot = [LlamaRotaryEmbedding(cfg)]  # a list keeps it out of state_dict()

        def forward(self, feats, toks):
            """feats [B, T, H] (f_p), toks [B, T] (x_{p+1}), positions 0..T-1 -> f̂_{p+1} [B, T, H]."""
            h = self.fc(torch.cat([embed(toks), feats], -1))
            B, T = toks.shape
            pos = torch.arange(T)[None].expand(B, T)
            mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
            out = self.layer(h, attention_mask=mask, position_ids=pos, position_embeddings=self._rot[0](h, pos))
            return self.norm(out[0] if isinstance(out, tuple) else out)

        def logits(self, f):
            return lm_head(f)

    return Head()


def save_head(head, path: str | Path, *, target_sha256: str, config) -> Path:
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().float().numpy().astype(np.float16) for k, v in head.state_dict().items()}
    meta = {"format": FORMAT, "hidden_size": str(config.hidden_size), "vocab_size": str(config.vocab_size),
            "model_type": config.model_type, "target_sha256": target_sha256 or ""}
    tmp = path.with_suffix(path.suffix + ".partial")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)  # an interrupted save leaves no half-written head behind
    return path


def load_head(path: str | Path, arch: Arch, target_sha256: str | None) -> dict[str, np.ndarray]:
    """Head tensors as fp32 arrays, checked against the target they will draft for."""
    path = Path(path)
    if not path.is_file():
        raise HeadError(f"EAGLE head file not found: {path} (train one with `make train-draft`)")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            w = {k: f.get_tensor(k).astype(np.float32) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types on a corrupt file
        raise HeadError(f"{path} is not a readable safetensors head file: {e}") from None
    if meta.get("format") != FORMAT:
        raise HeadError(f"{path}: not a {FORMAT} head (format {meta.get('format')!r})")
    if arch.model_type not in SUPPORTED:
        raise HeadError(f"EAGLE heads are implemented for {SUPPORTED} targets, not {arch.model_type!r}")
    want = {"hidden_size": arch.hidden, "vocab_size": arch.vocab}
    for key, val in want.items():
        if int(meta.get(key, -1)) != val:
            raise HeadError(f"{path} was trained for a target with {key}={meta.get(key)}, this target has {val}")
    sha = meta.get("target_sha256")
    if sha and target_sha256 and sha != target_sha256:
        raise HeadError(f"{path} was trained for another target (sha256 {sha[:12]}…, this one {target_sha256[:12]}…); "
                        "retrain it for this target with `make train-draft`")
    missing = {"fc.weight", "fc.bias", "norm.weight"} - set(w)
    if missing or not any(k.startswith("layer.") for k in w):
        raise HeadError(f"{path} lacks tensors {sorted(missing) or ['layer.*']}")
    return w


def draft_arch(target: Arch) -> Arch:
    """The head is a one-layer decoder with the target's shapes and its first layer's rotary."""
    return dataclasses.replace(target, layers=1, windows=[0], rope_kind=[target.rope_kind[0]])


def draft_weights(target_w: dict[str, np.ndarray], head_w: dict[str, np.ndarray], name: str = "head") -> dict[str, np.ndarray]:
    """Weight dict in the emitter's (HF) key space: target embedding + LM head, head layer as
    layer 0, head norm as the final norm, fc as `eagle.fc.*`. The head's layer must have exactly
    the keys and shapes of the target's layer 0."""
    want = {k[len("model.layers.0."):]: v.shape for k, v in target_w.items() if k.startswith("model.layers.0.")}
    got = {k[len("layer."):]: v.shape for k, v in head_w.items() if k.startswith("layer.")}
    H = target_w["model.embed_tokens.weight"].shape[1]
    shapes = {"fc.weight": (H, 2 * H), "fc.bias": (H,), "norm.weight": (H,)}
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    bad += [k for k, shp in shapes.items() if head_w[k].shape != shp]
    if bad:
        raise HeadError(f"{name} does not fit this target's layer shapes (keys {bad[:6]}); it was trained for "
                        "another architecture")
    w = {"model.embed_tokens.weight": target_w["model.embed_tokens.weight"]}
    if "lm_head.weight" in target_w:
        w["lm_head.weight"] = target_w["lm_head.weight"]
    for k, v in head_w.items():
        if k.startswith("layer."):
            w["model.layers.0." + k[len("layer."):]] = v
    w["model.norm.weight"] = head_w["norm.weight"]
    w["eagle.fc.weight"] = head_w["fc.weight"]
    w["eagle.fc.bias"] = head_w["fc.bias"]
    return w
