"""A bundle's tokenizer checked against the GGUF it came from.

transformers rebuilds a fast tokenizer from a GGUF's vocabulary and merges; what decides whether
generation behaves is that every token the GGUF marks as control or user-defined (Qwen:
`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<tool_call>`, `</tool_call>`, the FIM tokens)
encodes to itself alone under its GGUF id, that the end-of-sequence token stops generation, and
that the chat template is the one shipped. `check` raises on any difference, naming it.
`check_same_vocabulary`: a separate draft's token ids must mean the target's strings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from specrt.runtime.bundle.manifest import TokenizerInfo

from .errors import SourceError

CONTROL, USER_DEFINED = 3, 4  # gguf TokenType values of special and added tokens
GGUF_ENDS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")  # tokenizer.ggml.{key}_token_id


class VocabularyMismatch(ValueError):
    pass


@dataclass
class GGUFTokens:
    vocab_size: int
    specials: dict[int, str] = field(default_factory=dict)  # id -> text of control / user-defined tokens
    eos: int | None = None
    bos: int | None = None
    chat_template: str | None = None
    # metadata key -> id of the tokens the GGUF says end a generation (eos, eot, eom, fim_pad,
    # fim_rep, fim_sep: what llama.cpp puts in its EOG set besides tokens it knows by name)
    ends: dict[str, int] = field(default_factory=dict)


@functools.lru_cache(maxsize=4)
def read_gguf_tokens(path: Path) -> GGUFTokens:
    """The tokenizer fields of a GGUF file's metadata (its tensors are not read)."""
    from .gguf_stream import gguf_reader

    fields = gguf_reader(path).fields

    def value(key):
        f = fields.get(key)
        return None if f is None else f.contents()

    tokens, types = value("tokenizer.ggml.tokens") or [], value("tokenizer.ggml.token_type") or []
    specials = {i: t for i, (t, ty) in enumerate(zip(tokens, types, strict=False)) if ty in (CONTROL, USER_DEFINED)}
    ends = {key: int(v) for key in GGUF_ENDS if (v := value(f"tokenizer.ggml.{key}_token_id")) is not None}
    return GGUFTokens(len(tokens), specials, value("tokenizer.ggml.eos_token_id"),
                      value("tokenizer.ggml.bos_token_id"), value("tokenizer.chat_template"), ends)


def check(gguf: GGUFTokens, tokenizer_json: Path, info: TokenizerInfo) -> dict:
    """-> a summary for the manifest; raises SourceError listing every difference."""
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(tokenizer_json))
    problems = []
    added = {i for i in tk.get_added_tokens_decoder() if i >= gguf.vocab_size}  # e.g. a converter's own EOS
    if tk.get_vocab_size() - len(added) != gguf.vocab_size:
        problems.append(f"vocabulary size {tk.get_vocab_size()} (GGUF {gguf.vocab_size})")
    wrong = []
    for i, text in gguf.specials.items():
        ids = tk.encode(text, add_special_tokens=False).ids
        if ids != [i]:
            wrong.append(f"{text!r} -> {ids} (GGUF id {i})")
    if wrong:
        problems.append(f"{len(wrong)} special tokens do not encode to their GGUF id alone: {', '.join(wrong[:8])}")
    if gguf.eos is not None and gguf.eos not in info.eos_token_ids:
        problems.append(f"the GGUF's end-of-sequence token {gguf.eos} is not among the stop ids {info.eos_token_ids}")
    if gguf.chat_template and info.chat_template != gguf.chat_template:
        problems.append("the chat template differs from the GGUF's tokenizer.chat_template")
    if problems:
        raise SourceError("bundled tokenizer differs from its GGUF: " + "; ".join(problems))
    return {"special_tokens_checked": len(gguf.specials), "eos": gguf.eos, "bos": gguf.bos, "ends": gguf.ends,
            "added_beyond_gguf": sorted(added),
            "chat_template_as_shipped": bool(gguf.chat_template)}


def check_same_vocabulary(t_tok, d_tok, t_cfg, d_cfg) -> None:
    """Refuse a draft whose token ids do not mean the same strings as the target's."""
    problems = []
    tv, dv = t_tok.get_vocab(), d_tok.get_vocab()
    if tv != dv:
        only_t = sorted(set(tv) - set(dv))[:5]
        only_d = sorted(set(dv) - set(tv))[:5]
        moved = [s for s in set(tv) & set(dv) if tv[s] != dv[s]][:5]
        problems.append(
            f"tokenizer vocabularies differ (target {len(tv)} tokens, draft {len(dv)}; "
            f"only in target: {only_t}, only in draft: {only_d}, different ids: {moved})"
        )
    tcfg = getattr(t_cfg, "text_config", None) or t_cfg
    dcfg = getattr(d_cfg, "text_config", None) or d_cfg
    if tcfg.vocab_size != dcfg.vocab_size:
        problems.append(f"logit widths differ (target vocab_size {tcfg.vocab_size}, draft {dcfg.vocab_size})")
    if t_tok.eos_token_id != d_tok.eos_token_id:
        problems.append(f"EOS differs (target {t_tok.eos_token!r}, draft {d_tok.eos_token!r})")
    if problems:
        raise VocabularyMismatch("draft cannot verify against this target: " + "; ".join(problems))
