"""Counter-based random numbers for the execution ABI: Philox4x32-10, in integer torch ops.

A request's random numbers are a pure function of (seed, counter, offset): never of the batch, the
row position, a device generator or a previous call. That is what makes sampling batch-invariant
and lets a CUDA (Triton) kernel reproduce the CPU reference bit for bit.

Algorithm (the ABI; any implementation must match it exactly)
-------------------------------------------------------------
Philox4x32-10 (Salmon et al., SC'11; Random123), 32-bit words, all arithmetic modulo 2**32:

    key     k0 = seed & 0xFFFFFFFF        k1 = (seed >> 32) & 0xFFFFFFFF     (seed: int64, two's complement)
    counter c0 = counter & 0xFFFFFFFF     c1 = (counter >> 32) & 0xFFFFFFFF
            c2 = offset & 0xFFFFFFFF      c3 = (offset >> 32) & 0xFFFFFFFF
    repeat 10 times:
        hi0:lo0 = 0xD2511F53 * c0         (full 64-bit product, split in 32-bit halves)
        hi1:lo1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 += 0x9E3779B9;  k1 += 0xBB67AE85
    output words x0, x1, x2, x3 = c0, c1, c2, c3

This is exactly Triton's ``tl.philox(seed, c0, c1, c2, c3, n_rounds=10)`` (which splits its 64-bit
seed into k0 = low word, k1 = high word) and Random123's ``philox4x32_R(10, ctr, key)``; the known
answer vectors of Random123 are in the tests.

Derived values:

- ``helios::philox_uniform``: float32 u = (x0 >> 8) * 2**-24, in [0, 1), exact in float32.
- `uniform53` (used by ``helios::sample``): float64 u = ((x0 >> 5) * 2**26 + (x1 >> 6)) * 2**-53,
  in [0, 1), exact in float64.

Offsets name independent streams at one counter. ``helios::sample`` draws at offset
`SAMPLE_OFFSET` (0); programs use other offsets (1, 2, ...) for their own draws at the same counter,
for example speculative acceptance tests.

Ops: ``helios::philox4x32`` (raw words, int64 [R, 4] in [0, 2**32)) and ``helios::philox_uniform``.
Both are registered for every device as pure tensor code (elementwise integer ops on the inputs'
device: no host read and no host tensor, so they can be captured into a CUDA graph); a CUDA kernel
may override them with ``register_kernel("cuda")`` as long as it matches this algorithm.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

MASK32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
SAMPLE_OFFSET = 0

PHILOX4X32_SCHEMA = "(Tensor seeds, Tensor counters, int offset) -> Tensor"
PHILOX_UNIFORM_SCHEMA = "(Tensor seeds, Tensor counters, int offset) -> Tensor"


def _mulhilo(multiplier: int, word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit halves of multiplier * word, with int64 intermediates below 2**49."""
    high_product = (word >> 16) * multiplier
    low_sum = ((high_product & 0xFFFF) << 16) + (word & 0xFFFF) * multiplier
    return (high_product >> 16) + (low_sum >> 32), low_sum & MASK32


def philox4x32_10(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding 32-bit words (broadcasting). Returns x0..x3."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def philox_words(seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    """Raw words for each row: int64 [R, 4], each in [0, 2**32). See the module docstring."""
    key = (seeds & MASK32, (seeds >> 32) & MASK32)
    offset_low = torch.full_like(counters, offset & MASK32)
    offset_high = torch.full_like(counters, (offset >> 32) & MASK32)
    counter = (counters & MASK32, (counters >> 32) & MASK32, offset_low, offset_high)
    return torch.stack(philox4x32_10(counter, key), dim=-1)


def uniform24(words: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1) from word x0 of `words` [R, 4]: (x0 >> 8) * 2**-24."""
    return (words[:, 0] >> 8).to(torch.float32) * (2.0 ** -24)


def uniform53(words: torch.Tensor) -> torch.Tensor:
    """float64 in [0, 1) from words x0, x1 of `words` [R, 4]: 53 random bits."""
    bits = ((words[:, 0] >> 5) << 26) + (words[:, 1] >> 6)
    return bits.to(torch.float64) * (2.0 ** -53)


def check_rng_args(op: str, seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> int:
    """Validate seeds/counters (int64 [R], same device) and offset (an int64); return R."""
    check_tensor(op, "seeds", seeds, torch.int64, (None,))
    num_rows = seeds.shape[0]
    check_tensor(op, "counters", counters, torch.int64, (num_rows,))
    check_same_device(op, {"seeds": seeds, "counters": counters})
    if isinstance(offset, bool) or not isinstance(offset, int) or not -2**63 <= offset < 2**63:
        raise AbiArgumentError(f"{op}: offset must be an int64, got {offset!r}")
    return num_rows


@abi_op("helios::philox4x32", mutates_args=(), schema=PHILOX4X32_SCHEMA)
def philox4x32(seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    """Philox4x32-10 words for each row: int64 [R, 4] with values in [0, 2**32)."""
    check_rng_args("helios::philox4x32", seeds, counters, offset)
    return philox_words(seeds, counters, offset)


@philox4x32.register_fake
def _philox4x32_fake(seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    num_rows = check_rng_args("helios::philox4x32", seeds, counters, offset)
    return seeds.new_empty((num_rows, 4))


@abi_op("helios::philox_uniform", mutates_args=(), schema=PHILOX_UNIFORM_SCHEMA)
def philox_uniform(seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    """One float32 uniform in [0, 1) per row: (x0 >> 8) * 2**-24 of Philox4x32-10."""
    check_rng_args("helios::philox_uniform", seeds, counters, offset)
    return uniform24(philox_words(seeds, counters, offset))


@philox_uniform.register_fake
def _philox_uniform_fake(seeds: torch.Tensor, counters: torch.Tensor, offset: int
                         ) -> torch.Tensor:
    num_rows = check_rng_args("helios::philox_uniform", seeds, counters, offset)
    return seeds.new_empty((num_rows,), dtype=torch.float32)
