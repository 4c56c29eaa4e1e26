"""The adaptive policy's call-cost probe, kept on disk per bundle and machine (runtime/policy/cost_cache.py)."""

import pytest

import specrt
from specrt.runtime.policy import cost_cache
from specrt.runtime.policy import store as policies
from specrt.runtime.policy.adaptive import Costs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path))
    return tmp_path


def _no_probe(*a, **k):
    raise AssertionError("probed although a cached probe exists")


def test_probe_once_then_reuse(tiny_bundles, cache, monkeypatch):
    first = specrt.load(tiny_bundles["int8"]).costs()
    files = list(cache.glob("costs-*.json"))
    assert len(files) == 1
    monkeypatch.setattr(policies, "measure_costs", _no_probe)
    pipe = specrt.load(tiny_bundles["int8"])  # a new process would do the same
    # the pipeline takes the costs at load, before any request (from the cache here: a probe
    # would have raised; a failed probe only leaves it to the first adaptive request)
    again = pipe.scheduler.costs
    list(pipe.stream_ids([1, 5, 9, 33, 7], max_new_tokens=8, adaptive=True))
    assert pipe.scheduler.costs is again
    assert again is not None and ("model", True) in pipe.store._learned  # the request ran adaptive
    assert again.target_ms == first.target_ms and again.draft_ms == first.draft_ms
    assert again.rows_ms == first.rows_ms and again.draft_rows_ms == first.draft_rows_ms  # batched shapes too
    assert len(first.rows_ms) > 1 and len(first.draft_rows_ms) > 1  # a pool of several slots was probed
    assert again is not first and again.scale == 1.0
    assert pipe.costs() is again and pipe.store.costs() is again  # probed (or loaded) once per pipeline


def test_other_setup_or_bad_file_probes_again(tiny_bundles, cache, monkeypatch):
    specrt.load(tiny_bundles["int8"]).costs()
    probed = []
    monkeypatch.setattr(policies, "measure_costs", lambda *a, **k: probed.append(1) or Costs({1: 5.0, 2: 6.0}, 1.0))
    specrt.load(tiny_bundles["int8"], draft="ngram").costs()  # no draft model loaded: another key
    assert probed == [1]
    for f in cache.glob("costs-*.json"):
        f.write_text("{not json")
    assert specrt.load(tiny_bundles["int8"]).costs().target_ms == {1: 5.0, 2: 6.0}  # re-probed, no error
    assert probed == [1, 1]
    specrt.load(tiny_bundles["int8"], cost_cache=False).costs()  # the bench's setting: always its own probe
    assert probed == [1, 1, 1]


def test_unwritable_cache_dir_is_not_an_error(tiny_bundles, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(blocker / "sub"))  # cannot be created
    assert specrt.load(tiny_bundles["int8"]).costs().target_ms[1] > 0
    assert cost_cache.load("0" * 24) is None


def test_foreign_or_invalid_entries_are_probed_again(tiny_bundles, cache, monkeypatch):
    import json

    specrt.load(tiny_bundles["int8"]).costs()
    (f,) = cache.glob("costs-*.json")
    good = json.loads(f.read_text())
    probed = []
    monkeypatch.setattr(policies, "measure_costs", lambda *a, **k: probed.append(1) or Costs({1: 5.0}, 1.0))
    for bad in ({**good, "key": "x" * 24}, {**good, "draft_ms": float("nan")}, {**good, "draft_ms": -1.0},
                {**good, "target_ms": {"2": 3.0}}):
        f.write_text(json.dumps(bad))
        assert specrt.load(tiny_bundles["int8"]).costs().target_ms == {1: 5.0}
    assert len(probed) == 4


def test_the_key_follows_the_setup(tiny_bundles):
    from specrt.runtime.bundle.manifest import load_manifest

    man = load_manifest(tiny_bundles["int8"])
    base = cost_cache.key(tiny_bundles["int8"], man, device="cpu", threads=None)
    assert base == cost_cache.key(tiny_bundles["int8"], man, device="cpu", threads=None)
    for other in (dict(device="cuda", threads=None), dict(device="cpu", threads=1),
                  dict(device="cpu", threads=None, extra="pool=True")):
        assert cost_cache.key(tiny_bundles["int8"], man, **other) != base
    assert cost_cache.key(tiny_bundles["int4"], load_manifest(tiny_bundles["int4"]), device="cpu", threads=None) != base


def test_no_home_means_no_cache_not_an_error(tiny_bundles, monkeypatch):
    from pathlib import Path

    for var in ("SPECRT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cost_cache.cache_dir() is None
    assert specrt.load(tiny_bundles["int8"]).costs().target_ms[1] > 0  # probed, nothing written


def test_the_probe_runs_at_load_not_in_the_first_requests(tiny_bundles, cache):
    """Issue 39 part 4: a pipeline that may draft adaptively has its costs before any request
    (a server reports ready after); one that cannot draft never probes."""
    pipe = specrt.load(tiny_bundles["int8"], max_batch=2)
    try:
        assert pipe.scheduler.costs is not None and pipe.scheduler.costs.packed
        assert len(list(cache.glob("costs-*.json"))) == 1
    finally:
        pipe.close()
    pipe = specrt.load(tiny_bundles["int8"], max_batch=2, draft="none")
    try:
        assert pipe.scheduler.costs is None
    finally:
        pipe.close()


def test_the_key_names_the_kernels_form(tmp_path, monkeypatch):
    """A server pinned to a lower form (SPECRT_KERNELS_ISA=avx2 on an AVX-512 host) plans with
    that form's call costs, never with the best form's cached ones."""
    from types import SimpleNamespace

    from specrt.runtime import kernels

    graph = tmp_path / "packed8.kernels.onnx"
    graph.write_bytes(b"")
    model = SimpleNamespace(graph=graph, kernels=True)
    monkeypatch.delenv("SPECRT_KERNELS_ISA", raising=False)
    best = kernels.isa()
    assert best != "ref", "this suite runs where the library has a fast form (AVX2 or better, NEON)"
    stamp = policies._graph_stamp(model)
    monkeypatch.setenv("SPECRT_KERNELS_ISA", "ref")
    assert kernels.isa() == "ref" and policies._graph_stamp(model) != stamp
    assert policies._graph_stamp(SimpleNamespace(graph=graph, kernels=False)) == f"{graph.name}:{graph.stat().st_mtime_ns}"
