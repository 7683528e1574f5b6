"""Element sizes and classes of the manifest's `Dtype` values."""

from __future__ import annotations

from helios.contract import manifest_pb2 as mpb

ELEMENT_BYTES = {
    mpb.DTYPE_FLOAT32: 4,
    mpb.DTYPE_FLOAT16: 2,
    mpb.DTYPE_BFLOAT16: 2,
    mpb.DTYPE_FLOAT8_E4M3: 1,
    mpb.DTYPE_FLOAT8_E5M2: 1,
    mpb.DTYPE_INT64: 8,
    mpb.DTYPE_INT32: 4,
    mpb.DTYPE_INT16: 2,
    mpb.DTYPE_INT8: 1,
    mpb.DTYPE_UINT8: 1,
    mpb.DTYPE_UINT16: 2,
    mpb.DTYPE_UINT32: 4,
    mpb.DTYPE_BOOL: 1,
}

INTEGER_DTYPES = frozenset(
    {
        mpb.DTYPE_INT64,
        mpb.DTYPE_INT32,
        mpb.DTYPE_INT16,
        mpb.DTYPE_INT8,
        mpb.DTYPE_UINT8,
        mpb.DTYPE_UINT16,
        mpb.DTYPE_UINT32,
        mpb.DTYPE_BOOL,
    }
)


def element_bytes(dtype: int) -> int:
    """Bytes of one element; the dtype must be a known, specified value."""
    return ELEMENT_BYTES[dtype]


def is_integer(dtype: int) -> bool:
    return dtype in INTEGER_DTYPES
