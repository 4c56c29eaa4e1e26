"""Fill-in-the-middle over HTTP: `/v1/completions` with `suffix` and llama.cpp's `/infill`.

Both build their prompt with runtime/text/fim.py from the bundle's own FIM tokens (a bundle
without them answers 400 naming `suffix` / `input_prefix`), so the same prefix and suffix give
the same token ids, hence the same tokens, through either endpoint. The file is cut to the
server's window around the cursor (`ServerConfig.fim_window`, text/fim.py `FimWindow`), and the
prompt is trimmed to leave room for the completion (`FimParts.fit`: extra files first, then the
prefix's start, then the suffix's end); /infill reports either cut as `truncated`. /infill's answer is llama.cpp's shape
(`InfillOutput`), and its text is cut by the editor stops (`n_indent`, `t_max_predict_ms`:
`EditorText`).
"""

from __future__ import annotations

import time
import uuid

from pydantic import RootModel

from ...errors import InvalidRequest
from ...text.fim import EditorText, FimParts, FimWindow, fim_parts
from ...text.textstream import TextStream
from ..errors import bad
from ..openai.schema_completion import CompletionRequest
from ..schema import UsageInfo, dump
from ..shape import ResponseShape
from .schema_infill import InfillRequest, InfillResponse, InfillTimings

RESERVE = 128  # tokens kept free for a completion that names no length (llama.vscode's n_predict)


def _fim(front, req, prefix: str, suffix: str, extra=(), field: str = "suffix",
         window: FimWindow | None = None) -> FimParts:
    """The FIM prompt, the file cut to `window` around the cursor (ServerConfig.fim_window) and
    the whole trimmed to leave the completion its tokens (`left_out` counts both cuts). A bundle
    without FIM tokens is a 400 naming `field`; a cursor line that leaves no room names the
    request's length field."""
    try:
        # the cursor line's last token healed, unless a grammar reads the output from its start
        parts = fim_parts(front.tokenizer, prefix, suffix, extra, field=field, window=window,
                          heal=req.grammar_field() is None)
        want = min(req._requested_max_tokens() or RESERVE, front.max_seq_len - 1)
        return parts.fit(front.max_seq_len - want)
    except InvalidRequest as e:
        raise bad(str(e), field if e.param == field else req.field_of(e.param)) from None


def completion_prompt(front, req: CompletionRequest, window: FimWindow | None = None) -> tuple[list[int], str]:
    """The prompt's token ids: with a non-empty `suffix`, the FIM prompt for `prompt` before the
    cursor and `suffix` after it (user text, no special tokens read from it); otherwise the
    prompt as it is written (special tokens in it are read: clients such as Continue write the
    FIM tokens themselves). An empty suffix (nothing after the insertion) is a plain completion.
    -> (the ids, the healed text the output must begin with: FimParts.heal)."""
    if not req.suffix:
        return front.tokenizer.encode(req.prompt, chat=False), ""
    parts = _fim(front, req, req.prompt, req.suffix, window=window)
    return parts.ids, parts.heal


def infill_prompt(front, req: InfillRequest, window: FimWindow | None = None) -> tuple[list[int], InfillOutput]:
    """/infill's prompt ids and response shapes."""
    parts = _fim(front, req, req.prefix, req.input_suffix, req.extra, "input_prefix", window)
    return parts.ids, InfillOutput(req, truncated=parts.left_out > 0, heal=parts.heal)


class InfillOutput(ResponseShape):
    """/infill's response shapes (llama.cpp's non-OpenAI form; plain data like the other
    outputs of outputs.py), and the text stream its editor stops cut."""

    fim = True  # the server's drafter for editors (ServerConfig.fim_draft)

    def __init__(self, req: InfillRequest, truncated: bool = False, heal: str = ""):
        self.id = "infill-" + uuid.uuid4().hex[:24]  # the log's name for it (llama.cpp's answer has no id)
        self.model, self.warmup, self.truncated, self.heal = req.model, req.warmup, truncated, heal
        self.n_indent, self.t_max_s, self.fields = req.n_indent, req.t_max_s, req.response_fields
        self.t0 = time.time()  # wall clock: under Ray a replica, maybe on another node, finishes the timing

    def text_stream(self, tokenizer, stop: list[str]) -> EditorText:
        return EditorText(TextStream(tokenizer, stop, self.heal), self.n_indent, self.t_max_s)

    def first(self, index: int) -> list:
        return []

    def piece(self, index: int, text: str, lp=None) -> InfillResponse:
        return InfillResponse(index=index, content="" if self.warmup else text, stop=False)

    def last(self, index: int, finish: str) -> InfillResponse:
        return InfillResponse(index=index, content="", stop=True, model=self.model, truncated=self.truncated,
                              stop_type=_stop_type(finish))

    def usage(self, usage: UsageInfo) -> InfillResponse:
        return self._counts(InfillResponse(content="", stop=True), usage)

    def whole(self, choices: list[tuple[str, str, list | None, int]], usage: UsageInfo) -> RootModel:
        """One answer, or with n_cmpl > 1 a list of them (each with its own index and counts), as
        llama.cpp answers."""
        bodies = []
        for i, (text, finish, _, n) in enumerate(choices):
            body = self._counts(InfillResponse(index=i, content="" if self.warmup else text, stop=True, model=self.model,
                                               truncated=self.truncated, stop_type=_stop_type(finish)), usage, n)
            bodies.append(dump(body) if self.fields is None else _pick(dump(body), self.fields))
        return RootModel[dict](bodies[0]) if len(bodies) == 1 else RootModel[list](bodies)

    def _counts(self, r: InfillResponse, usage: UsageInfo, new: int | None = None) -> InfillResponse:
        """The counts of one answer (`new`: its tokens) or of all (None: the usage's)."""
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        predicted = 0 if self.warmup else usage.completion_tokens if new is None else new
        r.tokens_predicted, r.tokens_evaluated, r.tokens_cached = predicted, usage.prompt_tokens, cached
        r.timings = InfillTimings(prompt_n=usage.prompt_tokens - cached, predicted_n=predicted,
                                  predicted_ms=round(max(0.0, time.time() - self.t0) * 1000, 3))
        return r


def _stop_type(finish: str) -> str:
    return "limit" if finish in ("length", "timeout") else "eos"


def _pick(body: dict, fields: list[str]) -> dict:
    """llama.cpp's `response_fields`: only these fields, a nested one named by its path
    ("timings/prompt_n") and keyed by it; a path that names nothing is left out."""
    out = {}
    for path in fields:
        node = body
        for key in path.split("/"):
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            out[path] = node
    return out
