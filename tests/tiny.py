"""Tiny random-weight models made by code, one per supported family (the fast fixtures'
source): configs, models, tokenizers, HF folders, an EAGLE head."""

from __future__ import annotations

from pathlib import Path

VOCAB = 128


CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)


def tiny_config(family: str, seed_std: float = 0.3):
    """A 2-layer config of each family; larger init std gives decisive (non-tied) greedy logits."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  initializer_range=seed_std, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        return tf.LlamaConfig(**common, tie_word_embeddings=True)
    if family == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return tf.Qwen2Config(**common)
    if family == "qwen3":
        return tf.Qwen3Config(**common)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**common, sliding_window=8, query_pre_attn_scalar=16,
                                   layer_types=["sliding_attention", "full_attention"])
    raise ValueError(family)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3"]


def tiny_model(family: str, seed: int = 0, std: float = 0.3):
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_config(family, std)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


# Qwen2.5-Coder's FIM tokens, as it marks them: added tokens, not special
FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


def tiny_tokenizer(shift: int = 0, fim: bool = False):
    """Word-level tokenizer over VOCAB tokens; `shift` renames words (a different vocabulary);
    `fim`: the last six ids are Qwen's FIM tokens (added tokens, not in the word vocabulary, so
    their text written in user text is not a word)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, VOCAB - (len(FIM) if fim else 0)):
        vocab[f"w{i + shift}"] = i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if fim:
        tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in FIM])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tiny(folder: Path, family: str = "llama", seed: int = 0, shift: int = 0, fim: bool = False,
              std: float = 0.3) -> Path:
    """std: the weights' init std (larger: more decisive next-token distributions)."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_model(family, seed, std).save_pretrained(folder)
    tiny_tokenizer(shift, fim).save_pretrained(folder)
    return folder


def tiny_head(target_dir: Path, out: Path, seed: int = 0) -> Path:
    """An untrained EAGLE head for the tiny target (its starting point: the target's last layer),
    with its fc nudged off the identity so the head is not a copy of anything."""
    import torch
    import transformers as tf

    from specrt.export.eagle import head_module, save_head

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = head_module(model)
    with torch.no_grad():
        head.fc.weight.add_(0.05 * torch.randn_like(head.fc.weight))
    return save_head(head, out, target_sha256="", config=model.config)
