"""export/config.py: a model-pair config merged with `specrt export`'s flags (the CLI's tests
run whole exports through it: tests/test_cli.py)."""

from __future__ import annotations

import pytest

from specrt.export.config import ConfigError, export_plan


def _config(tmp_path, text: str):
    cfg = tmp_path / "pair.toml"
    cfg.write_text('name = "pair"\n[target]\nsource = "t"\n' + text)
    return str(cfg)


def test_a_given_value_wins_zero_included_else_the_config_else_the_default(tmp_path):
    cfg = _config(tmp_path, '[draft]\nsource = "self-int4"\nk = 3\n[export]\nmax_seq_len = 96\nprecision = "int8"\n')
    target, out, kw = export_plan({"k": 0, "max_draft_tokens": 4}, cfg)
    assert (target, out) == ("t", "engines/pair")
    assert (kw["k"], kw["max_draft_tokens"], kw["max_seq_len"], kw["precision"]) == (0, 4, 96, "int8")
    assert (kw["draft"], kw["lowering"], kw["trt"], kw["accuracy_level"]) == ("self-int4", "ort", False, 4)
    target, out, _ = export_plan({"target": "other", "out": "b"}, cfg)
    assert (target, out) == ("other", "b")


def test_the_configs_draft_precision_and_paths_belong_to_its_own_draft(tmp_path):
    cfg = _config(tmp_path, '[draft]\nsource = "eagle:heads/h.safetensors"\nprecision = "int8"\n')
    _, _, kw = export_plan({}, cfg)
    assert kw["draft"] == f"eagle:{tmp_path}/heads/h.safetensors" and kw["draft_precision"] == "int8"
    _, _, kw = export_plan({"draft": "none"}, cfg)
    assert kw["draft"] == "none" and kw["draft_precision"] is None


@pytest.mark.parametrize("text,given,words", [
    ("[export]\ntrt = \"false\"\n", {}, "trt must be true or false, got 'false'"),
    (None, {}, "not found"),
])
def test_what_an_export_cannot_take_is_a_config_error(tmp_path, text, given, words):
    cfg = _config(tmp_path, text) if text is not None else str(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=words):
        export_plan(given, cfg)
