"""`specrt export`: a separate draft's precision from `--draft-precision` or the config's
`[draft] precision`, which belongs to the config's own draft only."""

from click.testing import CliRunner

from specrt.cli import main
from specrt.runtime.bundle.manifest import load_manifest


def _config(tmp_path, target, draft, precision):
    cfg = tmp_path / "pair.toml"
    cfg.write_text(f'name = "q"\n[target]\nsource = "{target}"\n[draft]\nsource = "{draft}"\nprecision = "{precision}"\n'
                   "[export]\nmax_seq_len = 96\nmax_draft_tokens = 4\n")
    return cfg


def test_config_draft_precision_and_the_flag(tiny_dirs, tmp_path):
    cfg = _config(tmp_path, tiny_dirs["target"], tiny_dirs["bad_draft"], "int4")
    res = CliRunner().invoke(main, ["export", "--config", str(cfg), "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert (load_manifest(tmp_path / "a").draft.precision, load_manifest(tmp_path / "a").draft.recipe) == ("int4", "model-int4")
    res = CliRunner().invoke(main, ["export", "--config", str(cfg), "--draft-precision", "int8", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert load_manifest(tmp_path / "b").draft.recipe == "model-int8"


def test_config_draft_precision_does_not_follow_a_draft_flag(tiny_dirs, tmp_path):
    cfg = _config(tmp_path, tiny_dirs["target"], tiny_dirs["bad_draft"], "int8")
    res = CliRunner().invoke(main, ["export", "--config", str(cfg), "--draft", "self-int4", "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    assert load_manifest(tmp_path / "c").draft.recipe == "self-int4"
    res = CliRunner().invoke(main, ["export", "--config", str(cfg), "--draft", "none", "--draft-precision", "int8",
                                    "--out", str(tmp_path / "d")])
    assert res.exit_code == 2 and "applies to a separate draft model" in res.output
