"""A cold chunk's attention layer as served before and with ``helios::rotary_fresh_attention``, in one process.

Per layer at Llama-3.1-8B attention shapes (32 query heads, 8 key/value heads, head size 128,
bfloat16), one chunk of T tokens from position 0 (T = 2,048, 1,024, 512 by default), its pages
consecutive (a run, as the page allocator hands a cold prompt) and shuffled:

- ``paged``: ``helios::rotary_cache_write`` then ``helios::paged_attention`` (the rotary kernel and
  `helios.abi.triton_prefill` reading the keys back through the page table), as a program runs them;
- ``fresh <backend>``: ``helios::rotary_fresh_attention`` with torch's SDPA restricted to one backend
  (cuDNN, flash) and with the served priority (`FRESH_BACKENDS`): the rotary kernel storing the
  rotated keys, the fused causal attention over the fresh tensors, the padding zeros;
- the attention alone: the paged prefill kernel on the written planes against SDPA over the fresh
  tensors (each backend; and cuDNN with the key/value heads expanded to the query heads instead of
  ``enable_gqa``, the copies included), so the kernels' own times are visible beside the layer's.

Each timing is the median replay of a CUDA graph of `--calls` calls (one per layer, 32 by default)
divided by the calls: microseconds per layer, and the 32-layer saving against ``paged``. Each fresh
form's output is compared with the paged one (relative error) and its planes with the paged planes
(bit for bit).

    python bench/fresh_attention_ab.py [--tokens 2048,1024,512] [--json out.json]
    python bench/fresh_attention_ab.py --smoke   # tiny shapes on the CPU (the CPU bodies; checks the script runs)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

import helios.abi  # noqa: F401  (registers the ops)
from helios.abi.fresh_attention import FRESH_BACKENDS, cuda_rotary_fresh_attention, fresh_causal_attention
from lever_ab import graph_ms  # bench/

OPS = torch.ops.helios
FULL = dict(heads=32, kv_heads=8, dim=128, page_tokens=16)
SMOKE = dict(heads=4, kv_heads=2, dim=16, page_tokens=4)
BACKENDS = {"cudnn": (SDPBackend.CUDNN_ATTENTION,), "flash": (SDPBackend.FLASH_ATTENTION,), "served": None}


def chunk(shape: dict, tokens: int, shuffled: bool, device: torch.device, seed: int = 0) -> tuple:
    """(q, k, v, cos, sin, k_cache, v_cache, slots, page_table, query_start, positions) of one chunk."""
    generator = torch.Generator(device=device).manual_seed(seed)
    heads, kv_heads, dim, page_tokens = shape["heads"], shape["kv_heads"], shape["dim"], shape["page_tokens"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator, device=device).to(dtype)
    q, k, v = (t.view(tokens, -1, dim) for t in qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], -1))
    positions = torch.arange(tokens, device=device)
    angles = positions[:, None].float() * (1.0 / 500000 ** (torch.arange(0, dim, 2, device=device).float() / dim))
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]
    pages = -(-tokens // page_tokens)
    order = torch.randperm(4 * pages, generator=generator, device=device)[:pages] if shuffled \
        else torch.arange(pages, 2 * pages, device=device)
    page_table = order.to(torch.int32)[None]
    slots = page_table[0][positions // page_tokens].long() * page_tokens + positions % page_tokens
    cache = torch.zeros(4 * pages, page_tokens, kv_heads, dim, dtype=dtype, device=device)
    query_start = torch.tensor([0, tokens], dtype=torch.int32, device=device)
    return q, k, v, cos, sin, cache, cache.clone(), slots, page_table, query_start, positions


def per_call_us(call, calls: int, device: torch.device, replays: int = 15) -> float:
    """Median microseconds per call: a CUDA graph of `calls` calls replayed (wall clock on the CPU;
    `lever_ab.graph_ms`, which warms the call up, compiling and planning, outside the capture)."""
    return graph_ms(call, calls, replays) * 1e3 / calls


def fresh_form(case: tuple, scale: float, backends):
    q, k, v, cos, sin, k_cache, v_cache, slots, page_table, query_start, positions = case
    if q.is_cuda:
        return lambda: cuda_rotary_fresh_attention(q, k, v, cos, sin, k_cache, v_cache, slots, page_table,
                                                   query_start, positions, scale, backends=backends)
    return lambda: OPS.rotary_fresh_attention(*case, scale, 0, None, None)


def paged_form(case: tuple, scale: float):
    q, k, v, cos, sin, k_cache, v_cache, slots, page_table, query_start, positions = case

    def layer():
        rotated = OPS.rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots)
        return OPS.paged_attention(rotated, k_cache, v_cache, page_table, query_start, positions, scale, 0)
    return layer


def measure(shape: dict, tokens: int, shuffled: bool, device: torch.device, calls: int) -> dict:
    """us per layer of each form, errors against the paged form, and the attention kernels alone."""
    scale = shape["dim"] ** -0.5
    base = chunk(shape, tokens, shuffled, device)
    paged_case = (*base[:5], base[5].clone(), base[6].clone(), *base[7:])
    reference = paged_form(paged_case, scale)()
    row = {"tokens": tokens, "pages": "shuffled" if shuffled else "consecutive", "us": {}, "relative_error": {},
           "planes_equal": {}}
    row["us"]["paged"] = per_call_us(paged_form(paged_case, scale), calls, device)
    for name, backends in BACKENDS.items():
        if device.type != "cuda" and name != "served":
            continue
        case = (*base[:5], base[5].clone(), base[6].clone(), *base[7:])
        form = fresh_form(case, scale, backends)
        try:
            out = form()
        except RuntimeError as error:  # a backend this build cannot run for these inputs
            row["us"][f"fresh {name}"] = None
            row.setdefault("unavailable", {})[name] = str(error).splitlines()[0][:160]
            continue
        row["relative_error"][name] = float((out.float() - reference.float()).norm() / reference.float().norm())
        row["planes_equal"][name] = bool(torch.equal(case[5], paged_case[5]) and torch.equal(case[6], paged_case[6]))
        row["us"][f"fresh {name}"] = per_call_us(form, calls, device)
    row["attention_us"] = attention_alone(paged_case, scale, device, calls)
    return row


def attention_alone(case: tuple, scale: float, device: torch.device, calls: int) -> dict:
    """The paged prefill kernel over the written planes against SDPA over dense rotated tensors."""
    q, k, v, cos, sin, k_cache, v_cache, slots, page_table, query_start, positions = case
    rotated_q = OPS.rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots)
    rotated_k = k_cache.reshape(-1, *k_cache.shape[2:])[slots].contiguous()
    v = v.contiguous()  # dense, as the fresh op's rotary kernel stores it
    timed = {"paged kernel": per_call_us(
        lambda: OPS.paged_attention(rotated_q, k_cache, v_cache, page_table, query_start, positions, scale, 0),
        calls, device)}
    for name, backends in BACKENDS.items():
        if device.type != "cuda" and name != "served":
            continue
        try:
            fresh_causal_attention(rotated_q, rotated_k, v, scale, backends)
        except RuntimeError:
            timed[f"sdpa {name}"] = None
            continue
        timed[f"sdpa {name}"] = per_call_us(lambda: fresh_causal_attention(rotated_q, rotated_k, v, scale, backends),
                                            calls, device)
    if device.type == "cuda":  # GQA by expanding the key/value heads (a copy each call) instead of enable_gqa
        group = q.shape[1] // k.shape[1]

        def expanded():
            wide_k, wide_v = (t.repeat_interleave(group, dim=1) for t in (rotated_k, v))
            return fresh_causal_attention(rotated_q, wide_k, wide_v, scale, BACKENDS["cudnn"])
        try:
            expanded()
            timed["sdpa cudnn expanded"] = per_call_us(expanded, calls, device)
        except RuntimeError:
            timed["sdpa cudnn expanded"] = None
    return timed


def report(rows: list[dict], layers: int) -> None:
    for row in rows:
        paged = row["us"]["paged"]
        print(f"--- {row['tokens']} tokens from position 0, {row['pages']} pages: us per layer "
              f"(rotary + cache write + attention)")
        for name, us in row["us"].items():
            if us is None:
                print(f"  {name:<16} unavailable: {row['unavailable'][name.split()[-1]]}")
                continue
            key = name.split()[-1]
            extra = "" if name == "paged" else (
                f"   {paged / us:5.2f}x   saves {(paged - us) * layers / 1e3:+.3f} ms over {layers} layers"
                f"   rel. error {row['relative_error'][key]:.2e}   planes equal {row['planes_equal'][key]}")
            print(f"  {name:<16} {us:9.2f}{extra}")
        alone = "   ".join(f"{name} {us:.2f}" if us is not None else f"{name} -"
                           for name, us in row["attention_us"].items())
        print(f"  attention alone (us): {alone}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="2048,1024,512")
    parser.add_argument("--calls", type=int, default=32, help="calls per CUDA graph (the layers of a step)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shape = SMOKE if args.smoke else FULL
    sizes = [64, 32] if args.smoke else [int(part) for part in args.tokens.split(",")]
    calls = 2 if args.smoke else args.calls
    if device.type == "cuda":
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
              f"served SDPA priority {[b.name for b in FRESH_BACKENDS]}")
    rows = []
    for tokens in sizes:
        for shuffled in (False, True):  # each row printed (and saved) as it is measured: a time limit keeps the rest
            rows.append(measure(shape, tokens, shuffled, device, calls))
            report(rows[-1:], 32)
            if args.json:
                args.json.write_text(json.dumps({"device": str(device), "shape": shape, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
