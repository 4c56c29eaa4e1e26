"""Every pool model, backend and drafter conforms to its protocol (runtime/backends/protocol.py,
runtime/drafters/protocol.py): the members exist on real instances, and the methods take the
protocol's parameters by the same names, in the same order."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from fakes import fake_parts
from specrt.runtime.backends.ort import OrtBackend, OrtModel
from specrt.runtime.backends.protocol import Backend, PoolModel
from specrt.runtime.backends.single import SingleSequenceModel
from specrt.runtime.backends.trt import TrtBackend
from specrt.runtime.bundle.loader import load_models
from specrt.runtime.drafters import AutoDrafter, Drafter, EagleDrafter, ModelDrafter, NgramDrafter


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _same_methods(cls, proto, methods) -> None:
    for m in methods:
        assert _params(getattr(cls, m)) == _params(getattr(proto, m)), f"{cls.__name__}.{m}"


@pytest.mark.parametrize("cls", [OrtModel, SingleSequenceModel])
def test_pool_model_signatures(cls):
    _same_methods(cls, PoolModel, ("run", "run_rows"))


@pytest.mark.parametrize("cls", [OrtBackend, TrtBackend])
def test_backend_signatures(cls):
    """TrtBackend needs a GPU to build, so only its class is checked here."""
    _same_methods(cls, Backend, ("run",))
    for prop in ("takes_hidden", "has_hidden_out"):
        assert isinstance(inspect.getattr_static(cls, prop), property)


def test_fake_conforms(tmp_path):
    parts = fake_parts(tmp_path, draft="separate")
    for m in (parts.target, parts.draft):
        assert isinstance(m, PoolModel)
        _same_methods(type(m), PoolModel, ("run", "run_rows"))


def test_loaded_models_conform(tiny_bundles):
    parts = load_models(tiny_bundles["eagle"], max_batch=2, hugepages=False)
    for m in (parts.target, parts.draft):
        assert isinstance(m, OrtModel) and isinstance(m, PoolModel)
    entry = parts.manifest.target
    backend = OrtBackend(parts.folder / entry.graph, entry)
    assert isinstance(backend, Backend)
    single = SingleSequenceModel(backend, entry, "target")
    assert isinstance(single, PoolModel)
    logits = single.run(0, np.array([1, 2, 3]), 0)
    assert logits.shape == (3, entry.vocab_size) and logits.dtype == np.float32


def test_drafters_conform(tmp_path):
    parts = fake_parts(tmp_path, draft="separate")
    model = ModelDrafter(parts.draft, 0)
    drafters = [model, NgramDrafter(), AutoDrafter(model, NgramDrafter())]
    for d in drafters:
        assert isinstance(d, Drafter)
    for cls in (ModelDrafter, NgramDrafter, AutoDrafter, EagleDrafter):
        _same_methods(cls, Drafter, ("route", "start", "take", "commit"))


def test_each_class_name_in_the_runtime_means_one_thing():
    """A name defined as a class in two runtime modules reads as one thing and is two (the
    serving layer's `Backend` was runtime/backends/protocol.py's `Backend` in name only). The
    wire types in serve/protocol*.py mirror OpenAI's names, which may match a runtime type's."""
    import ast
    from collections import defaultdict

    from paths import ROOT

    where = defaultdict(list)
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        if path.parent.name == "serve" and path.name.startswith("protocol"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(ROOT)))
    assert {name: files for name, files in where.items() if len(files) > 1} == {}
