"""`specrt inspect`: what a bundle holds (runtime/bundle/describe.py builds the text)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import engines_default, fail


@click.command()
@click.argument("path", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the manifest as JSON")
def inspect(path, as_json):
    """Show what a bundle holds: models, IO, KV, limits, parity."""
    from specrt.runtime.bundle.describe import describe
    from specrt.runtime.bundle.manifest import BundleError, load_manifest

    path = Path(path or engines_default())
    try:
        man = load_manifest(path)
    except BundleError as e:
        fail(str(e))
    click.echo(man.to_json() if as_json else "\n".join(describe(path, man)))
