"""export_bundle end to end on tiny HF folders, and every bad-input path."""

import json
import shutil

import pytest

from specrt.export import ParityError, SourceError, VocabularyMismatch, export_bundle
from specrt.export import api as export_api
from specrt.export import steps as export_steps
from specrt.runtime.bundle.manifest import BundleError, load_manifest, manifest_from_dict

KW = dict(max_seq_len=128, max_draft_tokens=8, greedy_steps=8, echo=None)


def test_bundle_layout_and_manifest_roundtrip(tiny_bundles):
    folder = tiny_bundles["int4"]
    man = load_manifest(folder)
    assert man.target.lowering == "ort" and man.target.precision == "fp32"
    assert man.draft.precision == "int4" and man.draft.recipe == "self-int4"
    assert man.draft.default_k == export_api.RECOMMENDED_K["self-int4"]
    assert man.target.max_tokens_per_call == 9
    assert man.target.parity["passed"] and man.target.parity["greedy_match"] == man.target.parity["greedy_steps"]
    assert man.tokenizer.eos_token_ids == [2] and man.tokenizer.chat_template
    raw = json.loads((folder / "specrt.json").read_text())
    assert manifest_from_dict(raw) == man
    assert not list(folder.parent.glob(".*tmp-*")), "staging folders left behind"


def test_draft_agreement_with_the_target_orders_the_drafts(tiny_bundles):
    """greedy_agreement_with_target (the draft's teacher-forced argmax agreement with the
    target's greedy tokens): a draft that is the target in the same precision agrees at every
    step; int8 keeps more of it than int4; an unrelated random model the least."""
    a = {name: load_manifest(tiny_bundles[name]).draft.parity["greedy_agreement_with_target"]
         for name in ("good", "int8", "int4", "bad")}
    assert a["good"] == 1.0
    assert a["bad"] < a["int4"] < a["int8"] <= a["good"], a


def test_standard_lowering_bundle(tiny_dirs, tmp_path):
    man = export_bundle(str(tiny_dirs["target"]), tmp_path / "std", draft=str(tiny_dirs["bad_draft"]),
                        lowering="standard", **KW)
    assert man.target.lowering == man.draft.lowering == "standard"
    assert man.target.parity["passed"]


@pytest.mark.parametrize("k", [0, 9])
def test_recommended_k_out_of_range_is_refused(tiny_dirs, tmp_path, k):
    with pytest.raises(ValueError, match="k must be between 1 and max_draft_tokens"):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "x", k=k, **KW)
    assert not (tmp_path / "x").exists()


def test_standard_lowering_refuses_self_int4(tiny_dirs, tmp_path):
    with pytest.raises(ValueError, match="ort"):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "x", draft="self-int4", lowering="standard", **KW)


def test_missing_source(tmp_path):
    with pytest.raises(SourceError, match="not found"):
        export_bundle(str(tmp_path / "nope"), tmp_path / "b", **KW)


def test_folder_without_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(SourceError, match="config.json"):
        export_bundle(str(tmp_path / "m"), tmp_path / "b", **KW)


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\x00garbage" * 10)
    with pytest.raises(SourceError, match="not a usable GGUF file: it is GGUF version"):
        export_bundle(str(bad), tmp_path / "b", **KW)


def test_corrupt_config(tiny_dirs, tmp_path):
    src = shutil.copytree(tiny_dirs["target"], tmp_path / "m")
    (src / "config.json").write_text("{ not json")
    with pytest.raises(SourceError):
        export_bundle(str(src), tmp_path / "b", **KW)


def test_unknown_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128)).save_pretrained(tmp_path / "g")
    from tiny import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "g")
    with pytest.raises(ValueError, match="gpt2.*supported model types"):
        export_bundle(str(tmp_path / "g"), tmp_path / "b", **KW)


def test_hub_id_unreachable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError, match="hub"):
        export_bundle("someorg/somemodel", tmp_path / "b", **KW)


def test_vocabulary_mismatch_is_refused(tiny_dirs, tmp_path):
    with pytest.raises(VocabularyMismatch, match="vocabularies differ.*only in draft"):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "b", draft=str(tiny_dirs["other_vocab"]), **KW)
    assert not (tmp_path / "b").exists()


def test_interrupted_export_keeps_previous_bundle(tiny_dirs, tmp_path, monkeypatch):
    out = tmp_path / "b"
    export_bundle(str(tiny_dirs["target"]), out, draft="none", **KW)
    before = (out / "specrt.json").read_text()
    calls = {"n": 0}
    real = export_steps.check_decoder

    def interrupt(*a, **k):
        calls["n"] += 1
        raise KeyboardInterrupt

    monkeypatch.setattr(export_steps, "check_decoder", interrupt)
    with pytest.raises(KeyboardInterrupt):
        export_bundle(str(tiny_dirs["target"]), out, draft="self-int4", **KW)
    assert calls["n"] == 1
    assert (out / "specrt.json").read_text() == before  # previous bundle intact and loadable
    load_manifest(out)
    assert not list(tmp_path.glob(".b.tmp-*"))
    monkeypatch.setattr(export_steps, "check_decoder", real)


def test_interrupted_first_export_leaves_nothing_loadable(tiny_dirs, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_api, "_save_tokenizer", boom)
    with pytest.raises(KeyboardInterrupt):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "b", draft="none", **KW)
    with pytest.raises(BundleError, match="does not exist"):
        load_manifest(tmp_path / "b")


def test_parity_failure_refuses_bundle(tiny_dirs, tmp_path, monkeypatch):
    import numpy as np

    from specrt.export import graph as graph_mod

    real = graph_mod.build_graph

    def broken(arch, w, opts, qw=None, sink=None):
        w = dict(w)
        w["model.norm.weight"] = w["model.norm.weight"] * np.float32(1.5)
        return real(arch, w, opts, qw, sink)

    monkeypatch.setattr(export_steps, "build_graph", broken)
    with pytest.raises(ParityError, match="target graph failed parity with transformers"):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "b", draft="none", **KW)
    assert not (tmp_path / "b").exists()



def test_one_parity_gate_refuses_a_broken_draft(tiny_dirs, tmp_path, monkeypatch):
    """A separate draft is held to the target's tolerance: a draft graph that differs from its
    transformers model fails the same gate the target goes through, and nothing is written. A
    self-draft differs by design (it is quantized) and passes with its agreement recorded."""
    import numpy as np

    from specrt.export import graph as graph_mod

    real, built = graph_mod.build_graph, []

    def draft_broken(arch, w, opts, qw=None, sink=None):
        built.append(opts)
        if len(built) == 2:  # the draft's graph (the target's is the first)
            w = dict(w, **{"model.norm.weight": w["model.norm.weight"] * np.float32(1.5)})
        return real(arch, w, opts, qw, sink)

    monkeypatch.setattr(export_steps, "build_graph", draft_broken)
    with pytest.raises(ParityError, match="^draft graph failed parity with transformers"):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "b", draft=str(tiny_dirs["bad_draft"]), **KW)
    assert len(built) == 2 and not (tmp_path / "b").exists()


def test_weight_files_honour_the_umask(tiny_bundles):
    """Every file of a bundle, weights included, is readable by other users under umask 022 (a
    service running as another user loads what a deploy user built)."""
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    for f in tiny_bundles["int8"].rglob("*"):
        if f.is_file():
            assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f


def test_export_prints_no_framework_deprecation_noise(tiny_dirs, tmp_path, capfd, recwarn):
    export_bundle(str(tiny_dirs["target"]), tmp_path / "quiet", draft="none", max_seq_len=64, max_draft_tokens=4, echo=None)
    out, err = capfd.readouterr()
    assert "deprecated" not in (out + err)
    assert not [w for w in recwarn.list if issubclass(w.category, FutureWarning) and "past_key_values" in str(w.message)]
