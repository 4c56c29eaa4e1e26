"""Fields the server parses and checks but cannot honour yet: refused with a 400 naming the
field, never ignored. `UNSUPPORTED` is the one table to edit as the engine gains each feature;
types and ranges stay in the models, so a lifted field is already validated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Unsupported:
    """A field the server parses and checks but cannot honour: `used(value)` says whether the
    request asks for it (True, or the exact param path inside the field); `why` ends the 400."""

    field: str
    used: Callable[[Any], bool | str | None]
    why: str


def _non_text_part(messages: list) -> str | None:
    """messages: ChatMessage (schema_chat.py) -> the first part that is not text, as a param."""
    for i, m in enumerate(messages):
        for j, part in enumerate(m.content if isinstance(m.content, list) else []):
            if part.type != "text":
                return f"messages[{i}].content[{j}]"
    return None


_SPEC = "not exact under speculative decoding yet (issue 20)"

# Each entry is lifted (removed) when the engine honours the field.
UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported("best_of", lambda v: v > 1, "server-side ranking of choices is not built (use 'n')"),
    Unsupported("min_p", lambda v: v > 0, "min_p sampling is " + _SPEC),
    Unsupported("stop_token_ids", bool, "stop token ids are not implemented yet; use 'stop' strings"),
    Unsupported("messages", _non_text_part, "the model reads text only: send {'type': 'text', 'text': ...} parts"),
    Unsupported("audio", lambda v: True, "the model writes text only"),
    Unsupported("modalities", lambda v: "audio" in v, "the model writes text only"),
    Unsupported("echo", bool, "echoing the prompt is not implemented"),
)


def refuse_unsupported(request) -> None:
    """Raise (a validation error, code `unsupported_parameter`) if `request`, a validated
    request model, asks for a field in `UNSUPPORTED` that its endpoint declares."""
    declared = type(request).model_fields
    for u in UNSUPPORTED:
        value = getattr(request, u.field) if u.field in declared else None
        hit = value is not None and u.used(value)
        if hit:
            name = hit if isinstance(hit, str) else u.field
            raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: {why}",
                                      {"param": name, "why": u.why})

