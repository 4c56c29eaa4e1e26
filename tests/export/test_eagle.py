"""EAGLE draft heads: head files, the emitted graph against its torch module, and the bundle an
`eagle:` draft exports to (the trainer: tests/tools/test_train_eagle.py)."""


import numpy as np
import pytest
from click.testing import CliRunner

from specrt.cli import main
from specrt.export.arch import arch_from_model, numpy_weights
from specrt.export.eagle import (
    HeadError,
    draft_arch,
    draft_weights,
    head_module,
    load_head,
    save_head,
)
from specrt.export.graph import GraphOptions
from specrt.export.steps import decoder, write_model
from specrt.export.validate import check_eagle, probe_tokens, reference_greedy
from specrt.runtime.bundle.manifest import load_manifest
from tiny import tiny_head, tiny_model


@pytest.fixture(scope="module")
def target(tiny_dirs):
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(tiny_dirs["target"]).eval()


@pytest.fixture(scope="module")
def head_file(tiny_dirs, tmp_path_factory):
    return tiny_head(tiny_dirs["target"], tmp_path_factory.mktemp("head") / "h.safetensors", seed=3)


def test_fp32_graph_equals_torch_head(target, head_file, tiny_bundles, tmp_path):
    arch = arch_from_model(target, 256)
    hw = load_head(head_file, arch, None)
    entry = write_model(tmp_path, "draft", draft_arch(arch), draft_weights(numpy_weights(target), hw),
                        GraphOptions(eagle=True, hidden_out="next_hidden_states", max_seq_len=256), 9, {}, "eagle")
    folder = tiny_bundles["eagle"]
    tdec = decoder(folder, load_manifest(folder).target, keep_hidden=True)
    ddec = decoder(tmp_path, entry)
    prompt = probe_tokens(arch.vocab, 12)
    toks, _ = reference_greedy(target, prompt, 20)  # 32 rows: more than one draft call of 9
    res = check_eagle(ddec, tdec, target, hw, prompt, toks)
    assert res["max_abs"] < 1e-4 and res["argmax_match_torch"] == 1.0 and res["passed"], res
    # the same graph judged as an int4 one (argmax floor) passes; a fp32 graph that far off fails
    assert check_eagle(ddec, tdec, target, hw, prompt, toks, quantized=True)["passed"]
    off = {k: v * 1.5 if k == "norm.weight" else v for k, v in hw.items()}
    assert not check_eagle(ddec, tdec, target, off, prompt, toks)["passed"]
    assert res["positions"] == 20


def test_head_file_is_checked_against_the_target(target, head_file, tmp_path):
    arch = arch_from_model(target, 64)
    with pytest.raises(HeadError, match="not found"):
        load_head(tmp_path / "missing.safetensors", arch, None)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(HeadError, match="not a readable"):
        load_head(tmp_path / "junk.safetensors", arch, None)
    other = save_head(head_module(target), tmp_path / "other.safetensors", target_sha256="ab" * 32, config=target.config)
    with pytest.raises(HeadError, match="another target"):
        load_head(other, arch, "cd" * 32)
    assert load_head(other, arch, "ab" * 32)["fc.weight"].shape == (arch.hidden, 2 * arch.hidden)
    import dataclasses

    with pytest.raises(HeadError, match="hidden_size"):
        load_head(head_file, dataclasses.replace(arch, hidden=arch.hidden * 2), None)


def test_head_refuses_unsupported_family():
    with pytest.raises(HeadError, match="llama"):
        head_module(tiny_model("qwen2"))


def test_eagle_bundle_manifest(tiny_bundles):
    man = load_manifest(tiny_bundles["eagle"])
    assert man.draft.recipe == "eagle" and man.draft.kv.layers == 1
    assert man.draft.io.hidden_in == "hidden_states" and man.draft.io.hidden_out == "next_hidden_states"
    assert man.target.io.hidden_out == "hidden_states" and man.target.io.hidden_in == ""
    assert set(man.draft.parity) >= {"max_abs", "argmax_match_torch", "greedy_agreement_with_target"}
    assert man.draft.parity["passed"]
    assert man.draft.source["kind"] == "eagle-head" and len(man.draft.source["sha256"]) == 64
    # bundles without an EAGLE draft keep the plain contract
    assert load_manifest(tiny_bundles["int4"]).target.io.hidden_out == ""


def test_cli_export_missing_head_is_a_clear_error(tiny_dirs, tmp_path):
    res = CliRunner().invoke(main, ["export", "--target", str(tiny_dirs["target"]), "--out", str(tmp_path / "b"),
                                    "--draft", f"eagle:{tmp_path / 'nope.safetensors'}"])
    assert res.exit_code == 2
    assert "EAGLE head file not found" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "b").exists()


def test_malformed_heads_are_refused(target, head_file, tmp_path):
    from safetensors.numpy import save_file

    arch = arch_from_model(target, 64)
    hw = load_head(head_file, arch, None)
    meta = {"format": "specrt-eagle-1", "hidden_size": str(arch.hidden), "vocab_size": str(arch.vocab),
            "model_type": "llama"}
    save_file({k: v for k, v in hw.items() if k != "fc.bias"}, str(tmp_path / "nofc.safetensors"), metadata=meta)
    with pytest.raises(HeadError, match="fc.bias"):
        load_head(tmp_path / "nofc.safetensors", arch, None)
    save_file(hw, str(tmp_path / "fmt.safetensors"), metadata={**meta, "format": "other"})
    with pytest.raises(HeadError, match="format"):
        load_head(tmp_path / "fmt.safetensors", arch, None)
    wide = dict(hw, **{"layer.mlp.up_proj.weight": np.zeros((arch.intermediate + 8, arch.hidden), np.float32)})
    with pytest.raises(HeadError, match="up_proj"):
        draft_weights(numpy_weights(target), wide)


def test_standard_lowering_eagle_pair_is_lossless(tiny_dirs, head_file, tmp_path):
    """The TensorRT-ready lowering (TensorScatter + Attention) carries the feature IO too; on
    onnxruntime CPU its fp32 draft matches the torch head and speculation stays exact."""
    import specrt
    from specrt.export import export_bundle

    out = tmp_path / "std"
    man = export_bundle(str(tiny_dirs["target"]), out, draft=f"eagle:{head_file}", lowering="standard",
                        max_seq_len=128, max_draft_tokens=4, echo=None)
    assert man.draft.lowering == "standard" and man.draft.precision == "fp32"
    assert man.draft.parity["max_abs"] < 1e-4 and man.draft.parity["target_features_max_abs"] < 1e-3
    pipe = specrt.load(out)
    for prompt in ([1, 5, 9, 33, 7], [1, 3]):
        want = [t for c in pipe.stream_ids(prompt, max_new_tokens=24, draft="none", k=0) for t in c]
        got = [t for c in pipe.stream_ids(prompt, max_new_tokens=24, k=3) for t in c]
        assert got == want
