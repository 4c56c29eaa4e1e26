"""What `specrt serve` is asked to load and how it serves, in one place for the CLI's
single-process server and the Ray deployment (whose config files' `args` take the same names as
the CLI's flags). Plain data: no web framework is imported here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..bundle.manifest import Manifest, load_manifest
from ..options import LoadOptions, default_draft
from ..text.fim import FimWindow


@dataclass
class ServerConfig:
    """What the HTTP layer needs (serving.py)."""

    model_id: str  # what /v1/models lists and requests must name
    api_key: str | None = None  # Bearer token required on /v1/* (None: open)
    max_body_bytes: int = 1 << 20  # larger bodies get 413
    request_timeout_s: float | None = None  # a request still running then ends (finish_reason "timeout")
    draft: str | None = None  # per-request drafter (None: the pipeline's default)
    adaptive: bool | None = None
    # fill-in-the-middle requests (/infill, completions with a suffix) on a server that drafts:
    # n-gram drafting, measured fastest for editors' short completions in a file they resend
    # (no draft model reading the file first; docs/benchmarks.md §18). None: the server's drafter
    fim_draft: str | None = "ngram"
    # how much of the file around the cursor a FIM prompt keeps (text/fim.py FimWindow; None: all)
    fim_window: FimWindow | None = FimWindow()

    def server_options(self, fim: bool = False) -> dict:
        """The RequestOptions fields the server sets for every request (the client cannot)."""
        draft = self.fim_draft if fim and self.fim_draft and self.draft != "none" else self.draft
        return dict(draft=draft, adaptive=self.adaptive, timeout_s=self.request_timeout_s)


# what the server loads unless told otherwise: 8 slots, adaptive k, one onnxruntime thread pool
SERVE_LOADING = LoadOptions(max_batch=8, adaptive=True, global_pool=True)


@dataclass(frozen=True)
class ServeOptions:
    """The bundle to load, how to load it (`LoadOptions`, runtime/options.py) and the server's
    settings. The CLI's flags and a Ray config file's `args` are flat (`from_args`)."""

    engines: str | None = None  # bundle folder (None: $SPECRT_ENGINES, else engines/default)
    loading: LoadOptions = SERVE_LOADING  # max_batch "auto": the CLI sizes it before loading
    api_key: str | None = None  # None: $SPECRT_API_KEY if set
    request_timeout: float | None = None  # seconds; a request still running then ends
    max_body_mb: float = 1.0  # larger request bodies get 413
    grace: float = 30.0  # seconds in-flight requests get to finish at a stop
    fim_window: str = "1536,512"  # FIM prompts keep this much of the file around the cursor ('none': all)

    @classmethod
    def from_args(cls, **args):
        """From flat arguments: this class's fields and LoadOptions' (the CLI's flags, a config
        file's `args`); the load's start from SERVE_LOADING."""
        base = args.pop("loading", SERVE_LOADING)
        load_kw = {k: args.pop(k) for k in list(args) if k in _LOAD_FIELDS}
        return cls(**args, loading=replace(base, **load_kw))

    def args(self) -> dict:
        """The flat form `from_args` takes (what the Ray deployment sends its replicas)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "loading"}
        return own | {f.name: getattr(self.loading, f.name) for f in fields(LoadOptions)}

    @property
    def folder(self) -> Path:
        return Path(self.engines or os.environ.get("SPECRT_ENGINES") or "engines/default").resolve()

    def draft_for(self, man: Manifest | None = None) -> str:
        """The drafter served: the one asked for, else the bundle's (its manifest: read if not given)."""
        man = man if man is not None else load_manifest(self.folder)
        return default_draft(self.loading.draft, man.draft is not None)

    def server_config(self, man: Manifest | None = None) -> ServerConfig:
        """The HTTP layer's config for this bundle (raises BundleError if its manifest does not read)."""
        draft = self.draft_for(man)
        adaptive = self.loading.adaptive is not False  # None: on, as a load of more than one slot
        return ServerConfig(model_id=self.folder.name, api_key=self.api_key or os.environ.get("SPECRT_API_KEY"),
                            max_body_bytes=int(self.max_body_mb * 2**20), request_timeout_s=self.request_timeout,
                            draft=draft, adaptive=adaptive and draft != "none",
                            fim_window=FimWindow.parse(self.fim_window))

    def load(self):
        """-> the Pipeline (max_batch must be a count by now)."""
        from ..pipeline import load

        return load(self.folder, replace(self.loading, draft=self.draft_for()))


_LOAD_FIELDS = {f.name for f in fields(LoadOptions)}
