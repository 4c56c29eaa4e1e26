"""specrt.runtime: run a bundle with onnxruntime (NumPy + onnxruntime + tokenizers; no torch).

    import specrt
    pipe = specrt.load("engines/default")
    res = pipe.generate("Explain KV caches.", max_new_tokens=128)
"""

from .decoder import NonFiniteLogits
from .kv import ContextOverflow
from .manifest import BundleError, Manifest, load_manifest
from .pipeline import Pipeline, Result, load
from .sampling import InvalidSampling, SamplingConfig
from .speculate import Stats

# Errors that are the user's to fix: the CLI prints them without a traceback.
USER_ERRORS = (BundleError, ContextOverflow, InvalidSampling, NonFiniteLogits, ValueError)

__all__ = [
    "load", "Pipeline", "Result", "Stats", "SamplingConfig", "Manifest", "load_manifest",
    "BundleError", "ContextOverflow", "InvalidSampling", "NonFiniteLogits", "USER_ERRORS",
]
