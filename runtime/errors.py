"""The error a caller can fix by changing its request, naming the option at fault.

`param` is the runtime's name for that option (`RequestOptions`' field: "max_new_tokens",
"logit_bias", ...; None when no single option is at fault), set where the error is raised, so
a server can point its client at the field without reading the message (runtime/serve maps the
runtime's names onto the protocol's).
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
