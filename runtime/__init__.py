"""specrt.runtime: run a bundle with onnxruntime (NumPy + onnxruntime + tokenizers; no torch).

    import specrt
    pipe = specrt.load("engines/default")
    res = pipe.generate("Explain KV caches.", max_new_tokens=128)

Any number of threads may call `generate` / `stream` on one pipeline (asyncio: `agenerate` /
`astream`); the engine batches their work and each gets the output it would get alone.
"""

from .backends.kvpool import ContextOverflow
from .backends.protocol import NonFiniteLogits
from .bundle.manifest import BundleError, Manifest, load_manifest
from .bundle.memory import InsufficientMemory
from .engine import EngineBusy, EngineClosed, Stats
from .errors import InvalidRequest
from .options import LoadOptions, RequestOptions
from .pipeline import Pipeline, Result, load
from .sampling.draws import InvalidSampling, SamplingConfig

# Errors that are the user's to fix: the CLI prints them without a traceback and exits 2
# (InsufficientMemory, InvalidRequest and ContextOverflow are ValueErrors).
USER_ERRORS = (BundleError, ContextOverflow, InvalidSampling, ValueError)
# Faults of the model or its export, not of the input: the CLI prints them and exits 1
MODEL_ERRORS = (NonFiniteLogits,)

__all__ = [
    "load", "Pipeline", "Result", "Stats", "SamplingConfig", "Manifest", "load_manifest",
    "BundleError", "ContextOverflow", "InvalidSampling", "NonFiniteLogits", "USER_ERRORS", "MODEL_ERRORS",
    "EngineBusy", "EngineClosed", "InsufficientMemory", "LoadOptions", "RequestOptions", "InvalidRequest",
]
