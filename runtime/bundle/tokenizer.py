"""HF `tokenizers` from the bundle + its chat template (Jinja) + streaming detokenization."""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from .manifest import BundleError, FimTokens, TokenizerInfo

# each FIM role's token as each family names it: Qwen2.5-Coder / CodeGemma, StarCoder / SmolLM,
# DeepSeek-Coder (all prefix-suffix-middle); the first name the vocabulary has is taken
FIM_NAMES = {
    "prefix": ("<|fim_prefix|>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>"),
    "suffix": ("<|fim_suffix|>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>"),
    "middle": ("<|fim_middle|>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>"),
    "pad": ("<|fim_pad|>", "<fim_pad>"),
    "repo_name": ("<|repo_name|>", "<repo_name>", "<reponame>"),
    "file_sep": ("<|file_sep|>", "<file_sep>"),
}


# FIM roles whose token ends a generation, as llama.cpp's EOG set: a model that has finished a
# middle writes the next file's `<|file_sep|>` (or `<|repo_name|>`, or pads); nothing after one
# is part of the answer, in a FIM request or any other (docs/design.md "Fill in the middle")
FIM_ENDS = ("pad", "repo_name", "file_sep")


def end_of_generation(eos_ids, fim: FimTokens, more=()) -> list[int]:
    """The ids that end every request (llama.cpp's `special_eog_ids`): the EOS and end-of-turn
    ids, the FIM tokens of FIM_ENDS the vocabulary has, and `more` (a GGUF's own eot / eom /
    fim ids). The exporter records it; a bundle without it gets the same set at load."""
    ends = {getattr(fim, role) for role in FIM_ENDS} - {None}
    return sorted({int(i) for i in eos_ids} | ends | {int(i) for i in more})


def find_fim_tokens(vocab: dict[str, int]) -> FimTokens:
    """The FIM token ids of a vocabulary (token text -> id; added tokens included); a role the
    vocabulary has no token for is None. The exporter records this in the manifest."""
    def first(names):
        return next((int(vocab[n]) for n in names if n in vocab), None)

    return FimTokens(**{role: first(names) for role, names in FIM_NAMES.items()})


class Tokenizer:
    def __init__(self, folder: str | Path, info: TokenizerInfo):
        path = Path(folder) / info.file
        try:
            self.tk = _HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception on a bad file
            raise BundleError(f"cannot read tokenizer {path}: {e}") from None
        self.info = info
        self.eos_ids = set(info.eos_token_ids)  # the model's EOS (the chat template's eos_token)
        # what ends a request's output (a plain attribute: tests point it at other ids)
        self.eog_ids = set(end_of_generation(info.eos_token_ids, self.fim) if info.eog_token_ids is None
                           else info.eog_token_ids)
        self._template = None
        if info.chat_template:
            import jinja2

            # as transformers renders chat templates: loop controls, and a `tojson` that keeps
            # key order and non-ASCII text (Jinja's own sorts keys and escapes <, >, &)
            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                                     extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = _tojson
            self._template = env.from_string(info.chat_template)

    @functools.cached_property
    def fim(self) -> FimTokens:
        """The FIM token ids: the manifest's, or for a bundle exported before they were recorded,
        found in this tokenizer's vocabulary (the same search the exporter makes)."""
        if self.info.fim is not None:
            return self.info.fim
        return find_fim_tokens(self.tk.get_vocab(with_added_tokens=True))

    @functools.cached_property
    def _added(self) -> list[str]:
        return [t.content for t in self.tk.get_added_tokens_decoder().values() if t.content]

    def encode_text(self, text: str) -> list[int]:
        """User text as text (llama.cpp's parse_special = false): no added token (special or not)
        is read out of it, so a literal `<|fim_prefix|>` in a file stays characters; no BOS.
        Text without any added token's string takes the tokenizer's own path (the same ids)."""
        tk = self.tk
        if not any(a in text for a in self._added):
            return tk.encode(text, add_special_tokens=False).ids
        # the pipeline without the added-token split: normalize, pre-tokenize, the model per piece
        norm = tk.normalizer.normalize_str(text) if tk.normalizer is not None else text
        pieces = tk.pre_tokenizer.pre_tokenize_str(norm) if tk.pre_tokenizer is not None else [(norm, None)]
        return [t.id for piece, _ in pieces for t in tk.model.tokenize(piece)]

    @property
    def is_chat(self) -> bool:
        return self._template is not None

    def token(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.tk.id_to_token(token_id) or "")

    def render_chat(self, prompt: str) -> str:
        """One user message through the chat template (what `specrt generate` sends)."""
        return self.render_messages([{"role": "user", "content": prompt}])

    def render_messages(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """[{role, content}] through the chat template, with the assistant's turn opened.
        tools: OpenAI tool dicts the template renders (runtime/text/toolcalls.py; None: none)."""
        return self._template.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=True,
            bos_token=self.token(self.info.bos_token_id),
            eos_token=self.token(next(iter(sorted(self.eos_ids)), None)),
        )

    def encode(self, text: str, chat: bool = True) -> list[int]:
        """chat=True applies the chat template (its special tokens are written by the template);
        raw text gets whatever the tokenizer's post-processor adds (e.g. BOS)."""
        if chat and self.is_chat:
            return self.tk.encode(self.render_chat(text), add_special_tokens=False).ids
        return self.tk.encode(text, add_special_tokens=True).ids

    def encode_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """A conversation as the chat template writes it (raw concatenation without one)."""
        if self.is_chat:
            return self.tk.encode(self.render_messages(messages, tools), add_special_tokens=False).ids
        return self.tk.encode("\n".join(m["content"] for m in messages), add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (logprobs name their tokens this way); a
        byte token that is part of a UTF-8 sequence reads as U+FFFD."""
        return self.tk.decode([int(token_id)], skip_special_tokens=False)

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)


def _raise(msg):
    raise ValueError(msg)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    import json

    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class StreamDecoder:
    """Incremental detokenization that never emits half a character.

    Decodes a short window of recent tokens and emits only the text beyond what the window
    already produced; text ending in U+FFFD (an incomplete UTF-8 sequence spread over byte
    tokens) is held back until the next token completes it.
    """

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # tokens whose text was emitted

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        before = self.tok.decode(self.ids[self.prefix : self.read])
        after = self.tok.decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            text = after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            return text
        return ""

    def flush(self) -> str:
        before = self.tok.decode(self.ids[self.prefix : self.read])
        after = self.tok.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]
