"""A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: fail on host reads and host tensors.

Inside `forbid_host_sync()` a `HostSyncError` is raised by any Python-level torch call that, on a
CUDA tensor, would synchronise the device or could not be captured into a CUDA graph:

- reading tensor data on the host: ``bool``/``int``/``float``/``operator.index`` of a tensor,
  ``item``, ``tolist``, ``numpy``, ``cpu``, ``torch.equal``, ``allclose``, ``to(device)``;
- data-dependent shapes: ``nonzero``, ``argwhere``, ``masked_select``, ``unique``, ``bincount``,
  one-argument ``torch.where``, ``repeat_interleave`` by a tensor, and indexing, assigning or
  ``index_put`` with a boolean tensor;
- indexing or assigning with a 0-d integer tensor (Python indexing reads it as an ``int``);
- host tensors that a device body would copy in: ``torch.tensor``, ``as_tensor``, ``from_numpy``,
  ``new_tensor``, and factories (``zeros``, ``full``, ``arange``, ...) without an explicit device.

The mode sees only calls made from Python while it is active; it is off inside the function it
dispatches to, so a ``torch.ops.helios.*`` call is one opaque call. Call op bodies (the
``*_reference`` functions of `helios.abi`) to check what they do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_HOST_READS = frozenset({
    "__bool__", "__int__", "__float__", "__index__", "__complex__", "__contains__", "__format__",
    "__repr__", "item", "tolist", "numpy", "cpu", "equal", "allclose",
})
_DATA_SHAPES = frozenset({
    "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount",
})
_HOST_DATA = frozenset({"tensor", "as_tensor", "asarray", "from_numpy", "new_tensor"})
_FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "arange", "range", "linspace", "logspace", "eye", "rand",
    "randn", "randint", "randperm", "empty_strided", "scalar_tensor",
})
_INDEXING = frozenset({"__getitem__", "__setitem__", "index_put", "index_put_"})


class HostSyncError(AssertionError):
    """An op body read device data on the host or created a host tensor."""


def _has_bool_index(indices) -> bool:
    if isinstance(indices, torch.Tensor):
        return indices.dtype in (torch.bool, torch.uint8)
    if isinstance(indices, (tuple, list)):
        return any(_has_bool_index(index) for index in indices)
    return False


def _has_scalar_index(indices) -> bool:
    """A 0-d integer tensor among the indices: Python indexing reads it on the host (an ``int``)."""
    if isinstance(indices, torch.Tensor):
        return indices.dim() == 0 and not indices.dtype.is_floating_point and indices.dtype != torch.bool
    if isinstance(indices, (tuple, list)):
        return any(_has_scalar_index(index) for index in indices)
    return False


def _violation(name: str, args: tuple, kwargs: dict) -> str | None:
    """Why calling `name(*args, **kwargs)` is not allowed in a device body, or None."""
    if name in _HOST_READS or name in _DATA_SHAPES or name in _HOST_DATA:
        return f"{name} reads data on the host, has a data-dependent shape or makes a host tensor"
    if name in _FACTORIES and kwargs.get("device") is None:
        return f"torch.{name} without device= creates a host tensor"
    if name == "where" and len(args) + len(kwargs) == 1:
        return "one-argument where is nonzero (data-dependent shape)"
    if name == "repeat_interleave" and "output_size" not in kwargs and any(
            isinstance(a, torch.Tensor) for a in args[1:]):
        return "repeat_interleave by a tensor without output_size has a data-dependent shape"
    if name == "to" and ("device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args[1:])):
        return "to(device) moves data between devices"
    if name in _INDEXING and len(args) > 1 and _has_bool_index(args[1]):
        return f"{name} with a boolean index has a data-dependent shape"
    if name in ("__getitem__", "__setitem__") and len(args) > 1 and _has_scalar_index(args[1]):
        return f"{name} with a 0-d tensor index reads the index on the host"
    return None


class _Guard(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = _violation(getattr(func, "__name__", ""), args, kwargs)
        if reason is not None:
            raise HostSyncError(reason)
        return func(*args, **kwargs)


@contextlib.contextmanager
def forbid_host_sync() -> Iterator[None]:
    """Within the block, host reads and host tensor creation raise `HostSyncError`."""
    with _Guard():
        yield
