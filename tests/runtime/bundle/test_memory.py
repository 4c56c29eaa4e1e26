"""runtime/bundle/memory.py: the load's memory arithmetic (hand-computed), the readings of the machine
(fake /proc and cgroup trees), and the loader's check before anything is allocated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import specrt
from specrt.runtime import ContextOverflow
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.bundle import memory
from specrt.runtime.bundle.loader import memory_plan
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.bundle.memory import InsufficientMemory, MemoryPlan, ModelMemory

SMALL = MemoryPlan(models=(ModelMemory("target", 1000, 1000, vocab=10, rows=4, features=0),
                           ModelMemory("draft", 600, 400, vocab=10, rows=4, features=0)),
                   kv_per_token=100, features_per_token=0, runtime=500)


def test_a_packed_targets_logits_rows_follow_its_lanes():
    """A packed target holds every lane's widest verification: the lanes its slots load."""
    m = ModelMemory("t", 0, 0, vocab=10, rows=64, features=0, lanes=(1, 2, 4, 8, 16), lane_rows=17)
    mask = 8 * 3 * 8
    assert m.buffers(3, 8) == (max(64, 4 * 17) + 2) * 48 + mask  # 3 slots load 4 lanes
    assert m.buffers(1, 8) == (64 + 2) * 48 + 8 * 8  # one lane: a prompt chunk is wider
    assert m.buffers(40, 8) == (16 * 17 + 2) * 48 + 8 * 40 * 8  # at most 16 lanes


def test_buffers_grow_with_slots_past_the_widest_call():
    m = ModelMemory("t", 1000, 1010, vocab=10, rows=4, features=0)
    assert m.buffers(2, 8) == 4 * (8 + 40) + 8 * 2 * 8  # rows stay 4: ids + logits, then the mask
    assert m.buffers(6, 8) == 6 * (8 + 40) + 8 * 6 * 8
    assert ModelMemory("e", 0, 0, vocab=10, rows=4, features=3).buffers(1, 8) == 4 * (8 + 40 + 12) + 64


def test_steady_peak_and_what_fits():
    # runtime 500 + weights 1400 + 2 slots x 8 tokens x 100 + buffers 2 x (4 x 48 + 2 x 8 x 8)
    assert SMALL.steady(2, 8) == 500 + 1400 + 1600 + 2 * (192 + 128) == 4140
    assert SMALL.peak(2, 8) == 4140
    # no slots: building either model peaks at 2500 (the target: 500 + 1000 + its files 1000)
    assert SMALL.peak(0, 8) == 2500
    # up to 4 slots: 2284 + 928 per slot; the fifth widens the ids/logits rows (7020)
    assert SMALL.steady(4, 8) == 5996 and SMALL.steady(5, 8) == 7020
    assert SMALL.max_slots(6000, 8) == 4 and SMALL.max_slots(5995, 8) == 3
    assert SMALL.max_slots(2600, 8) == 0 and SMALL.max_slots(10**9, 8, ceiling=3) == 3
    # 2 slots: 2284 + 232 per token of context
    assert SMALL.max_seq(4000, 2, limit=8) == 7 and SMALL.max_seq(10**9, 2, limit=8) == 8


# one model of 1 GB, KV 0.1 GB per slot of 1000 tokens, negligible buffers (12 B a row + the mask)
GB_PLAN = MemoryPlan(models=(ModelMemory("target", 10**9, 10**9, vocab=1, rows=1, features=0),),
                     kv_per_token=100_000, features_per_token=0, runtime=0)


def test_an_explicit_count_that_cannot_fit_names_the_bytes_and_what_fits():
    with pytest.raises(InsufficientMemory) as e:
        memory.size(GB_PLAN, 20, 1000, int(2.5e9), s_max=1000)
    msg = str(e.value)
    # 1e9 + 20 x 1e8 of KV + buffers: 3.00 GB; (2.5e9 - 1e9) / (1e8 + 8012) = 14.998
    assert "20 KV slots of 1000 tokens" in msg and "needs 3.00 GB" in msg and "2.50 GB is available" in msg
    assert "at most 14 slots" in msg
    # 20 slots x s tokens: 1e9 + 20 x (100000 + 8) x s + 240 <= 2.5e9 -> s = 749
    assert "max_seq_len <= 749" in msg
    assert memory.size(GB_PLAN, 14, 1000, int(2.5e9)).slots == 14


def test_auto_takes_what_fits_in_the_fraction_up_to_the_ceiling():
    # 0.9 x 2.5e9 = 2.25e9 (above the 2e9 of building the model): (2.25e9 - 1e9) / (1e8 + 8012) = 12.499
    assert memory.size(GB_PLAN, "auto", 1000, int(2.5e9), fraction=0.9).slots == 12
    assert memory.size(GB_PLAN, "auto", 1000, int(2.5e9), fraction=1.0, ceiling=10).slots == 10
    with pytest.raises(InsufficientMemory, match="not even one slot"):
        memory.size(GB_PLAN, "auto", 1000, int(1.05e9))  # 0.9 x 1.05e9 < the weights
    with pytest.raises(ValueError, match="give a slot count"):
        memory.size(GB_PLAN, "auto", 1000, None)
    assert memory.size(GB_PLAN, 500, 1000, None).slots == 500  # unknown: explicit counts pass


def test_building_a_session_can_be_the_peak():
    plan = MemoryPlan(models=(ModelMemory("target", int(1.5e9), 10**9, vocab=1, rows=1, features=0),),
                      kv_per_token=100_000, features_per_token=0, runtime=0)
    with pytest.raises(InsufficientMemory, match="building a session peaks at 2.50 GB"):
        memory.size(plan, 1, 1000, int(2.4e9))  # steady 1.1e9 would fit


def test_mem_available(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       100 kB\nMemFree:   1 kB\nMemAvailable:    2048 kB\n")
    assert memory.mem_available(str(f)) == 2048 * 1024
    assert memory.mem_available(str(tmp_path / "missing")) is None


def _group(folder, **files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_cgroup_v1_takes_the_tightest_level(tmp_path):
    (tmp_path / "self").write_text("9:cpu:/\n4:memory:/a/b\n0::/\n")
    cg = tmp_path / "cg"
    _group(cg / "memory", memory_limit_in_bytes="9223372036854771712\n", memory_usage_in_bytes="900\n")
    _group(cg / "memory" / "a", memory_limit_in_bytes="2000\n", memory_usage_in_bytes="1500\n",
           memory_stat="cache 400\ntotal_inactive_file 300\n")
    _group(cg / "memory" / "a" / "b", memory_limit_in_bytes="9223372036854771712\n", memory_usage_in_bytes="5\n")
    assert memory.cgroup_room(str(tmp_path / "self"), str(cg)) == 2000 - 1500 + 300


def test_cgroup_v2_limit_and_namespaced_group(tmp_path):
    (tmp_path / "self").write_text("0::/svc/x\n")
    cg = tmp_path / "cg"
    _group(cg / "svc", memory_max="1000\n", memory_current="700\n", memory_stat="anon 600\ninactive_file 50\n")
    _group(cg / "svc" / "x", memory_max="max\n", memory_current="10\n")
    assert memory.cgroup_room(str(tmp_path / "self"), str(cg)) == 350
    (tmp_path / "ns").write_text("0::/not/visible\n")  # a cgroup namespace: the group is the root
    _group(cg, memory_max="500\n", memory_current="100\n")
    assert memory.cgroup_room(str(tmp_path / "ns"), str(cg)) == 400
    (tmp_path / "none").write_text("0::/svc/x\n")
    (cg / "svc" / "memory.max").write_text("max\n")
    (cg / "memory.max").unlink()
    assert memory.cgroup_room(str(tmp_path / "none"), str(cg)) is None


def test_plan_of_a_bundle(tiny_bundles):
    """Hand-computed from the tiny bundles: 2 layers x 2 KV heads x 16 dims, float32, K and V:
    512 bytes per token; a self-draft shares the target's pool, a separate draft has its own."""
    for name, kv in (("int8", 512), ("good", 1024), ("none", 512)):
        folder = tiny_bundles[name]
        man = load_manifest(folder)
        plan = memory_plan(folder, man, want_draft=man.draft is not None)
        assert plan.kv_per_token == kv, name
        t = plan.models[0]
        size = sum((folder / f).stat().st_size for f in (man.target.graph, man.target.data) if f)
        assert (t.file_bytes, t.weights, t.rows, t.vocab) == (size, int(size * 1.01), 64, 128)
    assert memory_plan(tiny_bundles["int8"], load_manifest(tiny_bundles["int8"]), want_draft=False).kv_per_token == 512


def _per_slot_and_fixed(folder, seq):
    """Hand arithmetic for a tiny bundle with a self-draft, up to 64 slots: per slot its KV
    (512 B a token) and two masks (8 B a token each); fixed: runtime, weights, and per model
    64 rows of ids (8 B) and logits (128 x 4 B)."""
    man = load_manifest(folder)
    weights = 0
    for e, factor in ((man.target, 1.01), (man.draft, 0.67)):
        weights += int(sum((folder / f).stat().st_size for f in (e.graph, e.data) if f) * factor)
    return seq * (512 + 2 * 8), memory.RUNTIME_BYTES + weights + 2 * 64 * (8 + 4 * 128)


def test_auto_picks_the_count_the_arithmetic_says(tiny_bundles, monkeypatch):
    folder = tiny_bundles["int8"]
    per_slot, fixed = _per_slot_and_fixed(folder, 256)
    monkeypatch.setattr(memory, "available_bytes", lambda device: int((fixed + 10.5 * per_slot) / 0.9))
    pipe = specrt.load(folder, max_batch="auto", hugepages=False)
    try:
        assert pipe.parts.target.pool.slots == pipe.counters()["slots"] == 10
        assert pipe.kv_bytes == 10 * 256 * 512
    finally:
        pipe.close()
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**12)
    pipe = specrt.load(folder, max_batch="auto", hugepages=False, max_seq_len=64)
    try:
        assert pipe.parts.target.pool.slots == memory.AUTO_MAX_SLOTS
    finally:
        pipe.close()


def test_a_load_that_cannot_fit_is_refused_before_anything_is_built(tiny_bundles, monkeypatch):
    folder = tiny_bundles["int8"]
    per_slot, fixed = _per_slot_and_fixed(folder, 256)
    monkeypatch.setattr(memory, "available_bytes", lambda device: fixed + 5 * per_slot + 100)
    built = []
    monkeypatch.setattr("specrt.runtime.bundle.loader.OrtModel", lambda *a, **kw: built.append("session"))
    monkeypatch.setattr(KVPool, "allocate", lambda self: built.append("pool"))
    with pytest.raises(InsufficientMemory) as e:
        # the bundle graph (the hand arithmetic's 64 logits rows; a packed target's rows follow
        # its lanes: test_a_packed_targets_logits_rows_follow_its_lanes)
        specrt.load(folder, max_batch=6, hugepages=False, packed=False)
    assert "6 KV slots of 256 tokens" in str(e.value) and "at most 5 slots" in str(e.value)
    assert built == []


def test_the_check_runs_before_the_weights_and_the_pool_take_memory(default_bundle):
    """A fresh process with 1.5 GB 'available' asks for 16 slots of the default pair (2.4 GB):
    refused, and its peak RSS (VmHWM: ru_maxrss carries the forking parent's) stays that of an
    interpreter with the tokenizer (the load would take > 0.9 GB)."""
    script = (
        "import json, specrt\n"
        "from specrt.runtime.bundle import memory\n"
        "memory.available_bytes = lambda device: 1_500_000_000\n"
        "try:\n"
        f"    specrt.load({str(default_bundle)!r}, max_batch=16)\n"
        "    msg = None\n"
        "except memory.InsufficientMemory as e:\n"
        "    msg = str(e)\n"
        "hwm = next(ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:'))\n"
        "print(json.dumps({'msg': msg, 'peak': int(hwm.split()[1]) * 1024}))\n"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    man = load_manifest(default_bundle)
    fits = memory_plan(default_bundle, man, want_draft=True).max_slots(1_500_000_000, man.target.kv.max_seq_len)
    assert 1 <= fits < 16
    assert out["msg"] and "16 KV slots of 2048 tokens" in out["msg"] and f"at most {fits} slots" in out["msg"]
    assert out["peak"] < 500e6, out["peak"]


def _greedy(pipe, prompt, n, **kw):
    return [t for c in pipe.stream_ids(prompt, max_new_tokens=n, temperature=0.0, ignore_eos=True, **kw) for t in c]


def test_shorter_slots_generate_the_same_greedy_tokens(tiny_bundles):
    """Slots of 48 tokens instead of the bundle's 256: the graphs take the buffers' length as
    given, so speculative greedy output (fixed and adaptive k, whose cost probe must fit the
    short slots) equals the full-length pool's, up to the last position; one token more is a
    context error that names the loaded context."""
    prompt = [5, 9, 14, 3, 22, 7, 31, 8, 40, 11]
    full = specrt.load(tiny_bundles["int8"], max_batch=2, hugepages=False)
    short = specrt.load(tiny_bundles["int8"], max_batch=2, hugepages=False, max_seq_len=48)
    try:
        assert short.parts.target.pool.host[0].shape == (2, 2, 48, 16) and short.max_seq_len == 48
        assert short.kv_bytes == full.kv_bytes * 48 // 256
        want = _greedy(full, prompt, 38, draft="none", k=0)
        assert len(want) == 38  # EOS ignored: the run reaches the pool's last row
        assert _greedy(short, prompt, 38, k=4) == want
        assert _greedy(short, prompt, 38, adaptive=True) == want
        assert _greedy(short, prompt, 38, draft="none", k=0) == want
        with pytest.raises(ContextOverflow, match="exceeds the context loaded .max_seq_len. of 48 tokens"):
            short.request(prompt, max_new_tokens=39)
    finally:
        full.close()
        short.close()


def test_shorter_slots_on_the_standard_lowering(tiny_dirs, tmp_path):
    """The standard lowering reads S from the KV buffer's shape (TensorScatter + Attention over
    the whole buffer): 40-token slots give the 128-token bundle's greedy output."""
    from specrt.export import export_bundle

    folder = tmp_path / "std"
    export_bundle(str(tiny_dirs["target"]), folder, draft="none", lowering="standard", max_seq_len=128,
                  max_draft_tokens=4, echo=None)
    prompt = [5, 9, 14, 3, 22, 7]
    full = specrt.load(folder, max_batch=1, hugepages=False)
    short = specrt.load(folder, max_batch=1, hugepages=False, max_seq_len=40)
    try:
        want = _greedy(full, prompt, 34)
        assert len(want) == 34 and _greedy(short, prompt, 34) == want
    finally:
        full.close()
        short.close()


@pytest.mark.parametrize("seq", [0, 9, 257])
def test_max_seq_len_out_of_range_is_refused(tiny_bundles, seq):
    with pytest.raises(ValueError, match="max_seq_len must be between 10 and the bundle's S_max 256"):
        specrt.load(tiny_bundles["none"], max_seq_len=seq, hugepages=False)


@pytest.mark.parametrize("draft", ["self", "separate", None])
def test_kv_bytes_have_one_definition(tmp_path, draft):
    """A slot's KV bytes count every pool once (a self-draft shares the target's, a separate
    draft adds its own): the pipeline and the engine's counters (/metrics, Ray's sum) agree."""
    from fakes import fake_pipeline

    pipe = fake_pipeline(tmp_path, draft=draft, slots=3)
    try:
        target = pipe.parts.target.pool.bytes_per_slot()
        assert pipe.kv_bytes_per_slot == target * (2 if draft == "separate" else 1)
        c = pipe.counters()
        assert c["kv_bytes_per_slot"] == pipe.kv_bytes_per_slot
        assert c["kv_bytes"] == pipe.kv_bytes
        assert pipe.kv_bytes == 3 * pipe.kv_bytes_per_slot
    finally:
        pipe.close()


def test_a_context_not_asked_for_is_shortened_to_hold_the_slots():
    # 2 slots x 8192 tokens: 1e9 + 2 x 8192 x (1e5 + 8) + buffers = 2.64 GB > 2.5 GB
    with pytest.raises(InsufficientMemory, match="max_seq_len <= 7499"):
        memory.size(GB_PLAN, 2, 8192, int(2.5e9), s_max=8192)
    got = memory.size(GB_PLAN, 2, 8192, int(2.5e9), s_max=8192, fit_seq=True, fraction=1.0)
    assert (got.slots, got.seq, got.shortened_from) == (2, 7424, 8192)  # 7499, to 256 tokens
    assert "context shortened from 8192 to 7424 tokens so that 2 slots fit" in got.summary()
    # what fits at the full context is not shortened, and nothing below MIN_FIT_SEQ is offered
    assert memory.size(GB_PLAN, 1, 8192, int(2.5e9), fit_seq=True).shortened_from is None
    with pytest.raises(InsufficientMemory):
        memory.size(GB_PLAN, 10, 8192, int(2.5e9), s_max=8192, fit_seq=True)  # 10 x 4096 does not fit
    # auto keeps the context and takes the slots that fit; only where not one fits is it shortened
    assert memory.size(GB_PLAN, "auto", 8192, int(2.5e9), fraction=1.0, fit_seq=True).seq == 8192
    one = memory.size(GB_PLAN, "auto", 20000, int(2.5e9), fraction=1.0, fit_seq=True)
    assert (one.slots, one.shortened_from) == (1, 20000) and one.seq == 14848  # (1.5e9 - 8) / (1e5 + 8): 14998


def test_a_shortened_context_leaves_the_fractions_headroom():
    """The context specrt picks for explicit slots fills `fraction` of what is available, as
    `auto` does (issue 49: the server once shortened to 14.06 of 14.08 GB, then refused it)."""
    got = memory.size(GB_PLAN, 2, 8192, int(2.5e9), s_max=8192, fit_seq=True)  # fraction 0.9: 2.25 GB
    assert (got.slots, got.seq) == (2, 6144)  # (2.25e9 - 1e9 - 16) / (2 x (1e5 + 8)): 6249, to 256 tokens
    assert GB_PLAN.peak(2, got.seq) <= 0.9 * 2.5e9 < GB_PLAN.peak(2, got.seq + 256) + 0.25e9


def test_a_size_specrt_chose_is_not_refused_by_the_loads_own_check(tiny_bundles, monkeypatch):
    """`specrt serve` sizes the load, then loads with those slots and that context, which checks
    them again against a new reading of the memory: a reading smaller by what another process
    took in between (0.2 of 14.08 GB in issue 49) must not refuse the server's own choice."""
    from specrt.runtime.bundle.loader import size_load
    from specrt.runtime.bundle.manifest import load_manifest

    folder = tiny_bundles["int8"]  # S_max 256
    per_slot, fixed = _per_slot_and_fixed(folder, 256)
    avail = [int((fixed + 5 * per_slot) / memory.DEFAULT_MEMORY_FRACTION)]  # 6 slots fit in 0.9 of it only shortened
    monkeypatch.setattr(memory, "available_bytes", lambda device: avail[0])
    monkeypatch.setattr(memory, "MIN_FIT_SEQ", 64)
    sizing = size_load(folder, load_manifest(folder), want_draft=True, device="cpu", max_batch=6, max_seq_len=None,
                       memory_fraction=memory.DEFAULT_MEMORY_FRACTION, packed=False)
    assert sizing.shortened_from == 256 and sizing.plan.peak(6, sizing.seq) <= 0.9 * avail[0]
    avail[0] = int(avail[0] * 0.985)  # smaller between sizing and the load's check
    with specrt.load(folder, max_batch=sizing.slots, max_seq_len=sizing.seq, hugepages=False, packed=False) as pipe:
        assert (pipe.parts.target.pool.slots, pipe.max_seq_len) == (6, sizing.seq)


def test_a_capped_pool_counts_its_rows_only():
    plan = MemoryPlan(models=GB_PLAN.models, kv_per_token=100, features_per_token=0, runtime=0,
                      kv_capped=((10, 300),))
    assert plan.kv_per_slot(1000) == 100 * 1000 + 10 * 300
    assert plan.kv_per_slot(200) == 100 * 200 + 10 * 200


def test_a_load_without_a_context_fits_its_slots_and_says_so(tiny_bundles, monkeypatch):
    folder = tiny_bundles["int8"]  # S_max 256
    per_slot, fixed = _per_slot_and_fixed(folder, 256)
    monkeypatch.setattr(memory, "available_bytes", lambda device: fixed + 5 * per_slot + 100)
    monkeypatch.setattr(memory, "MIN_FIT_SEQ", 64)
    with pytest.raises(InsufficientMemory, match="6 KV slots of 256 tokens"):
        specrt.load(folder, max_batch=6, max_seq_len=256, hugepages=False, packed=False)  # asked for: refused
    pipe = specrt.load(folder, max_batch=6, hugepages=False, packed=False, memory_fraction=1.0)
    try:
        sizing = pipe.parts.sizing
        assert pipe.parts.target.pool.slots == 6 and pipe.max_seq_len == sizing.seq == 213  # 5 x 256 rows over 6 slots (under 256: not rounded)
        assert pipe.max_seq_len < 256 and "context shortened from 256 to 213 tokens" in sizing.summary()
    finally:
        pipe.close()


def test_an_eagle_heads_pool_follows_the_loads_context(tiny_bundles):
    """An EAGLE head has a pool of its own (not the target's) and never reads a window: its rows
    are the load's context, not its bundle's S_max nor a window's run."""
    with specrt.load(tiny_bundles["eagle"], max_batch=1, max_seq_len=100, hugepages=False) as pipe:
        assert pipe.parts.eagle and pipe.parts.draft.pool is not pipe.parts.target.pool
        assert pipe.parts.draft.pool.capacity == pipe.parts.target.pool.capacity == 100
