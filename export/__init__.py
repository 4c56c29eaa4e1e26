"""specrt.export: Hugging Face / GGUF models -> ONNX bundle (may import torch, transformers, onnx).

    from specrt.export import export_bundle
    export_bundle("model-folder-or.gguf", "engines/mine", draft="self-int4")
"""

from .api import VocabularyMismatch, check_same_vocabulary, export_bundle
from .errors import SourceError
from .families import SUPPORTED_MODEL_TYPES, UnsupportedArchitecture
from .validate import ParityError
from .version import __version__

__all__ = [
    "__version__",
    "export_bundle",
    "check_same_vocabulary",
    "VocabularyMismatch",
    "SourceError",
    "ParityError",
    "UnsupportedArchitecture",
    "SUPPORTED_MODEL_TYPES",
]
