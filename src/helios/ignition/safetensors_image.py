"""A safetensors file as its header plus the tensors' own memory, for writing without a copy.

`safetensors_image(tensors)` lays the tensors out exactly as `safetensors.torch.save` does (the
same header bytes: tensors sorted by dtype, widest first, then by name; compact JSON; the header
padded with spaces to a multiple of 8), but never joins them: `segments` hands the header and each
tensor's bytes to the core writer, which compresses them in place. The digest of the whole file
(what `save(...)` bytes would hash to) is computed from the same segments.

The image borrows the tensors (contiguous CPU copies are made only for tensors that are not);
they must not change until the core is written. Immutable.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping

import torch

from helios.core.segments import Segments

# safetensors' Dtype enum order (its serializer sorts by it, largest first), for the dtypes weights use.
_DTYPE_NAMES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32", torch.float64: "F64", torch.int64: "I64",
}
_DTYPE_RANK = {name: rank for rank, name in enumerate(_DTYPE_NAMES.values())}


@dataclass(frozen=True)
class SafetensorsImage:
    """The safetensors file of some tensors: `header` (length prefix, JSON, padding), then the
    tensors' bytes in file order."""

    header: bytes
    tensors: tuple[torch.Tensor, ...]

    @property
    def segments(self) -> Segments:
        return Segments((self.header, *(_bytes_of(t) for t in self.tensors if t.numel())))

    @property
    def nbytes(self) -> int:
        return len(self.header) + sum(t.numel() * t.element_size() for t in self.tensors)

    def sha256(self) -> bytes:
        """SHA-256 of the whole file, hashed segment by segment (hashlib releases the GIL)."""
        digest = hashlib.sha256()
        for piece in self.segments.slices():
            digest.update(piece)
        return digest.digest()

    def to_bytes(self) -> bytes:
        return self.segments.to_bytes()


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def safetensors_image(tensors: Mapping[str, torch.Tensor]) -> SafetensorsImage:
    """The image of `tensors` (see the module docstring); byte-identical to `save(tensors)`."""
    unknown = sorted({str(t.dtype) for t in tensors.values() if t.dtype not in _DTYPE_NAMES})
    if unknown:
        raise ValueError(f"no safetensors dtype for {', '.join(unknown)}")
    order = sorted(tensors, key=lambda name: (-_DTYPE_RANK[_DTYPE_NAMES[tensors[name].dtype]], name.encode()))
    entries, stored, offset = {}, [], 0
    for name in order:
        tensor = tensors[name].detach().cpu().contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        entries[name] = {"dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                         "data_offsets": [offset, offset + nbytes]}
        stored.append(tensor)
        offset += nbytes
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return SafetensorsImage(len(text).to_bytes(8, "little") + text, tuple(stored))


_DIGESTS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="helios-weights-digest")


def digest_in_background(image: SafetensorsImage) -> Future:
    """A future of `image.sha256()`, hashed on a small process-wide pool (one file per thread)."""
    return _DIGESTS.submit(image.sha256)
