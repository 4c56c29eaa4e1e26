"""specrt: speculative decoding outside PyTorch. `specrt.load(bundle)` runs a bundle; the
exporter lives in `specrt.export` (needs the `export` extra)."""

from specrt.runtime import Pipeline, Result, load  # noqa: F401

__version__ = "0.1.0"
