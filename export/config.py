"""A model-pair config (configs/*.toml) merged with what the command line says: the source,
bundle folder and `export_bundle` arguments of one export. A value given (a `specrt export`
flag) wins, 0 included (`export_bundle` then refuses it with its reason); else the config's;
else the default.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG = "configs/default.toml"
# export_bundle argument -> (config table, key, default)
_FROM_CONFIG = {
    "k": ("draft", "k", None),
    "max_seq_len": ("export", "max_seq_len", 2048),
    "max_draft_tokens": ("export", "max_draft_tokens", 16),
    "precision": ("export", "precision", "fp32"),
    "accuracy_level": ("export", "accuracy_level", 4),
    "lm_head_precision": ("export", "lm_head_precision", ""),
    "kv_dtype": ("export", "kv_dtype", "auto"),
    "lowering": ("export", "lowering", "ort"),
    "trt": ("export", "trt", False),
    "portable": ("export", "portable", True),
}


class ConfigError(ValueError):
    """The config file is missing or says something an export cannot take."""


def read_pair_config(path: str | Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config {path} not found")
    with open(p, "rb") as f:
        return tomllib.load(f)


def export_plan(given: dict, config_path: str | None = None) -> tuple[str, str, dict]:
    """(target source, bundle folder, `export_bundle` keyword arguments). given: the command
    line's values by `export_bundle`'s names plus `target` and `out`, None where not given. The
    config is read when named, or when no target is given (configs/default.toml)."""
    cfg_file = config_path or DEFAULT_CONFIG
    cfg = read_pair_config(cfg_file) if config_path or not given.get("target") else {}
    target = given.get("target") or cfg.get("target", {}).get("source")
    if not target:
        raise ConfigError("no --target given and the config names none")
    kwargs = {}
    for name, (table, key, default) in _FROM_CONFIG.items():
        value = given.get(name)
        kwargs[name] = value if value is not None else cfg.get(table, {}).get(key, default)
    kwargs["accuracy_level"] = int(kwargs["accuracy_level"])
    dr = cfg.get("draft", {})
    draft = given.get("draft")
    kwargs["draft"] = draft if draft is not None else _config_relative(dr.get("source", "self-int8"), cfg_file)
    # the config's draft precision and vocabulary subset belong to the config's draft, not to one named by a flag
    precision = given.get("draft_precision")
    kwargs["draft_precision"] = precision if precision is not None else (dr.get("precision") if draft is None else None)
    vocab = given.get("draft_vocab")
    kwargs["draft_vocab"] = vocab if vocab is not None else (dr.get("vocab_subset", 0) if draft is None else 0)
    if not isinstance(kwargs["draft_vocab"], int) or isinstance(kwargs["draft_vocab"], bool):
        raise ConfigError(f"{cfg_file}: [draft] vocab_subset must be a number of tokens, got {kwargs['draft_vocab']!r}")
    for key in ("trt", "portable"):
        if not isinstance(kwargs[key], bool):
            raise ConfigError(f"{cfg_file}: [export] {key} must be true or false, got {kwargs[key]!r}")
    return target, given.get("out") or f"engines/{cfg.get('name', 'default')}", kwargs


def _config_relative(draft: str, cfg_file: str) -> str:
    """`eagle:PATH` in a config file is relative to that file's folder."""
    if draft.startswith("eagle:") and not Path(draft[6:]).is_absolute():
        return "eagle:" + str(Path(cfg_file).parent / draft[6:])
    return draft
