"""Reading `specrt.json` (runtime/bundle/manifest.py): older schema versions stay readable."""

import json
import shutil

import specrt
from specrt.runtime.bundle.manifest import READABLE_VERSIONS, load_manifest


def _as_schema_1(src, dst):
    """A copy of a bundle whose manifest is what a schema-1 exporter wrote: no EAGLE feature IO
    (io.hidden_out / io.hidden_in came with schema 2), nor the later optional logits_to_keep."""
    b = shutil.copytree(src, dst)
    d = json.loads((b / "specrt.json").read_text())
    d["schema_version"] = 1
    for role in ("target", "draft"):
        for key in ("hidden_out", "hidden_in", "logits_to_keep"):
            del d[role]["io"][key]
    (b / "specrt.json").write_text(json.dumps(d))
    return b


def test_schema_1_manifest_loads_and_generates_as_before(tiny_bundles, tmp_path):
    assert 1 in READABLE_VERSIONS
    src = tiny_bundles["int8"]
    old = _as_schema_1(src, tmp_path / "v1")
    man, now = load_manifest(old), load_manifest(src)
    assert man.schema_version == 1 and now.schema_version == 2
    for entry in (man.target, man.draft):
        assert entry.io.hidden_out == entry.io.hidden_in == entry.io.logits_to_keep == ""
    assert man.target.kv == now.target.kv and man.draft.recipe == now.draft.recipe == "self-int8"
    prompt = [1, 5, 9, 33, 7]
    kw = dict(max_new_tokens=24, k=3, ignore_eos=True)
    with specrt.load(old, hugepages=False) as p1, specrt.load(src, hugepages=False) as p2:
        assert p1.parts.shared_kv and not p1.parts.eagle  # the same pair: a self-draft on the target's pool
        got = [t for c in p1.stream_ids(prompt, **kw) for t in c]
        assert got == [t for c in p2.stream_ids(prompt, **kw) for t in c]
        assert got == [t for c in p1.stream_ids(prompt, draft="none", **kw) for t in c]
