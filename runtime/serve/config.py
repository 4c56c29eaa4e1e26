"""What `specrt serve` is asked to load and how it serves, in one place for the CLI's
single-process server and the Ray deployment (whose config files' `args` take the same names as
the CLI's flags). Plain data: no web framework is imported here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..bundle.manifest import Manifest, load_manifest
from ..options import default_draft


@dataclass
class ServerConfig:
    """What the HTTP layer needs (serving.py)."""

    model_id: str  # what /v1/models lists and requests must name
    api_key: str | None = None  # Bearer token required on /v1/* (None: open)
    max_body_bytes: int = 1 << 20  # larger bodies get 413
    request_timeout_s: float | None = None  # a request still running then ends (finish_reason "timeout")
    draft: str | None = None  # per-request drafter (None: the pipeline's default)
    adaptive: bool | None = None

    def server_options(self) -> dict:
        """The RequestOptions fields the server sets for every request (the client cannot)."""
        return dict(draft=self.draft, adaptive=self.adaptive, timeout_s=self.request_timeout_s)


@dataclass
class ServeOptions:
    """The bundle to load, how to load it, and the server's settings (the CLI's flags)."""

    engines: str | None = None  # bundle folder (None: $SPECRT_ENGINES, else engines/default)
    max_batch: int | str = 8  # KV slots ("auto": the CLI sizes it before loading)
    max_seq_len: int | None = None  # context per slot (None: the bundle's S_max)
    max_queue: int = 64  # requests waiting for a slot before 503
    draft: str | None = None  # None: the bundle's draft model if it has one, else none
    adaptive: bool = True
    k: int | None = None
    threads: int | None = None  # intra-op threads (None: onnxruntime's default, all cores)
    hugepages: bool = True
    prefix_cache: bool = True
    api_key: str | None = None  # None: $SPECRT_API_KEY if set
    request_timeout: float | None = None
    max_body_mb: float = 1.0
    grace: float = 30.0  # seconds in-flight requests get to finish at a stop

    @property
    def folder(self) -> Path:
        return Path(self.engines or os.environ.get("SPECRT_ENGINES") or "engines/default").resolve()

    def draft_for(self, man: Manifest | None = None) -> str:
        """The drafter served: the one asked for, else the bundle's (its manifest: read if not given)."""
        man = man if man is not None else load_manifest(self.folder)
        return default_draft(self.draft, man.draft is not None)

    def server_config(self, man: Manifest | None = None) -> ServerConfig:
        """The HTTP layer's config for this bundle (raises BundleError if its manifest does not read)."""
        draft = self.draft_for(man)
        return ServerConfig(model_id=self.folder.name, api_key=self.api_key or os.environ.get("SPECRT_API_KEY"),
                            max_body_bytes=int(self.max_body_mb * 2**20), request_timeout_s=self.request_timeout,
                            draft=draft, adaptive=self.adaptive and draft != "none")

    def load(self):
        """-> the Pipeline (max_batch must be a count by now)."""
        from .. import load

        return load(self.folder, draft=self.draft_for(), threads=self.threads, k=self.k, global_pool=True,
                    hugepages=self.hugepages, adaptive=self.adaptive, max_batch=self.max_batch,
                    max_seq_len=self.max_seq_len, max_queue=self.max_queue, prefix_cache=self.prefix_cache)
