"""gguf-py's GGUFReader with its metadata arrays parsed fast: the same `fields` (every part the
same dtype, shape and bytes, the same `data` indices and `types`), built in a few tenths of a
second instead of 7-12 s for a 151k-token vocabulary on this machine's CPUs.

gguf-py parses an array element by element, each element a recursive call that slices the file's
`np.memmap` twice (a memmap slice runs Python's `__getitem__` and `__array_finalize__`): about
10^6 slices for a vocabulary's tokens, merges and token types. Here an array of strings or of
scalars is walked in one loop over a plain ndarray view of the same map (`struct.unpack_from` for
each string's length, C-level slices for the parts); nested arrays and byte-swapped files (no
such GGUF is published) take gguf-py's own path. Tensors are gguf-py's own (`_build_tensors`).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from gguf.constants import GGUFValueType
from gguf.gguf_reader import GGUFReader


class FastGGUFReader(GGUFReader):
    """GGUFReader (read only); `fields` as gguf-py builds them, parsed without per-element memmap
    slices."""

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list[int], list]:
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        plain = self.data.view(np.ndarray)  # the same map, sliced without memmap's Python hooks
        itype = int(struct.unpack_from("<I", plain, orig_offs)[0])
        sub = GGUFValueType(itype)
        if sub != GGUFValueType.STRING and sub not in self.gguf_scalar_to_np:
            return super()._get_field_parts(orig_offs, raw_type)  # nested arrays: gguf-py's path
        raw_itype = plain[orig_offs:orig_offs + 4].view(np.uint32)
        alen = plain[orig_offs + 4:orig_offs + 12].view(np.uint64)
        n = int(alen[0])
        offs = orig_offs + 12
        parts: list[Any] = [raw_itype, alen]
        types = [GGUFValueType.ARRAY] + ([sub] if n else [])
        if sub == GGUFValueType.STRING:
            unpack = struct.Struct("<Q").unpack_from
            for _ in range(n):
                (slen,) = unpack(plain, offs)
                parts.append(plain[offs:offs + 8].view(np.uint64))
                parts.append(plain[offs + 8:offs + 8 + slen])
                offs += 8 + slen
            return offs - orig_offs, parts, list(range(3, 2 + 2 * n + 1, 2)), types
        dtype = np.dtype(self.gguf_scalar_to_np[sub])
        values = plain[offs:offs + n * dtype.itemsize].view(dtype).reshape(n, 1)
        parts += list(values)  # one (1,)-shaped view per element, as gguf-py's parts
        return 12 + n * dtype.itemsize, parts, list(range(2, 2 + n)), types
