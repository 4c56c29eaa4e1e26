"""A tiny llama GGUF written by code: 2 layers, hidden 256 (K-quant rows need multiples of 256),
every projection in another block type, one with no MatMulNBits form (IQ4_NL), a byte-level BPE
vocabulary of 128 tokens. Blocks are random bytes with their fp16 scales set so each weight has a
standard deviation of about 0.05 (any bit pattern of a block is a valid block)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
EOT = VOCAB - 1  # the last merged pair, named the end-of-turn token in the metadata
# per layer: GGUF tensor -> block type (layer 1 differs, so every form appears once at least)
TYPES = [
    {"attn_q": "Q4_K", "attn_k": "Q4_1", "attn_v": "Q6_K", "attn_output": "Q8_0",
     "ffn_gate": "Q5_0", "ffn_up": "Q4_0", "ffn_down": "Q5_K"},
    {"attn_q": "Q2_K", "attn_k": "Q3_K", "attn_v": "Q5_1", "attn_output": "Q4_K",
     "ffn_gate": "Q4_K", "ffn_up": "IQ4_NL", "ffn_down": "Q6_K"},
]
SHAPES = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN),
          "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(type_name: str, n: int, k: int, rng, std: float = 0.05) -> np.ndarray:
    """uint8 [n, bytes per row] of `type_name` whose dequantized weights have about `std`."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[type_name]
    per_block, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n * k // per_block, type_size), dtype=np.uint8)
    fields = F16_FIELDS[type_name]
    for off in fields:
        vals = rng.uniform(0.5, 1.0, len(blocks)).astype(np.float16)
        blocks[:, off:off + 2] = vals.view(np.uint8).reshape(-1, 2)
    # every weight is linear in the fp16 fields: scale them all by one factor
    f = std / float(quants.dequantize(blocks.reshape(n, -1), qtype).std())
    for off in fields:
        vals = (blocks[:, off:off + 2].copy().view(np.float16).astype(np.float32) * f).astype(np.float16)
        blocks[:, off:off + 2] = vals.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n, -1)


def _tokens() -> list[str]:
    # byte-level BPE symbols for the printable ASCII letters, plus a few merged pairs
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    pairs = [a + b for a in "etaoinshrd" for b in "etaoinshrd"][: VOCAB - 3 - len(letters)]
    return ["<unk>", "<s>", "</s>", *letters, *pairs]


def write_tiny_gguf(path: Path, seed: int = 0, tie: bool = False, embd: str = "Q8_0",
                    types: list[dict] | None = None) -> Path:
    """embd: the token table's block type (the coder's 0.5B: Q5_0, its 1.5B: Q4_K); types: per
    layer, each projection's block type (default TYPES: every type the importer reads)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    toks = _tokens()
    w.add_token_list(toks)
    w.add_token_types([3, 3, 3] + [1] * (len(toks) - 3))
    w.add_token_merges([f"{p[0]} {p[1]}" for p in toks[3 + 52:]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    # an end-of-turn id only the metadata names (llama.cpp's EOG set has it; so must the bundle's)
    w.add_uint32("tokenizer.ggml.eot_token_id", EOT)

    def add(name, type_name, n, k):
        raw = random_blocks(type_name, n, k, rng)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[type_name])

    add("token_embd.weight", embd, VOCAB, HIDDEN)
    for i, layer in enumerate(types or TYPES):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        for part, type_name in layer.items():
            add(f"blk.{i}.{part}.weight", type_name, *SHAPES[part])
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    if not tie:
        add("output.weight", "Q6_K", VOCAB, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
