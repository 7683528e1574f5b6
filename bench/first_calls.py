"""What a fresh process's first CUDA calls cost: the context, cuBLAS's first matmuls, cuDNN's fused
attention's first call per shape, each timed to the end of its device work, optionally beside busy
processes (as a load's compile workers are) and with the first attention call made on another thread.

The load's dry run and capture make these calls first on its loading thread; this tells which of
their costs are per process (library and module loading: another thread could take them early), per
thread (torch keeps cuDNN's attention graphs per thread) or per shape.

    python bench/first_calls.py [--busy 8] [--other-thread]
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time

import torch


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


def timed(label: str, work, rows: list) -> None:
    started = time.perf_counter()
    work()
    torch.cuda.synchronize()
    rows.append((label, 1e3 * (time.perf_counter() - started)))


def attention(tokens: int, heads: int = 32, kv_heads: int = 8, dim: int = 128):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.zeros(1, heads, tokens, dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.zeros(1, kv_heads, tokens, dim, dtype=torch.bfloat16, device="cuda")

    def run():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    return run


def matmul(rows: int, inner: int, cols: int):
    a = torch.zeros(rows, inner, dtype=torch.bfloat16, device="cuda")
    b = torch.zeros(cols, inner, dtype=torch.bfloat16, device="cuda")
    return lambda: torch.nn.functional.linear(a, b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=0, help="busy processes spinning beside the calls")
    parser.add_argument("--other-thread", action="store_true",
                        help="make the first attention and matmul calls on another thread first")
    args = parser.parse_args()
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    rows: list = []
    timed("CUDA context", lambda: torch.zeros(1, device="cuda"), rows)
    if args.other_thread:
        def early():
            side: list = []
            timed("matmul 2048x4096x4096", matmul(2048, 4096, 4096), side)
            timed("attention 2048", attention(2048), side)
            rows.extend((f"[other thread] {label}", ms) for label, ms in side)
        thread = threading.Thread(target=early)
        thread.start()
        thread.join()
    for label, work in (("matmul 2048x4096x4096", matmul(2048, 4096, 4096)),
                        ("matmul 2048x4096x4096 again", matmul(2048, 4096, 4096)),
                        ("matmul 256x4096x14336", matmul(256, 4096, 14336)),
                        ("matmul 1x4096x128256", matmul(1, 4096, 128256)),
                        ("attention 2048", attention(2048)),
                        ("attention 2048 again", attention(2048)),
                        ("attention 512", attention(512)),
                        ("attention 128", attention(128)),
                        ("attention 256", attention(256))):
        timed(label, work, rows)
    stop.set()
    print(f"first calls ({args.busy} busy processes{', other thread first' if args.other_thread else ''}):")
    for label, ms in rows:
        print(f"  {label:<40} {ms:9.1f} ms")


if __name__ == "__main__":
    main()
