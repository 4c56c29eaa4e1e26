"""tools/graft_draft.py: bundle A's target with a model of bundle B as draft loads and stays exact."""

from graft_draft import graft

import specrt
from specrt.runtime.bundle.manifest import load_manifest


def test_grafted_draft_loads_and_is_exact(tiny_bundles, tmp_path):
    out = graft(tiny_bundles["none"], f"{tiny_bundles['int4']}:draft", "model-int4", tmp_path / "g")
    man = load_manifest(out)
    assert (man.draft.recipe, man.draft.precision, man.draft.graph) == ("model-int4", "int4", "draft/model.onnx")
    assert man.target == load_manifest(tiny_bundles["none"]).target
    with specrt.load(out, draft="model", adaptive=False) as pipe:
        prompt = [1, 5, 9, 33, 7]
        want = [t for c in pipe.stream_ids(prompt, max_new_tokens=24, draft="none", k=0) for t in c]
        assert [t for c in pipe.stream_ids(prompt, max_new_tokens=24, k=4, draft="model") for t in c] == want
