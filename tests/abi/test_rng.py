"""Counter-based RNG: Philox4x32-10 known answers, an independent reference, batch invariance."""

from __future__ import annotations

import random

import pytest
import torch

from helios.abi import rng
from helios.abi.program_image import decode_program, encode_program
from helios.abi.registry import AbiArgumentError

M32 = 0xFFFFFFFF

# Random123 tests/kat_vectors, "philox4x32 10" lines: counter[4], key[2] -> output[4].
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32, M32, M32, M32), (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def reference_philox(counter: tuple[int, ...], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 with Python integers, written from Random123's description (key bumped
    before rounds 2..10)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(10):
        if round_index:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


def signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def words_for(seed: int, counter: int, offset: int) -> tuple[int, ...]:
    key = (seed & M32, (seed >> 32) & M32)
    ctr = (counter & M32, (counter >> 32) & M32, offset & M32, (offset >> 32) & M32)
    return reference_philox(ctr, key)


def as_tensor(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def export_roundtrip(module: torch.nn.Module, args: tuple) -> torch.nn.Module:
    program = torch.export.export(module, args, strict=False)
    return decode_program(encode_program(program)).module()  # stored as a program image


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_known_answer_vectors(counter, key, expected):
    assert reference_philox(counter, key) == expected
    words = rng.philox4x32_10(tuple(as_tensor(c) for c in counter), tuple(as_tensor(k) for k in key))
    assert tuple(int(w) for w in words) == expected


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_op_maps_seed_counter_offset_to_key_and_counter_words(counter, key, expected):
    seed = signed64(key[0] | key[1] << 32)
    ctr = signed64(counter[0] | counter[1] << 32)
    offset = signed64(counter[2] | counter[3] << 32)
    words = torch.ops.helios.philox4x32(as_tensor(seed), as_tensor(ctr), offset)
    assert words.dtype == torch.int64 and words.shape == (1, 4)
    assert tuple(words[0].tolist()) == expected


def test_matches_independent_reference_on_random_inputs():
    chooser = random.Random(7)
    edge = [0, 1, -1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -2**63]
    seeds = edge + [chooser.randrange(-2**63, 2**63) for _ in range(56)]
    counters = [chooser.choice(edge + [chooser.randrange(-2**63, 2**63)]) for _ in seeds]
    for offset in (0, 1, 2**32 + 5, -3):
        words = torch.ops.helios.philox4x32(as_tensor(*seeds), as_tensor(*counters), offset)
        expected = [words_for(s, c, offset) for s, c in zip(seeds, counters)]
        assert [tuple(row) for row in words.tolist()] == expected


def test_uniform_is_top_24_bits_of_first_word():
    seeds, counters = as_tensor(*range(-50, 50)), as_tensor(*range(100))
    uniform = torch.ops.helios.philox_uniform(seeds, counters, 3)
    words = torch.ops.helios.philox4x32(seeds, counters, 3)
    assert uniform.dtype == torch.float32 and uniform.shape == (100,)
    expected = [(w >> 8) / 2**24 for w in words[:, 0].tolist()]
    assert uniform.tolist() == expected
    assert float(uniform.min()) >= 0.0 and float(uniform.max()) < 1.0


def test_uniform53_uses_53_bits_of_two_words():
    words = as_tensor(M32, M32, 0, 0).reshape(1, 4)
    assert rng.uniform53(words).tolist() == [1.0 - 2.0**-53]
    words = as_tensor(0, 1 << 6, 0, 0).reshape(1, 4)
    assert rng.uniform53(words).tolist() == [2.0**-53]
    words = as_tensor(1 << 31, 0, 0, 0).reshape(1, 4)
    assert rng.uniform53(words).tolist() == [0.5]


def test_rows_do_not_depend_on_batch_composition_or_position():
    seeds = as_tensor(11, -4, 2**40, 11)
    counters = as_tensor(0, 9, 3, 1)
    batch = torch.ops.helios.philox4x32(seeds, counters, 0)
    for row in range(4):
        alone = torch.ops.helios.philox4x32(seeds[row:row + 1], counters[row:row + 1], 0)
        assert torch.equal(alone[0], batch[row])
    order = torch.tensor([3, 1, 0, 2])
    assert torch.equal(torch.ops.helios.philox4x32(seeds[order], counters[order], 0), batch[order])


def test_seed_counter_and_offset_each_select_a_different_stream():
    base = torch.ops.helios.philox4x32(as_tensor(5), as_tensor(8), 0)
    for seeds, counters, offset in ((6, 8, 0), (5, 9, 0), (5, 8, 1), (5 + 2**32, 8, 0),
                                    (5, 8 + 2**32, 0), (5, 8, 2**32)):
        other = torch.ops.helios.philox4x32(as_tensor(seeds), as_tensor(counters), offset)
        assert not torch.equal(other, base)


def test_uniform_draws_are_uniform():
    draws = torch.ops.helios.philox_uniform(
        torch.full((200_000,), 1234, dtype=torch.int64), torch.arange(200_000), 0)
    counts = torch.histc(draws, bins=20, min=0.0, max=1.0)
    expected = 200_000 / 20
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 60.0  # 19 degrees of freedom: p < 1e-5 beyond 60
    assert abs(float(draws.double().mean()) - 0.5) < 0.003


@pytest.mark.parametrize("op", ["philox4x32", "philox_uniform"])
def test_argument_errors_are_typed_and_named(op):
    call = getattr(torch.ops.helios, op)
    with pytest.raises(AbiArgumentError, match="seeds must be torch.int64"):
        call(torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int64), 0)
    with pytest.raises(AbiArgumentError, match=r"counters must be torch.int64 \[3\]"):
        call(torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), 0)
    with pytest.raises(AbiArgumentError, match="seeds must be torch.int64"):
        call(torch.zeros(3, 1, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 0)
    with pytest.raises(AbiArgumentError, match="one device"):
        call(torch.zeros(3, dtype=torch.int64),
             torch.zeros(3, dtype=torch.int64, device="meta"), 0)


def test_empty_batch():
    empty = torch.zeros(0, dtype=torch.int64)
    assert torch.ops.helios.philox4x32(empty, empty, 0).shape == (0, 4)
    assert torch.ops.helios.philox_uniform(empty, empty, 0).shape == (0,)


class _RngModule(torch.nn.Module):
    def forward(self, seeds: torch.Tensor, counters: torch.Tensor):
        words = torch.ops.helios.philox4x32(seeds, counters, 2)
        return words, torch.ops.helios.philox_uniform(seeds, counters + 1, 7)


def test_ops_survive_export_save_and_load():
    seeds, counters = as_tensor(3, -9, 2**50), as_tensor(0, 5, 2**33)
    loaded = export_roundtrip(_RngModule(), (seeds, counters))
    words, uniform = loaded(seeds, counters)
    expected_words, expected_uniform = _RngModule()(seeds, counters)
    assert torch.equal(words, expected_words) and torch.equal(uniform, expected_uniform)


@pytest.mark.gpu
def test_cuda_matches_cpu_and_triton_philox():
    """The reference on CUDA and Triton's tl.philox give the CPU words bit for bit."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def philox_kernel(seed_ptr, counter_ptr, out_ptr, offset_low, offset_high, n: tl.constexpr):
        index = tl.arange(0, n)
        seed = tl.load(seed_ptr + index)
        counter = tl.load(counter_ptr + index)
        c0 = (counter & 0xFFFFFFFF).to(tl.uint32)
        c1 = ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32)
        c2 = tl.full((n,), offset_low, tl.uint32)
        c3 = tl.full((n,), offset_high, tl.uint32)
        x0, x1, x2, x3 = tl.philox(seed, c0, c1, c2, c3, 10)
        tl.store(out_ptr + index * 4, x0.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + index * 4 + 1, x1.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + index * 4 + 2, x2.to(tl.int64) & 0xFFFFFFFF)
        tl.store(out_ptr + index * 4 + 3, x3.to(tl.int64) & 0xFFFFFFFF)

    chooser = random.Random(3)
    seeds = as_tensor(*[chooser.randrange(-2**63, 2**63) for _ in range(64)])
    counters = as_tensor(*[chooser.randrange(-2**63, 2**63) for _ in range(64)])
    offset = 2**32 + 17
    expected = torch.ops.helios.philox4x32(seeds, counters, offset)
    on_cuda = torch.ops.helios.philox4x32(seeds.cuda(), counters.cuda(), offset)
    assert torch.equal(on_cuda.cpu(), expected)
    out = torch.empty(64, 4, dtype=torch.int64, device="cuda")
    philox_kernel[(1,)](seeds.cuda(), counters.cuda(), out, offset & M32, offset >> 32, n=64)
    assert torch.equal(out.cpu(), expected)
