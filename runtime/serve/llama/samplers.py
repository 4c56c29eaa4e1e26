"""llama.cpp's `samplers` field: the order of its sampling chain (common/sampling.cpp), as names
(`["top_k", "top_p", "infill"]`, llama.vscode's and llama.vim's) or as one character each
(`"kpi"`).

llama.cpp applies exactly the samplers listed, in the order listed, then draws from what is left
(`dist`). This server applies temperature, top-k, top-p and the infill filter
(runtime/sampling/infill.py) in one fixed order — temperature and top-k (they commute: top-k
picks by logit), then top-p, then infill — so a list is honoured when its order is that one, and
a sampler left out does not apply: no temperature (T = 1, whatever `temperature` says, as in
llama.cpp), no top-k, no top-p, no infill. `[]` is plain sampling at T = 1. Any other sampler
(min_p, typ_p, dry, xtc, penalties, top_n_sigma, adaptive_p) is refused by name, as is an order
this server does not apply (top_p before top_k, temperature after top_p, ...).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

APPLIED = ("temperature", "top_k", "top_p", "infill")  # the llama.cpp samplers this server applies
# samplers that must come after each one (top_k and temperature commute)
_AFTER = {"temperature": {"top_p", "infill"}, "top_k": {"top_p", "infill"}, "top_p": {"infill"}}
NOT_BUILT = ("dry", "top_n_sigma", "typ_p", "min_p", "xtc", "penalties", "adaptive_p")
_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
          "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}


def _aliases() -> dict[str, str]:
    """Every name llama.cpp reads (common_sampler_types_from_names): the canonical ones, kebab
    case and no-dash forms of those with an underscore, and its three others."""
    out = {}
    for name in APPLIED + NOT_BUILT:
        out[name] = name
        if "_" in name:
            out[name.replace("_", "-")] = out[name.replace("_", "")] = name
    return out | {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}


NAMES = _aliases()


def _error(msg: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_samplers", "{msg}", {"msg": msg})  # errors.py names the field


def sampler_chain(v) -> tuple[str, ...] | None:
    """The field as llama.cpp reads it -> the canonical names in order. Raises a validation
    error naming `samplers` for a sampler not built, an unknown one, a repeat or an order this
    server does not apply."""
    if v is None:
        return None
    if isinstance(v, str):
        names = [_CHARS.get(c) or c for c in v]
    elif isinstance(v, list) and all(isinstance(s, str) for s in v):
        names = [NAMES.get(s) or s for s in v]
    else:
        raise _error("must be a list of sampler names or a string of sampler characters")
    for n in names:
        if n in NOT_BUILT:
            raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: "
                                      "{why}", {"param": "samplers", "why": f"the {n} sampler is not built (only "
                                                f"{', '.join(APPLIED)} are applied)"})
        if n not in APPLIED:
            raise _error(f"unknown sampler {n!r}")
    if len(set(names)) < len(names):
        raise _error("a sampler is listed twice")
    for i, n in enumerate(names):
        if set(names[:i]) & _AFTER.get(n, set()):
            raise _error(f"{n} after {', '.join(sorted(set(names[:i]) & _AFTER[n]))}: this server applies "
                         "temperature and top_k (in either order), then top_p, then infill")
    return tuple(names)


# the field's type: llama.cpp's forms in, the canonical names out (None: no `samplers`)
SamplerChain = Annotated[tuple[str, ...] | None,
                         BeforeValidator(sampler_chain, json_schema_input_type=list[str] | str | None)]


def chain_options(names: tuple[str, ...], o) -> dict:
    """RequestOptions fields (over the request's options `o`) for a chain of these samplers:
    the ones left out do not apply."""
    return {"temperature": o.temperature if "temperature" in names else 1.0,
            "top_k": o.top_k if "top_k" in names else 0,
            "top_p": o.top_p if "top_p" in names else 1.0,
            "infill": "infill" in names}
