"""Fixtures: tiny random-weight models' folders and bundles (made by tests/tiny.py), the real
default bundle built by `make export`, fake pipelines (tests/fakes.py). Shared helpers live in
modules of their own (tiny.py, checks.py, fakes.py, paths.py), never here: test files import
those, and nothing imports this file."""

from __future__ import annotations

import os
import sys

import pytest

from paths import DEFAULT_BUNDLE, ROOT
from tiny import save_tiny, tiny_head

sys.path.insert(0, str(ROOT / "tools"))  # the research scripts run as files (tests/tools)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """HF folders: target, a random-weights draft (same vocab), and a draft with another vocab."""
    base = tmp_path_factory.mktemp("tiny")
    return {
        "target": save_tiny(base / "target", seed=0),
        "bad_draft": save_tiny(base / "bad_draft", seed=1),
        "other_vocab": save_tiny(base / "other_vocab", seed=2, shift=1000),
    }


@pytest.fixture(scope="session", autouse=True)
def _private_cost_cache(tmp_path_factory):
    """Cost probes (runtime/policy/cost_cache.py) go to a temporary folder, never to ~/.cache; the CLI
    subprocesses inherit it."""
    old = os.environ.get("SPECRT_CACHE_DIR")
    os.environ["SPECRT_CACHE_DIR"] = str(tmp_path_factory.mktemp("specrt-cache"))
    yield
    if old is None:
        os.environ.pop("SPECRT_CACHE_DIR", None)
    else:
        os.environ["SPECRT_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tiny_bundles(tiny_dirs, tmp_path_factory):
    """Bundles over the tiny target: good draft (the same model), bad draft, self-int4, self-int8, none, an
    (untrained) EAGLE head, and self-int8 / good draft / EAGLE head with an fp16 KV cache ("int8-kv16",
    "good-kv16", "eagle-kv16")."""
    from specrt.export import export_bundle

    base = tmp_path_factory.mktemp("bundles")
    t = str(tiny_dirs["target"])
    kw = dict(max_seq_len=256, max_draft_tokens=8, echo=None)
    drafts = {"good": t, "bad": str(tiny_dirs["bad_draft"]), "int4": "self-int4", "int8": "self-int8", "none": "none",
              "eagle": "eagle:" + str(tiny_head(tiny_dirs["target"], base / "head.safetensors"))}
    for name, draft in drafts.items():
        export_bundle(t, base / name, draft=draft, **kw)
    for name, draft in {"int8-kv16": "self-int8", "good-kv16": t, "eagle-kv16": drafts["eagle"]}.items():
        export_bundle(t, base / name, draft=draft, kv_dtype="fp16", **kw)
        drafts[name] = draft
    return {name: base / name for name in drafts}


@pytest.fixture(scope="session")
def default_bundle():
    if not (DEFAULT_BUNDLE / "specrt.json").is_file():
        pytest.fail(f"the default bundle {DEFAULT_BUNDLE} is missing: run `make export` first "
                    "(`make test` does it)")
    return DEFAULT_BUNDLE


@pytest.fixture
def make(tmp_path):
    """make(**kw) -> a fake pipeline (tests/fakes.py `fake_pipeline`), closed after the test.
    Each test builds its own, so nothing adaptive k learns in one test reaches another."""
    from fakes import fake_pipeline

    made = []

    def make(**kw):
        made.append(fake_pipeline(tmp_path / f"p{len(made)}", **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()

