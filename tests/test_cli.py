"""CLI errors: clear message, non-zero exit, no traceback. Uses the tiny bundles."""

import json
import shutil
import subprocess
import sys

import pytest

from specrt.runtime import kernels


def run(*args, input=None):
    r = subprocess.run([sys.executable, "-m", "specrt.cli", *args], capture_output=True, text=True, input=input, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_generate_json(tiny_bundles):
    r = run("generate", "--engines", str(tiny_bundles["good"]), "--json", "--max-new-tokens", "8", "--raw", "w5 w6 w7")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == {"text", "token_ids", "stats", "kernels"}
    assert d["kernels"] == kernels.form_for(True)[0]  # tiny bundles carry kernel graphs (their attention)
    assert d["stats"]["new_tokens"] == len(d["token_ids"]) <= 8
    for key in ("prefill_ms", "ttft_ms", "decode_ms", "tpot_ms", "tokens_per_s", "rounds", "draft_tokens",
                "accepted_tokens", "acceptance_rate", "mean_accepted_per_round", "per_position_acceptance",
                "draft_ms", "verify_ms", "other_ms"):
        assert key in d["stats"]


def test_generate_stream_and_stdin(tiny_bundles):
    r = run("generate", "--engines", str(tiny_bundles["int4"]), "--max-new-tokens", "6", "-", input="w9 w10")
    assert r.returncode == 0 and "tok/s" in r.stderr and "acceptance" in r.stderr


def test_missing_bundle(tmp_path):
    r = run("generate", "--engines", str(tmp_path / "nope"), "hi")
    assert r.returncode == 2 and "no bundle at" in r.stderr


def test_corrupt_manifest(tiny_bundles, tmp_path):
    b = shutil.copytree(tiny_bundles["none"], tmp_path / "b")
    (b / "specrt.json").write_text("{oops")
    r = run("generate", "--engines", str(b), "hi")
    assert r.returncode == 2 and "corrupt" in r.stderr


def test_unsupported_schema(tiny_bundles, tmp_path):
    b = shutil.copytree(tiny_bundles["none"], tmp_path / "b")
    d = json.loads((b / "specrt.json").read_text())
    d["schema_version"] = 99
    (b / "specrt.json").write_text(json.dumps(d))
    r = run("generate", "--engines", str(b), "hi")
    assert r.returncode == 2 and "schema_version 99" in r.stderr


def test_missing_graph_file(tiny_bundles, tmp_path):
    b = shutil.copytree(tiny_bundles["none"], tmp_path / "b")
    (b / "target" / "model.onnx.data").unlink()
    r = run("generate", "--engines", str(b), "hi")
    assert r.returncode == 2 and "incomplete" in r.stderr


@pytest.mark.parametrize("graph,flags", [("model.onnx", ["--no-packed"]), ("packed1.onnx", ["--no-kernels"]),
                                         ("packed1.kernels.onnx", [])])
def test_corrupt_graph_file(tiny_bundles, tmp_path, graph, flags):
    """The graph a load runs is corrupt: the bundle graph (`--no-packed`), the packed graph of
    the load's lanes (docs/bundle.md "Packed calls") or its kernel form (the default where the
    kernel library is built)."""
    if not flags and not kernels.fast():
        pytest.skip("no AVX-512 here: loads run the packed graph, tested above")
    b = shutil.copytree(tiny_bundles["none"], tmp_path / "b")
    (b / "target" / graph).write_bytes(b"not a model")
    r = run("generate", "--engines", str(b), "--draft", "none", *flags, "hi")
    assert r.returncode == 2 and "cannot load target graph" in r.stderr


def test_generate_names_the_kernel_form_it_ran(tiny_bundles):
    """The summary line says which form of specrt's own operators ran: none with --no-kernels."""
    b = str(tiny_bundles["int8"])
    r = run("generate", "--engines", b, "--max-new-tokens", "4", "--raw", "w5")
    assert r.returncode == 0 and f"kernels={kernels.form_for(True)[0]}," in r.stderr, r.stderr
    r = run("generate", "--engines", b, "--max-new-tokens", "4", "--no-kernels", "--raw", "w5")
    assert r.returncode == 0 and "kernels=none," in r.stderr, r.stderr


def test_an_operator_that_refuses_its_weights_refuses_the_bundle(tiny_bundles, tmp_path):
    """A kernel graph whose QMatMul8 node claims 4x the columns its weights hold (issue 49) is
    refused when the session is built, as one line with the bundle error's exit code, and
    specrt.load refuses it the same way (the server's load)."""
    import onnx

    import specrt
    from specrt.runtime import BundleError

    if not kernels.fast():
        pytest.skip(f"loads here run no kernel graph: {kernels.form_for(True)[1]}")
    b = shutil.copytree(tiny_bundles["int8"], tmp_path / "b")
    graph = b / "draft" / "packed1.kernels.onnx"
    m = onnx.load(graph, load_external_data=False)
    node = next(n for n in m.graph.node if n.op_type == "QMatMul8")
    attr = next(a for a in node.attribute if a.name == "N")
    attr.i *= 4
    onnx.save(m, graph)
    r = run("generate", "--engines", str(b), "--max-new-tokens", "4", "--raw", "w5")
    assert r.returncode == 2 and "cannot load draft graph" in r.stderr and "codes must hold" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    with pytest.raises(BundleError, match="codes must hold"):
        specrt.load(b, max_batch=1, hugepages=False)


def test_prompt_too_long(tiny_bundles):
    prompt = " ".join(["w5"] * 300)
    r = run("generate", "--engines", str(tiny_bundles["none"]), "--draft", "none", "--raw", prompt)
    assert r.returncode == 2 and "exceeds the bundle's context of 256 tokens" in r.stderr


@pytest.mark.parametrize("args,msg", [
    (["--temperature", "-0.5"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-k", "-1"], "top_k"),
    (["--k", "99"], "k must be between 0 and 8"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
])
def test_invalid_settings(tiny_bundles, args, msg):
    r = run("generate", "--engines", str(tiny_bundles["good"]), *args, "w5")
    assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_no_draft_in_bundle(tiny_bundles):
    r = run("generate", "--engines", str(tiny_bundles["none"]), "--draft", "model", "w5")
    assert r.returncode == 2 and "no draft model" in r.stderr


def test_inspect(tiny_bundles):
    r = run("inspect", str(tiny_bundles["int4"]))
    assert r.returncode == 0
    form, why = kernels.form_for(True)
    assert f"  kernels: {form} ({why or 'specrt' + chr(39) + 's own operators'}" in r.stdout, r.stdout
    assert "precision=int4" in r.stdout and "KiB/token" in r.stdout and "parity" in r.stdout
    assert "num_logits_to_keep [1] (optional)" in r.stdout and "logits [B,n," in r.stdout


def test_export_bad_source(tmp_path):
    r = run("export", "--target", str(tmp_path / "missing"), "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "not found" in r.stderr


def test_non_finite_logits_is_reported(tiny_bundles, monkeypatch):
    import numpy as np

    import specrt
    from specrt.runtime import NonFiniteLogits

    pipe = specrt.load(tiny_bundles["good"])
    target = pipe.parts.target
    real = target.run_batch

    def nan(batch):
        out = real(batch)
        out.logits = [x * np.float32("nan") for x in out.logits]
        return out

    monkeypatch.setattr(target, "run_batch", nan)
    with pytest.raises(NonFiniteLogits, match="non-finite"):
        pipe.generate("w5", max_new_tokens=4, chat=False)
    assert pipe.counters()["running"] == 0  # the request ended; the engine is still serving
    monkeypatch.setattr(target, "run_batch", real)
    assert pipe.generate("w5", max_new_tokens=4, chat=False).stats.new_tokens > 0
    pipe.close()


def test_non_finite_logits_are_a_model_fault_not_a_user_error(tiny_bundles):
    """NaN logits say the model or its export is broken: not in USER_ERRORS (exit 2, "fix your
    input"), but reported as clearly, with exit 1."""
    from specrt.runtime import MODEL_ERRORS, USER_ERRORS, NonFiniteLogits

    err = NonFiniteLogits("x")
    assert not isinstance(err, USER_ERRORS) and isinstance(err, MODEL_ERRORS)
    script = ("import sys\nimport numpy as np\nfrom specrt.runtime.backends.ort import OrtModel\n"
              "from specrt.runtime.backends.packed import PackedModel\nreal = OrtModel.run\n"
              "OrtModel.run = lambda self, *a, **k: real(self, *a, **k) * np.float32('nan')\n"
              "packed = PackedModel.run_packed\n"
              "PackedModel.run_packed = lambda self, *a, **k: [x * np.float32('nan') for x in packed(self, *a, **k)]\n"
              "from specrt.cli import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", script, "generate", "--engines", str(tiny_bundles["none"]), "--raw",
                        "--max-new-tokens", "4", "w5"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1 and "specrt: error: " in r.stderr and "non-finite logits" in r.stderr, r.stderr


def _bench_load_config(tmp_path, monkeypatch, *flags):
    """`specrt bench --concurrency` in process up to the run: the LoadConfig it would run (or
    the CLI's result when it refuses first)."""
    from click.testing import CliRunner

    from specrt.cli import main
    from specrt.runtime.bench import load

    seen = []

    def fake_run_load(cfg, progress):
        seen.append(cfg)
        return {}

    monkeypatch.setattr(load, "run_load", fake_run_load)
    monkeypatch.setattr(load, "table", lambda results: "")
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"prompt": "w5 w6"}\n')
    res = CliRunner().invoke(main, ["bench", "--engines", str(tmp_path / "no-bundle"), "--workload", str(wl),
                                    "--concurrency", "1,2", "--out", str(tmp_path / "out"), *flags])
    return res, seen


def test_bench_concurrency_honours_one_k_and_refuses_a_list(tmp_path, monkeypatch):
    """With --concurrency, --k is the fixed-k arm's: one value is used, none means the
    bundle's, and a list is refused (it used to become None, silently)."""
    res, seen = _bench_load_config(tmp_path, monkeypatch, "--k", "3")
    assert res.exit_code == 0, res.output
    assert seen[0].k == 3 and seen[0].levels == [1, 2]
    res, seen = _bench_load_config(tmp_path, monkeypatch)
    assert res.exit_code == 0 and seen[0].k is None, res.output
    res, seen = _bench_load_config(tmp_path, monkeypatch, "--k", "4,5")
    assert res.exit_code == 2 and not seen
    assert "with --concurrency, --k takes one value (the fixed-k arm's), got '4,5'" in res.output


def test_inspect_eagle_bundle(tiny_bundles):
    r = run("inspect", str(tiny_bundles["eagle"]))
    assert r.returncode == 0
    assert "recipe=eagle" in r.stdout and "hidden_states [B,T,64]" in r.stdout and "next_hidden_states" in r.stdout
    assert "target features vs transformers" in r.stdout and "argmax match" in r.stdout


def test_a_bundle_without_a_draft_loads_by_default(tiny_bundles):
    """specrt.load follows the bundle: no draft model means target-only (an explicit
    draft='model' keeps the clear error)."""
    import specrt
    from specrt.runtime import BundleError

    pipe = specrt.load(tiny_bundles["none"])
    assert pipe.default_draft == "none" and pipe.generate("w5", max_new_tokens=3, chat=False).stats.new_tokens > 0
    assert specrt.load(tiny_bundles["int8"]).default_draft == "model"
    with pytest.raises(BundleError, match="no draft model"):
        specrt.load(tiny_bundles["none"], draft="model")
    r = run("generate", "--engines", str(tiny_bundles["none"]), "--raw", "--max-new-tokens", "3", "w5")
    assert r.returncode == 0, r.stderr


def _pair_config(tmp_path, **export):
    """A model-pair TOML like configs/default.toml whose target does not exist (a flag must name it)."""
    lines = ['name = "from-config"', "[target]", f'source = "{tmp_path / "no-such-model"}"',
             "[draft]", 'source = "self-int4"', "k = 3", "[export]"]
    lines += [f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {str(value).lower() if isinstance(value, bool) else value}"
              for key, value in export.items()]
    cfg = tmp_path / "pair.toml"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def test_export_flags_win_over_the_config(tiny_dirs, tmp_path):
    """`specrt export --config`: every flag given overrides the config's value; what no flag
    names comes from the config."""
    from click.testing import CliRunner

    from specrt.cli import main
    from specrt.runtime.bundle.manifest import load_manifest

    cfg = _pair_config(tmp_path, max_seq_len=96, max_draft_tokens=8, precision="fp32", lowering="ort")
    out = tmp_path / "b"
    res = CliRunner().invoke(main, ["export", "--config", str(cfg), "--target", str(tiny_dirs["target"]),
                                    "--draft", "self-int8", "--k", "2", "--max-draft-tokens", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    man = load_manifest(out)
    assert man.draft.recipe == "self-int8" and man.draft.default_k == 2  # flags (the config: self-int4, k 3)
    assert man.target.max_tokens_per_call == 5  # --max-draft-tokens 4 (the config: 8)
    assert man.target.kv.max_seq_len == 96 and man.target.precision == "fp32"  # no flag: the config's


@pytest.mark.parametrize("flag,msg", [(["--k", "0"], "k must be between 1"),
                                      (["--max-draft-tokens", "0"], "max_draft_tokens >= 1")])
def test_export_flag_of_zero_is_not_replaced_by_the_config(tiny_dirs, tmp_path, flag, msg):
    """A flag's 0 is the user's value, refused with its reason, never silently the config's."""
    from click.testing import CliRunner

    from specrt.cli import main

    cfg = _pair_config(tmp_path, max_seq_len=96, max_draft_tokens=8)
    res = CliRunner().invoke(main, ["export", "--config", str(cfg), "--target", str(tiny_dirs["target"]), *flag,
                                    "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and msg in res.output, res.output
    assert not (tmp_path / "b").exists()


def test_export_takes_trt_from_the_config_and_no_trt_wins(tiny_dirs, tmp_path):
    """`[export] trt = true` asks for TensorRT plans (refused here with its reason: they need the
    standard lowering); `--no-trt` overrides the config."""
    from click.testing import CliRunner

    from specrt.cli import main

    cfg = _pair_config(tmp_path, max_seq_len=96, max_draft_tokens=4, lowering="ort", trt=True)
    args = ["export", "--config", str(cfg), "--target", str(tiny_dirs["target"]), "--draft", "none"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "TensorRT plans are built from the standard lowering" in res.output, res.output
    res = CliRunner().invoke(main, [*args, "--no-trt", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "b" / "specrt.json").is_file()


def test_export_trt_in_the_config_must_be_a_boolean(tiny_dirs, tmp_path):
    from click.testing import CliRunner

    from specrt.cli import main

    cfg = _pair_config(tmp_path, max_seq_len=96, trt="false")  # a string, not TOML's false
    res = CliRunner().invoke(main, ["export", "--config", str(cfg), "--target", str(tiny_dirs["target"]),
                                    "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "trt must be true or false, got 'false'" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "b").exists()



def _with_memory(available: str, *args, timeout=120):
    """The CLI in a subprocess whose reading of the available memory is `available` (a Python
    expression over `calls`, the readings so far): the seam of runtime/bundle/memory.py."""
    script = ("import sys\nfrom specrt.runtime.bundle import memory\ncalls = []\n"
              f"memory.available_bytes = lambda device: calls.append(device) or ({available})\n"
              "from specrt.cli import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


@pytest.mark.parametrize("cmd", [["serve", "--max-batch", "300", "--port", "0"], ["generate", "--max-seq-len", "200", "w5"]])
def test_a_load_that_cannot_fit_is_refused_clearly(tiny_bundles, cmd):
    """serve refuses before it opens its port (its first line is the error, not the startup
    line), generate before loading: the numbers, exit 2."""
    r = _with_memory("100 * 2**20", cmd[0], "--engines", str(tiny_bundles["int8"]), *cmd[1:])
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("specrt: error: not enough memory for ") and "GB is available" in r.stderr
    assert "not even one slot" in r.stderr  # 100 MiB is less than onnxruntime itself


def test_serve_load_that_fails_after_the_port_opens_exits_2(tiny_bundles):
    """Memory that shrinks between the check before the port opens and the load in its thread:
    the load's own check refuses, and the server exits 2 with the message."""
    r = _with_memory("10**12 if len(calls) == 1 else 100 * 2**20", "serve", "--engines", str(tiny_bundles["int8"]),
                     "--port", "0", "--max-batch", "4")
    assert r.returncode == 2 and "cannot load" in r.stderr and "not enough memory for 4 KV slots" in r.stderr, r.stderr
    assert f"kernels={kernels.form_for(True)[0]}" in r.stderr.splitlines()[0], r.stderr  # the startup line


def test_serve_says_once_what_runs_without_a_fast_kernel_form(tiny_bundles, monkeypatch):
    """A load that runs none of specrt's operators (here forced: SPECRT_KERNELS_ISA=ref) says so in
    the server's startup line, once, naming what runs instead."""
    monkeypatch.setenv("SPECRT_KERNELS_ISA", "ref")
    r = _with_memory("10**12 if len(calls) == 1 else 100 * 2**20", "serve", "--engines", str(tiny_bundles["int8"]),
                     "--port", "0", "--max-batch", "4")
    startup = r.stderr.splitlines()[0]
    assert startup.startswith("specrt: serving ") and "kernels=none: SPECRT_KERNELS_ISA=ref" in startup, r.stderr
    assert r.stderr.count("run instead") == 1 and "MatMulNBits and GroupQueryAttention run instead" in startup


def test_a_cpu_without_a_fast_form_is_named(monkeypatch):
    """Where the library runs only its portable form (an x86 CPU without AVX2, or ARM64 before
    its form), the load's reason says what the CPU lacks and what runs instead."""
    monkeypatch.delenv("SPECRT_KERNELS_ISA", raising=False)
    monkeypatch.setattr(kernels, "isa", lambda: "ref")
    form, why = kernels.form_for(True)
    assert form == "none" and kernels.NEEDS in why and why.endswith("GroupQueryAttention run instead")
    assert kernels.form_for(True, wanted=False) == ("none", "--no-kernels")


def test_max_batch_takes_integers_or_auto(tiny_bundles):
    r = run("serve", "--engines", str(tiny_bundles["int8"]), "--max-batch", "lots")
    assert r.returncode == 2 and "'lots' is neither a positive integer nor 'auto'" in r.stderr


def test_inspect_reports_memory(tiny_bundles):
    r = run("inspect", str(tiny_bundles["good"]))
    # two pools (a separate draft), each 512 B a token x 256 tokens: 0.25 MiB
    assert r.returncode == 0 and "KV 0.2 MiB per slot at S_max 256 (every pool)" in r.stdout, r.stdout
    assert "weights target 0.00 GB, draft 0.00 GB" in r.stdout and "--max-batch auto takes 64 slots" in r.stdout


@pytest.mark.parametrize("value,msg", [("1536", "PREFIX,SUFFIX"), ("0,512", "prefix >= 1"), ("x,y", "PREFIX,SUFFIX")])
def test_serve_refuses_a_bad_fim_window_before_loading(tiny_bundles, value, msg):
    r = run("serve", "--engines", str(tiny_bundles["good"]), "--fim-window", value)
    assert r.returncode == 2 and "--fim-window" in r.stderr and msg in r.stderr and "Traceback" not in r.stderr
