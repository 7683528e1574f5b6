"""The 256-row MLP gate/up projection with the SiLU-mul in its epilogue, on Hopper's tensor memory
accelerator (TMA), against cuBLAS's product followed by ``helios::silu_mul``: can a Triton kernel
carry the SiLU-mul at cuBLAS's speed where a decode step of 256 rows runs power-capped?

At 256 rows the served greedy step spends 3.0 ms of 7.5 on cuBLAS's gate/up products (nvjet
256x128 tiles), 0.19 ms on the 32 SiLU-muls that read their [256, 28672] outputs back, and 0.14 ms
on the down projection's split-K reduction (bench/results/h200_session37_call1). A gate/up kernel
that writes silu(gate) * up directly removes the SiLU-mul's launch and its traffic, which pays only
where the kernel's product keeps cuBLAS's pace. The pointer-loading skinny kernel does not
(bench/results/h200_session28_call1: 0.139 ms against 0.092 at 256 rows).

This bench times, each in a CUDA graph of `--copies` calls on distinct weights (no L2 reuse), rested
(a median replay) and sustained (back-to-back replays for `--sustain-ms`, the clock a long run holds):
cuBLAS + ``silu_mul``; cuBLAS alone; the TMA kernel fused, over a sweep of tiles, persistent or not;
the TMA kernel's plain product (its raw speed against cuBLAS); and the skinny kernel fused. Every
fused result is checked against ``silu_mul(F.linear(x, W))`` within bfloat16 rounding.

    python bench/wide_silu_ab.py [--rows 256] [--copies 6] [--sustain-ms 400]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lever_ab import graph_ms  # noqa: E402

from helios.abi import fused  # noqa: E402,F401  (registers helios::silu_mul)
from helios.abi.gemv_tiles import SkinnyTile  # noqa: E402
from helios.abi.triton_skinny import skinny_silu  # noqa: E402

WIDTH, DEPTH = 14336, 4096  # the 8B decoder's MLP: gate/up weight [2 * WIDTH, DEPTH]


@triton.jit
def _tiles(pid, m_blocks):
    """(row block, feature block) of tile `pid`, row blocks fastest: the programs that share a
    feature block's weights run side by side and read them from HBM once."""
    return pid % m_blocks, pid // m_blocks


@triton.jit
def _silu_epilogue(gate, up, out_ptr, ms, fs, rows, stride_om):
    kind = out_ptr.dtype.element_ty
    gate = gate.to(kind).to(tl.float32)  # the projection's output, as `silu_mul` reads it
    up = up.to(kind).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(kind)
    tl.store(out_ptr + ms[:, None].to(tl.int64) * stride_om + fs[None, :],
             (activated.to(tl.float32) * up).to(kind), mask=(ms < rows)[:, None])


@triton.jit
def _wide_silu_kernel(x_desc, g_desc, u_desc, out_ptr, rows, width, depth, stride_om, BLOCK_M: tl.constexpr,
                      BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tiles of [BLOCK_M rows, BLOCK_F features], each program from its id on in steps of the grid (one
    tile a program where the grid covers them all; persistent where it is one program an SM)."""
    m_blocks = tl.cdiv(rows, BLOCK_M)
    for tile in tl.range(tl.program_id(0), m_blocks * (width // BLOCK_F), tl.num_programs(0), flatten=True):
        pid_m, pid_f = _tiles(tile, m_blocks)
        m0, f0 = pid_m * BLOCK_M, pid_f * BLOCK_F
        gate = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_F), tl.float32)
        for k in range(0, depth, BLOCK_K):
            a = x_desc.load([m0, k])
            gate = tl.dot(a, g_desc.load([f0, k]).T, gate)
            up = tl.dot(a, u_desc.load([f0, k]).T, up)
        _silu_epilogue(gate, up, out_ptr, m0 + tl.arange(0, BLOCK_M), f0 + tl.arange(0, BLOCK_F), rows, stride_om)


@triton.jit
def _paired_silu_kernel(x_desc, w_desc, out_ptr, rows, width, depth, stride_om, BLOCK_M: tl.constexpr,
                        BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr):
    """As `_wide_silu_kernel`, but each step loads the gate's and the up's BLOCK_F rows as one
    [2, BLOCK_F, BLOCK_K] box of the weight viewed [2, F, K], so one [BLOCK_M, 2 * BLOCK_F] dot
    computes both (the product's tile at cuBLAS's width) and the epilogue splits it."""
    m_blocks = tl.cdiv(rows, BLOCK_M)
    for tile in tl.range(tl.program_id(0), m_blocks * (width // BLOCK_F), tl.num_programs(0), flatten=True):
        pid_m, pid_f = _tiles(tile, m_blocks)
        m0, f0 = pid_m * BLOCK_M, pid_f * BLOCK_F
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_F), tl.float32)
        for k in range(0, depth, BLOCK_K):
            w = w_desc.load([0, f0, k]).reshape(2 * BLOCK_F, BLOCK_K)
            acc = tl.dot(x_desc.load([m0, k]), w.T, acc)
        gate, up = tl.split(acc.reshape(BLOCK_M, 2, BLOCK_F).permute(0, 2, 1))
        _silu_epilogue(gate, up, out_ptr, m0 + tl.arange(0, BLOCK_M), f0 + tl.arange(0, BLOCK_F), rows, stride_om)


@triton.jit
def _interleaved_silu_kernel(x_desc, w_desc, out_ptr, rows, width, depth, stride_om, BLOCK_M: tl.constexpr,
                             BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr):
    """As `_paired_silu_kernel` on a weight laid out in blocks of BLOCK_F gate rows then the same
    features' BLOCK_F up rows (`interleave`): one plain [2 * BLOCK_F, BLOCK_K] box a step."""
    m_blocks = tl.cdiv(rows, BLOCK_M)
    for tile in tl.range(tl.program_id(0), m_blocks * (width // BLOCK_F), tl.num_programs(0), flatten=True):
        pid_m, pid_f = _tiles(tile, m_blocks)
        m0, f0 = pid_m * BLOCK_M, pid_f * BLOCK_F
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_F), tl.float32)
        for k in range(0, depth, BLOCK_K):
            acc = tl.dot(x_desc.load([m0, k]), w_desc.load([2 * f0, k]).T, acc)
        gate, up = tl.split(acc.reshape(BLOCK_M, 2, BLOCK_F).permute(0, 2, 1))
        _silu_epilogue(gate, up, out_ptr, m0 + tl.arange(0, BLOCK_M), f0 + tl.arange(0, BLOCK_F), rows, stride_om)


@triton.jit
def _wide_kernel(x_desc, w_desc, out_ptr, rows, num_out, depth, stride_om, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The plain product x @ W^T with the same loads: the kernel's raw speed against cuBLAS."""
    pid_m, pid_n = _tiles(tl.program_id(0), tl.cdiv(rows, BLOCK_M))
    m0, n0 = pid_m * BLOCK_M, pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, depth, BLOCK_K):
        acc = tl.dot(x_desc.load([m0, k]), w_desc.load([n0, k]).T, acc)
    ms, ns = m0 + tl.arange(0, BLOCK_M), n0 + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + ms[:, None].to(tl.int64) * stride_om + ns[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(ms < rows)[:, None])


def _descriptors(x, weight, block_m, block_w, block_k):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return (TensorDescriptor.from_tensor(x, [block_m, block_k]),
            TensorDescriptor.from_tensor(weight, [block_w, block_k]))


def wide_silu(x, weight, block_m, block_f, block_k, warps, stages, persistent, sms):
    rows, width = x.shape[0], weight.shape[0] // 2
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    x_desc, g_desc = _descriptors(x, weight[:width], block_m, block_f, block_k)
    u_desc = _descriptors(x, weight[width:], block_m, block_f, block_k)[1]
    tiles = triton.cdiv(rows, block_m) * (width // block_f)
    grid = (min(tiles, sms) if persistent else tiles,)
    _wide_silu_kernel[grid](x_desc, g_desc, u_desc, out, rows, width, x.shape[1], out.stride(0), BLOCK_M=block_m,
                            BLOCK_F=block_f, BLOCK_K=block_k, num_warps=warps,
                            num_stages=stages)
    return out


def paired_silu(x, weight, block_m, block_f, block_k, warps, stages, persistent, sms):
    from triton.tools.tensor_descriptor import TensorDescriptor
    rows, width, depth = x.shape[0], weight.shape[0] // 2, x.shape[1]
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor(weight, [2, width, depth], [width * depth, depth, 1], [2, block_f, block_k])
    tiles = triton.cdiv(rows, block_m) * (width // block_f)
    grid = (min(tiles, sms) if persistent else tiles,)
    _paired_silu_kernel[grid](x_desc, w_desc, out, rows, width, depth, out.stride(0), BLOCK_M=block_m,
                              BLOCK_F=block_f, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out


def interleave(weight: torch.Tensor, block_f: int) -> torch.Tensor:
    """[gate; up] rows regrouped as block_f gate rows, the same features' block_f up rows, and so on."""
    width, depth = weight.shape[0] // 2, weight.shape[1]
    return weight.view(2, width // block_f, block_f, depth).transpose(0, 1).reshape(2 * width, depth).contiguous()


def interleaved_silu(x, weight, block_m, block_f, block_k, warps, stages, persistent, sms):
    """`weight` already interleaved for block_f."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    rows, width, depth = x.shape[0], weight.shape[0] // 2, x.shape[1]
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(weight, [2 * block_f, block_k])
    tiles = triton.cdiv(rows, block_m) * (width // block_f)
    grid = (min(tiles, sms) if persistent else tiles,)
    _interleaved_silu_kernel[grid](x_desc, w_desc, out, rows, width, depth, out.stride(0), BLOCK_M=block_m,
                                   BLOCK_F=block_f, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out


def wide(x, weight, block_m, block_n, block_k, warps, stages):
    rows, num_out = x.shape[0], weight.shape[0]
    out = torch.empty((rows, num_out), dtype=x.dtype, device=x.device)
    x_desc, w_desc = _descriptors(x, weight, block_m, block_n, block_k)
    grid = (triton.cdiv(rows, block_m) * (num_out // block_n),)
    _wide_kernel[grid](x_desc, w_desc, out, rows, num_out, x.shape[1], out.stride(0), BLOCK_M=block_m,
                       BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out


FUSED_TILES = [(256, 64, 64, 8, 4), (128, 128, 64, 8, 3)]  # block_m, block_f, block_k, warps, stages
PAIRED_TILES = [(256, 64, 64, 8, 3), (256, 64, 64, 8, 4), (256, 32, 64, 8, 4), (128, 64, 64, 8, 4),
                (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (256, 64, 32, 8, 6), (128, 64, 128, 8, 3)]
INTERLEAVED_TILES = [(256, 64, 64, 8, 3), (256, 64, 64, 8, 4), (128, 64, 64, 8, 4), (128, 128, 64, 8, 3)]
PLAIN_TILES = [(256, 128, 64, 8, 3), (256, 128, 64, 8, 4)]


def alternate(finalists: dict, calls: dict, time_both, baseline, rounds: int,
              base_label: str = "cuBLAS + silu_mul") -> None:
    """Sustained times of the baseline and each finalist, alternated `rounds` times (the device's
    clock drifts between measurements taken one after another), and each finalist's median ratio."""
    held = {base_label: []} | {label: [] for label in finalists}
    for round_ in range(rounds):
        for label in held:
            held[label].append(time_both(f"round {round_} {label}", baseline if label == base_label
                                         else calls[label])[1])
    base = held.pop(base_label)
    for label, times in held.items():
        ratios = sorted(b / t for b, t in zip(base, times))  # each round's ratio
        print(f"alternated {label}: {ratios[len(ratios) // 2]:.3f}x {base_label} sustained "
              f"(rounds {', '.join(f'{r:.3f}' for r in ratios)})", flush=True)


def parse_arguments(description: str):
    """The arguments both TMA benches take; a parser error without CUDA."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--copies", type=int, default=6, help="distinct weights per graph (no L2 reuse)")
    parser.add_argument("--sustain-ms", type=float, default=400.0, help="back-to-back replays for the sustained time")
    parser.add_argument("--finalists", type=int, default=3, help="kernels timed again, alternated with the baseline")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of the finalists")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (Hopper or later: TMA)")
    if min(args.rows, args.copies, args.rounds) < 1 or args.sustain_ms <= 0:
        parser.error("--rows, --copies and --rounds at least 1, --sustain-ms above 0")
    return args


def timer(weights: list, flops: float, sustain_ms: float):
    """`time_both(label, call)`: (rested, sustained) ms of `call(w)` over `weights` in one CUDA graph,
    a call each, printed with the rested TFLOP/s of `flops` a call."""
    def time_both(label, call):
        rested = graph_ms(lambda: [call(w) for w in weights]) / len(weights)
        held = graph_ms(lambda: [call(w) for w in weights], sustain_ms=sustain_ms) / len(weights)
        print(f"{label:<44} rested {rested * 1e3:7.1f} us ({flops / rested / 1e9:5.0f} TFLOP/s)  sustained "
              f"{held * 1e3:7.1f} us", flush=True)
        return rested, held
    return time_both


def main() -> int:
    args = parse_arguments(__doc__.splitlines()[0])
    torch.manual_seed(0)
    weights = [torch.randn(2 * WIDTH, DEPTH, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(args.copies)]
    x = torch.randn(args.rows, DEPTH, device="cuda", dtype=torch.bfloat16)
    expected = torch.ops.helios.silu_mul(F.linear(x, weights[0]))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    time_both = timer(weights, 2.0 * args.rows * 2 * WIDTH * DEPTH, args.sustain_ms)

    base = time_both("cuBLAS + silu_mul", lambda w: torch.ops.helios.silu_mul(F.linear(x, w)))
    time_both("cuBLAS alone", lambda w: F.linear(x, w))
    results, calls = {}, {}
    mixed = {}  # id(weight) -> {block_f: the weight interleaved for it}

    def on_interleaved(x, w, block_m, block_f, *rest):
        copy = mixed.setdefault(id(w), {}).get(block_f)
        if copy is None:
            copy = mixed[id(w)][block_f] = interleave(w, block_f)
        return interleaved_silu(x, copy, block_m, block_f, *rest)

    sweeps = [("TMA fused", wide_silu, FUSED_TILES), ("TMA paired", paired_silu, PAIRED_TILES),
              ("TMA interleaved", on_interleaved, INTERLEAVED_TILES)]
    for name, kernel, tiles in sweeps:
        for block_m, block_f, block_k, warps, stages in tiles:
            for persistent in (False, True):
                label = f"{name} {block_m}x{block_f}x{block_k} w{warps}s{stages}{' persistent' if persistent else ''}"
                call = lambda w, k=kernel, t=(block_m, block_f, block_k, warps, stages, persistent): k(x, w, *t, sms)  # noqa: E731
                try:
                    got = call(weights[0])
                    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
                    exact = torch.equal(got, expected)
                    results[label] = time_both(label + ("" if exact else " (not bitwise)"), call)
                    calls[label] = call
                except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported)
                    print(f"{label}: {type(error).__name__}: {str(error)[:200]}", flush=True)
    for block_m, block_n, block_k, warps, stages in PLAIN_TILES:
        label = f"TMA plain {block_m}x{block_n}x{block_k} w{warps}s{stages}"
        call = lambda w, t=(block_m, block_n, block_k, warps, stages): wide(x, w, *t)  # noqa: E731
        try:
            torch.testing.assert_close(call(weights[0]).float(), F.linear(x, weights[0]).float(), rtol=2e-2, atol=2e-2)
            time_both(label, call)
        except Exception as error:  # noqa: BLE001
            print(f"{label}: {type(error).__name__}: {str(error)[:200]}", flush=True)
    tile = SkinnyTile(128, 128, 128, 1, 8, 3)
    try:
        time_both(f"skinny fused {tile.label}", lambda w: skinny_silu(x, w, tile, pdl=False))
    except Exception as error:  # noqa: BLE001
        print(f"skinny fused: {type(error).__name__}: {str(error)[:200]}", flush=True)
    if results:
        label, (rested, held) = min(results.items(), key=lambda item: item[1][1])
        print(f"best fused (sustained): {label}: {base[1] / held:.3f}x cuBLAS + silu_mul sustained, "
              f"{base[0] / rested:.3f}x rested", flush=True)
        alternate(dict(sorted(results.items(), key=lambda item: item[1][1])[:args.finalists]), calls, time_both,
                  lambda w: torch.ops.helios.silu_mul(F.linear(x, w)), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
