"""`specrt` command line: a thin shell over specrt.export and specrt.runtime, one module per
command (export, inspect, generate, serve, bench, bench_serve) and what they share (common.py).

Heavy imports happen inside the commands, so `specrt --help` and `specrt generate` never load
torch; `specrt export` needs the `export` extra.
"""

from __future__ import annotations

import click

from . import bench_serve  # noqa: F401  (registers `bench serve` on the bench group)
from .bench import bench
from .export import export
from .generate import generate
from .inspect import inspect
from .serve import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Speculative decoding outside PyTorch: export a bundle, then generate from it."""


for command in (export, inspect, generate, bench, serve):
    main.add_command(command)

__all__ = ["main"]
