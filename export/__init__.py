"""specrt.export: Hugging Face / GGUF models -> ONNX bundle (may import torch, transformers, onnx).

    from specrt.export import export_bundle
    export_bundle("model-folder-or.gguf", "engines/mine", draft="self-int4")
"""

__version__ = "0.1.0"

from .api import VocabularyMismatch, check_same_vocabulary, export_bundle  # noqa: E402
from .errors import SourceError  # noqa: E402
from .families import SUPPORTED_MODEL_TYPES, UnsupportedArchitecture  # noqa: E402
from .validate import ParityError  # noqa: E402

__all__ = [
    "export_bundle",
    "check_same_vocabulary",
    "VocabularyMismatch",
    "SourceError",
    "ParityError",
    "UnsupportedArchitecture",
    "SUPPORTED_MODEL_TYPES",
]
