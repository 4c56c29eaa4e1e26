"""Every pool model, backend and drafter conforms to its protocol (runtime/backends/protocol.py,
runtime/drafters/protocol.py): the members exist on real instances, the required methods are
the class's own (not the protocol's stubs), and the methods take the protocol's parameters by
the same names, in the same order. Every class that subclasses one of the runtime's protocols
is listed here."""

from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np
import pytest

from fakes import FakeModel, fake_parts
from paths import ROOT
from specrt.runtime.backends.ort import OrtBackend, OrtModel
from specrt.runtime.backends.packed import PackedModel
from specrt.runtime.backends.protocol import Backend, PoolModel
from specrt.runtime.backends.single import SingleSequenceModel
from specrt.runtime.backends.trt import TrtBackend
from specrt.runtime.bundle.loader import load_models
from specrt.runtime.drafters import AutoDrafter, Drafter, EagleDrafter, ModelDrafter, NgramDrafter
from specrt.runtime.serve.anthropic.messages_api import MessagesOutput
from specrt.runtime.serve.llama.infill import InfillOutput
from specrt.runtime.serve.llama.schema_infill import InfillRequest
from specrt.runtime.serve.openai.outputs import ChatOutput, CompletionOutput
from specrt.runtime.serve.openai.responses_api import ResponsesOutput
from specrt.runtime.serve.openai.tool_chat import ToolChatOutput
from specrt.runtime.serve.shape import SSE_DONE, ResponseShape
from specrt.runtime.serve.translate import BlockOutput
from specrt.runtime.text.toolcalls import ToolPlan

POOL_MODELS = (OrtModel, PackedModel, SingleSequenceModel, FakeModel)
DRAFTERS = (ModelDrafter, NgramDrafter, AutoDrafter, EagleDrafter)
SHAPES = (ChatOutput, CompletionOutput, ToolChatOutput, InfillOutput, BlockOutput, ResponsesOutput, MessagesOutput)


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _same_params(fn, proto_fn) -> bool:
    """fn takes proto_fn's parameters by the same names in the same order (more after them only
    with defaults)."""
    want, sig = _params(proto_fn), inspect.signature(fn).parameters
    have = [p for p in sig if p != "self"]
    return have[: len(want)] == want and all(sig[p].default is not inspect.Parameter.empty for p in have[len(want):])


def _is_stub(fn) -> bool:
    """A protocol method without a default: its body is a docstring and `...`."""
    body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    body = body[1:] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str) else body
    return len(body) == 1 and isinstance(body[0], ast.Expr) and body[0].value.value is Ellipsis


def members(proto) -> tuple[list[str], list[str], list[str]]:
    """(attributes, required methods, methods with a default) a protocol declares."""
    own = {n: v for n, v in vars(proto).items() if not n.startswith("_")}
    methods = [n for n, v in own.items() if inspect.isfunction(v)]
    attrs = [n for n in proto.__annotations__ if not n.startswith("_")]
    return attrs, [m for m in methods if _is_stub(own[m])], [m for m in methods if not _is_stub(own[m])]


def conforms(cls, proto, obj=None) -> None:
    """cls has every method of `proto` (its required ones defined outside the protocol) with the
    protocol's parameters; an instance `obj` has every attribute."""
    attrs, required, optional = members(proto)
    for m in required:
        assert inspect.getattr_static(cls, m) is not vars(proto)[m], f"{cls.__name__}.{m} is the protocol's stub"
    for m in required + optional:
        assert _same_params(getattr(cls, m), getattr(proto, m)), f"{cls.__name__}.{m}"
    for a in attrs if obj is not None else ():
        assert hasattr(obj, a), f"{cls.__name__} lacks {a}"


def test_protocol_members_are_read_off_the_protocol():
    attrs, required, optional = members(PoolModel)
    assert {"pool", "max_t", "lanes", "max_tokens", "filler", "graph", "kernels"} <= set(attrs)
    assert required == ["run", "run_rows"] and optional == ["run_batch", "room"]
    assert PoolModel.max_tokens == 0 and PoolModel.lanes == 1  # the defaults a subclass takes


@pytest.mark.parametrize("cls", POOL_MODELS)
def test_pool_model_signatures(cls):
    conforms(cls, PoolModel)


@pytest.mark.parametrize("cls", [OrtBackend, TrtBackend])
def test_backend_signatures(cls):
    """TrtBackend needs a GPU to build, so only its class is checked here."""
    conforms(cls, Backend)
    for prop in ("takes_hidden", "has_hidden_out"):
        assert isinstance(inspect.getattr_static(cls, prop), property)


def test_fake_conforms(tmp_path):
    parts = fake_parts(tmp_path, draft="separate")
    for m in (parts.target, parts.draft):
        conforms(type(m), PoolModel, m)
        assert m.max_tokens == 0 and inspect.getattr_static(type(m), "run_batch") is PoolModel.run_batch


def test_loaded_models_conform(tiny_bundles):
    parts = load_models(tiny_bundles["eagle"], max_batch=2, hugepages=False)
    for m in (parts.target, parts.draft):
        assert isinstance(m, OrtModel)
        conforms(OrtModel, PoolModel, m)
        assert m.max_tokens == 0 and m.graph is None
    entry = parts.manifest.target
    backend = OrtBackend(parts.folder / entry.graph, entry)
    conforms(OrtBackend, Backend, backend)
    single = SingleSequenceModel(backend, entry, "target")
    conforms(SingleSequenceModel, PoolModel, single)
    logits = single.run(0, np.array([1, 2, 3]), 0)
    assert logits.shape == (3, entry.vocab_size) and logits.dtype == np.float32


def test_packed_models_conform(tiny_bundles):
    parts = load_models(tiny_bundles["int8"], max_batch=2, hugepages=False)
    target = parts.target
    assert isinstance(target, PackedModel) and target.max_tokens and target.filler is not (target.kernels and target.entry.packed.one_row) and target.graph is not None
    conforms(PackedModel, PoolModel, target)
    assert target.lanes >= 2 and target.max_tokens >= target.max_prefill_t


def test_drafters_conform(tmp_path):
    parts = fake_parts(tmp_path, draft="separate")
    model = ModelDrafter(parts.draft, 0)
    for d in (model, NgramDrafter(), AutoDrafter(model, NgramDrafter())):
        conforms(type(d), Drafter, d)
    for cls in DRAFTERS:
        conforms(cls, Drafter)


def test_response_shapes_conform():
    plan = ToolPlan(tools=[], constraint=None, names=frozenset(), choice="auto")
    shapes = [ChatOutput("m"), CompletionOutput("m", fim=True, heal=" x"), ToolChatOutput("m", plan),
              InfillOutput(InfillRequest(input_prefix="a", input_suffix="b")), ResponsesOutput("m", None, 3, {}),
              MessagesOutput("m", plan, 3)]
    for out in shapes:
        conforms(type(out), ResponseShape, out)
    for cls in SHAPES:
        conforms(cls, ResponseShape)
    chat, completion, tool_chat, infill, responses, messages = shapes
    assert (chat.fim, chat.heal, chat.plan, chat.done) == (False, "", None, SSE_DONE)  # the defaults
    assert completion.fim and completion.heal == " x" and infill.fim and tool_chat.plan is plan
    assert responses.done == "" and chat.text_stream(None, []) is None
    messages.stopped_by(0, "END")
    assert messages.stop_sequence == "END" and chat.stopped_by(0, "END") is None


def _subclasses(protocols: set[str]) -> set[str]:
    """Classes in runtime/ and tests/fakes.py whose bases name one of `protocols`."""
    found = set()
    for path in [*sorted((ROOT / "runtime").rglob("*.py")), ROOT / "tests" / "fakes.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and {ast.unparse(b) for b in node.bases} & protocols:
                found.add(node.name)
    return found


def test_every_class_of_a_protocol_is_checked_here():
    """A class that takes a protocol's defaults is checked against it above; a new one is added
    to these lists (and so to the checks)."""
    listed = {c.__name__ for c in POOL_MODELS + DRAFTERS + SHAPES} | {"OrtBackend", "TrtBackend"}
    assert _subclasses({"PoolModel", "Backend", "Drafter", "ResponseShape", "ModelDrafter", "ChatOutput",
                        "BlockOutput"}) <= listed


def test_each_class_name_in_the_runtime_means_one_thing():
    """A name defined as a class in two runtime modules reads as one thing and is two (the
    serving layer's `Backend` was runtime/backends/protocol.py's `Backend` in name only; the
    chat reply's wire `ToolCall` was text/toolstream.py's `ToolCall` in name only). The wire
    types in serve/schema*.py included."""
    from collections import defaultdict

    where = defaultdict(list)
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(ROOT)))
    assert {name: files for name, files in where.items() if len(files) > 1} == {}
