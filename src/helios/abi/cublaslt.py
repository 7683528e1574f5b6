"""cuBLASLt's matrix products with a chosen algorithm (CUDA), through ctypes.

``F.linear`` runs cuBLAS's first heuristic pick for each shape. cuBLASLt can list more candidates
for one problem (`LtProduct.candidates`: its heuristic's top N, each with its own tile, split and
kernel) and run any of them (`LtProduct.run`), so a shape's candidates can be timed on the device
and the fastest kept (`helios.runtime.loading.gemm_algos`). The product is ``F.linear``'s: y = x W^T
for x [M, K] and W [N, K] (row-major, 16-bit), float32 accumulation and scale, one rounding to the
output dtype - in cuBLAS's column-major terms D [N, M] = op_T(W) [N, K] @ x^T [K, M], the layout
torch itself passes. Candidates may split the reduction differently from ``F.linear``'s kernel, so
their results can differ from it in the last bits; each candidate gives the same bits on every call
(the timing run checks it).

`lt_linear` is what a captured program's projection calls where `helios.runtime.loading.gemm_algos`
bound it: ``F.linear``, by the algorithm `choose` registered for its device and shapes where there is
one and the operands are laid out as the product expects, else ``F.linear`` itself.

The library is the one torch already loaded (``libcublasLt.so.<major>``); `available()` says
whether it could be opened. Handles, descriptors and layouts live as long as their `LtProduct`;
calls run on the current stream and can be captured into a CUDA graph (host scalars, a workspace
owned by the product).
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["ENABLED", "LtAlgo", "LtProduct", "available", "chosen", "choose", "lt_linear"]

ENABLED = True  # False: `lt_linear` is F.linear (graphs captured before keep what they recorded)

_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE, _PREF_REDUCTION_MASK = 1, 3
_REDUCTIONS = 0x6  # a separate reduction in the compute or output type; not INPLACE (accumulates in the output)
_CONFIG_ID, _CONFIG_TILE, _CONFIG_SPLITK, _CONFIG_REDUCTION, _CONFIG_STAGES = 0, 1, 2, 3, 6
_DATA_TYPES = {torch.bfloat16: _CUDA_R_16BF, torch.float16: _CUDA_R_16F}
WORKSPACE_BYTES = 32 << 20  # cuBLAS's own default on Hopper; one per device, shared by every product
SEARCH_WORKSPACES = (WORKSPACE_BYTES, 1 << 20, 0)  # the heuristic's picks differ with the workspace it may use


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_LIBRARY: list = []


def _library():
    """The loaded cuBLASLt (torch's), or None where it cannot be opened."""
    if _LIBRARY:
        return _LIBRARY[0]
    library = None
    if torch.cuda.is_available():
        torch.cuda.init()
        names = [f"libcublasLt.so.{major}" for major in (13, 12, 11)]
        for root in _package_dirs():
            names += sorted(glob.glob(os.path.join(root, "libcublasLt.so*")))
        for name in names:
            try:
                library = ctypes.CDLL(name)
                break
            except OSError:
                continue
    if library is not None:
        _declare(library)
    _LIBRARY.append(library)
    return library


def _package_dirs() -> list[str]:
    dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
    try:
        import nvidia.cublas  # the wheel torch's CUDA build depends on

        dirs += [os.path.join(path, "lib") for path in nvidia.cublas.__path__]
    except ImportError:
        pass
    return dirs


def _declare(lib) -> None:
    p, i, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    signatures = {
        "cublasLtCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(p), i, i],
        "cublasLtMatmulDescSetAttribute": [p, i, p, sz],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(p), i, u64, u64, i64],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulPreferenceSetAttribute": [p, i, p, sz],
        "cublasLtMatmulPreferenceDestroy": [p],
        "cublasLtMatmulDescDestroy": [p],
        "cublasLtMatrixLayoutDestroy": [p],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i, ctypes.POINTER(_Heuristic), ctypes.POINTER(i)],
        "cublasLtMatmulAlgoConfigGetAttribute": [ctypes.POINTER(_Algo), i, p, sz, ctypes.POINTER(sz)],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, ctypes.POINTER(_Algo), p, sz, p],
    }
    for name, arguments in signatures.items():
        function = getattr(lib, name)
        function.argtypes = arguments
        function.restype = ctypes.c_int


def available() -> bool:
    """Whether cuBLASLt could be opened (a CUDA device and torch's library)."""
    return _library() is not None


class CublasLtError(RuntimeError):
    """A cuBLASLt call returned a status other than success."""


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what}: cuBLAS status {status}")


@dataclass(frozen=True)
class LtAlgo:
    """One candidate: its index in the heuristic's list, the opaque algorithm, its workspace bytes and
    what cuBLASLt reports of it (config id, tile id, split count, reduction scheme, stages id)."""

    index: int
    algo: bytes
    workspace: int
    config: tuple[int, int, int, int, int]

    @property
    def label(self) -> str:
        config_id, tile, split, reduction, stages = self.config
        return f"#{self.index} id{config_id} tile{tile} split{split} red{reduction} st{stages}"


_HANDLES: dict[int, int] = {}
_WORKSPACES: dict[int, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    """The device's workspace: every product runs on the model worker's one stream, one at a time."""
    if device.index not in _WORKSPACES:
        _WORKSPACES[device.index] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[device.index]


class LtProduct:
    """``F.linear`` of `rows` x `in_features` by an [out_features, in_features] weight of `dtype` on
    the current CUDA device, with cuBLASLt's descriptors for that problem."""

    def __init__(self, rows: int, out_features: int, in_features: int, dtype: torch.dtype):
        lib = _library()
        if lib is None:
            raise CublasLtError("cuBLASLt is not available (no CUDA device or library)")
        if dtype not in _DATA_TYPES:
            raise ValueError(f"LtProduct: dtype {dtype} (want bfloat16 or float16)")
        self.lib, self.shape, self.dtype = lib, (rows, out_features, in_features), dtype
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.handle = self._handle()
        self.desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), _COMPUTE_32F, _CUDA_R_32F), "MatmulDescCreate")
        for attribute, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            value = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(self.desc, attribute, ctypes.byref(value), 4), "DescSetAttribute")
        kind = _DATA_TYPES[dtype]
        self.a = self._layout(kind, in_features, out_features, in_features)  # W as [K, N] column-major
        self.b = self._layout(kind, in_features, rows, in_features)  # x as [K, M]
        self.d = self._layout(kind, out_features, rows, out_features)  # y as [N, M]
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.workspace = _workspace(self.device)

    def _handle(self) -> int:
        index = torch.cuda.current_device()
        if index not in _HANDLES:
            handle = ctypes.c_void_p()
            _check(self.lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
            _HANDLES[index] = handle.value
        return _HANDLES[index]

    def _layout(self, kind: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), kind, rows, cols, ld), "MatrixLayoutCreate")
        return layout

    def candidates(self, count: int = 8) -> list[LtAlgo]:
        """The heuristic's first `count` algorithms for this problem under each workspace limit of
        `SEARCH_WORKSPACES` (the limit changes its picks), without repeats, in that order; none
        that reduces in place in the output."""
        found, seen = [], set()
        for limit in SEARCH_WORKSPACES:
            for result in self._heuristic(count, limit):
                algo = bytes(result.algo)
                if algo not in seen:
                    seen.add(algo)
                    found.append(LtAlgo(len(found), algo, int(result.workspace_size), self._config(result.algo)))
        return found

    def _heuristic(self, count: int, workspace: int) -> list[_Heuristic]:
        lib = self.lib
        preference = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "PreferenceCreate")
        try:
            limit, mask = ctypes.c_uint64(workspace), ctypes.c_uint32(_REDUCTIONS)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(preference, _PREF_MAX_WORKSPACE, ctypes.byref(limit), 8),
                   "PreferenceSetAttribute")
            _check(lib.cublasLtMatmulPreferenceSetAttribute(preference, _PREF_REDUCTION_MASK, ctypes.byref(mask), 4),
                   "PreferenceSetAttribute")
            results = (_Heuristic * count)()
            returned = ctypes.c_int(0)
            status = lib.cublasLtMatmulAlgoGetHeuristic(ctypes.c_void_p(self.handle), self.desc, self.a, self.b,
                                                        self.d, self.d, preference, count, results,
                                                        ctypes.byref(returned))
        finally:
            lib.cublasLtMatmulPreferenceDestroy(preference)
        if status != 0:  # e.g. nothing fits this workspace: no candidates from this limit
            return []
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def _config(self, algo: _Algo) -> tuple[int, int, int, int, int]:
        values = []
        for attribute, kind in ((_CONFIG_ID, ctypes.c_int32), (_CONFIG_TILE, ctypes.c_uint32),
                                (_CONFIG_SPLITK, ctypes.c_uint32), (_CONFIG_REDUCTION, ctypes.c_uint32),
                                (_CONFIG_STAGES, ctypes.c_uint32)):
            value, written = kind(0), ctypes.c_size_t(0)
            status = self.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attribute, ctypes.byref(value),
                                                                   ctypes.sizeof(value), ctypes.byref(written))
            values.append(int(value.value) if status == 0 else -1)
        return tuple(values)

    def run(self, x: torch.Tensor, weight: torch.Tensor, algo: LtAlgo, out: torch.Tensor | None = None) -> torch.Tensor:
        """y = x @ weight.T by `algo` on the current stream (x [M, K] and weight [N, K] contiguous)."""
        rows, out_features, in_features = self.shape
        if x.shape != (rows, in_features) or weight.shape != (out_features, in_features):
            raise ValueError(f"LtProduct{self.shape}: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
        if out is None:
            out = torch.empty((rows, out_features), dtype=self.dtype, device=x.device)
        stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
        chosen = _Algo.from_buffer_copy(algo.algo)
        status = self.lib.cublasLtMatmul(
            ctypes.c_void_p(self.handle), self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(weight.data_ptr()),
            self.a, ctypes.c_void_p(x.data_ptr()), self.b, ctypes.byref(self.beta), ctypes.c_void_p(out.data_ptr()),
            self.d, ctypes.c_void_p(out.data_ptr()), self.d, ctypes.byref(chosen),
            ctypes.c_void_p(self.workspace.data_ptr()), WORKSPACE_BYTES, stream)
        _check(status, "cublasLtMatmul")
        return out


    def __del__(self):
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        for layout in (getattr(self, name, None) for name in ("a", "b", "d")):
            if layout is not None and layout.value:
                lib.cublasLtMatrixLayoutDestroy(layout)
        desc = getattr(self, "desc", None)
        if desc is not None and desc.value:
            lib.cublasLtMatmulDescDestroy(desc)


_ALIGNMENT = 256  # bytes: the heuristic assumes operands this aligned unless told otherwise
_CHOSEN: dict[tuple, tuple[LtProduct, LtAlgo]] = {}


def _key(device_index: int, rows: int, out_features: int, in_features: int, dtype: torch.dtype) -> tuple:
    return (device_index, rows, out_features, in_features, dtype)


def choose(product: LtProduct, algo: LtAlgo | None) -> None:
    """Registers `algo` (None: forget any) for `product`'s device and shapes: `lt_linear` runs it."""
    key = _key(product.device.index, *product.shape, product.dtype)
    if algo is None:
        _CHOSEN.pop(key, None)
    else:
        _CHOSEN[key] = (product, algo)


def chosen(device_index: int, rows: int, out_features: int, in_features: int, dtype: torch.dtype) -> LtAlgo | None:
    """The algorithm registered for these shapes on that device, or None."""
    entry = _CHOSEN.get(_key(device_index, rows, out_features, in_features, dtype))
    return entry[1] if entry else None


def lt_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: by the registered algorithm where `ENABLED`, there is one for
    x's device and these shapes, there is no bias and x (as rows), the weight and the output are
    contiguous and aligned; otherwise ``F.linear`` itself. The choice depends only on shapes,
    layout and addresses, so a captured graph records one path."""
    if not ENABLED or bias is not None or not x.is_cuda or x.dim() == 0 or weight.dim() != 2:
        return F.linear(x, weight, bias)
    out_features, in_features = weight.shape
    rows = x.numel() // max(in_features, 1)
    entry = _CHOSEN.get(_key(x.device.index, rows, out_features, in_features, x.dtype))
    if entry is None or x.dtype != weight.dtype or x.shape[-1] != in_features:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, in_features)
    if not (flat.is_contiguous() and weight.is_contiguous() and flat.data_ptr() % _ALIGNMENT == 0
            and weight.data_ptr() % _ALIGNMENT == 0):
        return F.linear(x, weight, bias)
    product, algo = entry
    out = product.run(flat, weight, algo)  # a fresh allocation: the caching allocator aligns it
    return out.reshape(*x.shape[:-1], out_features)
