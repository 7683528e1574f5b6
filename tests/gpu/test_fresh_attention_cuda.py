"""``helios::rotary_fresh_attention`` on CUDA (torch's fused SDPA over a fresh chunk's own keys) against
the paged path it replaces (the rotary kernel + `helios.abi.triton_prefill`), and the runtime's
fresh-chunk graphs end to end.

- 8B attention shapes (32 query heads, 8 key/value heads, head size 128, bfloat16), a 2,048-token
  chunk from position 0 (full, and with padding), pages consecutive and shuffled: the planes are
  written bit for bit as the paged path writes them, the outputs agree within bfloat16 rounding
  (relative error < 1e-2), padding tokens are zeros; with each SDPA backend alone (cuDNN, flash)
  and the default priority;
- the op captured in a CUDA graph replays as it runs eagerly for a different chunk length;
- a tiny bfloat16 Llama core whose prompt programs get fresh graphs (`FRESH_MIN_TOKENS` lowered):
  they are captured, and greedy tokens and logits stay with the same core served without them.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.nn.attention import SDPBackend

from helios.abi.fresh_attention import cuda_rotary_fresh_attention
from helios.abi.rotary_attention import triton_rotary_paged_attention
from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.loading import fresh_calls
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import LLAMA3
from support.chat_checkpoint import write_chat_checkpoint
from support.runtime_runs import first_difference, greedy_run, logits_error

pytestmark = pytest.mark.gpu
HEADS, KV_HEADS, DIM, PAGE_TOKENS = 32, 8, 128, 16
BACKENDS = {"default": None, "cudnn": (SDPBackend.CUDNN_ATTENTION,), "flash": (SDPBackend.FLASH_ATTENTION,)}


def chunk_case(num_tokens: int, live: int, shuffled: bool, seed: int = 0):
    """The op's arguments for one chunk of `live` tokens from position 0 in a `num_tokens` launch."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(num_tokens, (HEADS + 2 * KV_HEADS) * DIM, generator=generator, device="cuda").bfloat16()
    q, k, v = (t.view(num_tokens, -1, DIM) for t in qkv.split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1))
    positions = torch.arange(num_tokens, device="cuda")
    positions[live:] = 0
    angles = positions[:, None].float() * (1.0 / 500000 ** (torch.arange(0, DIM, 2, device="cuda").float() / DIM))
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().bfloat16()[:, None], angles.sin().bfloat16()[:, None]
    pages = -(-num_tokens // PAGE_TOKENS)
    order = torch.randperm(2 * pages, generator=generator, device="cuda")[:pages] if shuffled \
        else torch.arange(3, 3 + pages, device="cuda")
    page_table = order.to(torch.int32)[None]
    slots = page_table[0][positions // PAGE_TOKENS].long() * PAGE_TOKENS + positions % PAGE_TOKENS
    slots[live:] = -1
    query_start = torch.tensor([0, live], dtype=torch.int32, device="cuda")
    cache = torch.zeros(2 * pages + 3, PAGE_TOKENS, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    return (q, k, v, cos, sin, cache, cache.clone(), slots, page_table, query_start, positions)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("live, shuffled", [(2048, False), (2048, True), (1500, True)])
def test_fresh_attention_matches_the_paged_kernel_at_8b_shapes(backend, live, shuffled):
    case = chunk_case(2048, live, shuffled)
    fresh_planes, paged_planes = (case[5].clone(), case[6].clone()), (case[5].clone(), case[6].clone())
    try:
        fresh = cuda_rotary_fresh_attention(*case[:5], *fresh_planes, *case[7:], DIM ** -0.5,
                                            backends=BACKENDS[backend])
    except RuntimeError as error:
        if "No available kernel" in str(error):
            pytest.skip(f"this torch build runs no {backend} SDPA kernel here: {error}")
        raise
    paged = triton_rotary_paged_attention(*case[:5], *paged_planes, *case[7:], DIM ** -0.5, 0)
    torch.cuda.synchronize()
    assert torch.equal(fresh_planes[0], paged_planes[0]) and torch.equal(fresh_planes[1], paged_planes[1])
    assert fresh.shape == paged.shape and fresh.is_contiguous()
    assert _relative(fresh[:live], paged[:live]) < 1e-2
    assert bool((fresh[live:] == 0).all())


def test_the_op_replays_in_a_cuda_graph():
    case = chunk_case(1024, 1000, True)
    planes = (case[5].clone(), case[6].clone())
    ops = torch.ops.helios
    args = (*case[:5], *planes, *case[7:])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.rotary_fresh_attention(*args, DIM ** -0.5, 0, None, None)  # warm-up (cuDNN plans, Triton compiles)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.rotary_fresh_attention(*args, DIM ** -0.5, 0, None, None)
    shorter = chunk_case(1024, 700, True, seed=3)
    for static, value in zip(args, (*shorter[:5], shorter[5].clone(), shorter[6].clone(), *shorter[7:])):
        static.copy_(value)
    graph.replay()
    eager_planes = (shorter[5].clone(), shorter[6].clone())
    eager = ops.rotary_fresh_attention(*shorter[:5], *eager_planes, *shorter[7:], DIM ** -0.5, 0, None, None)
    torch.cuda.synchronize()
    assert _relative(out[:700], eager[:700]) < 1e-3 and torch.equal(planes[0], eager_planes[0])
    assert bool((out[700:] == 0).all())


PLAN = CapacityPlan(context_tokens=256, prefill_tokens=64, decode_batches=(1, 4), prefill_batches=(1,), mixed=False)
_CHOOSER = random.Random(13)
PROMPTS = [[_CHOOSER.randrange(3, 120) for _ in range(n)] for n in (3, 20, 64, 90)]


@pytest.fixture(scope="module")
def bf16_core(tmp_path_factory):
    root = tmp_path_factory.mktemp("fresh-core")
    key = SigningKey.generate()
    write_chat_checkpoint(LLAMA3, root / "checkpoint", seed=8)
    prepare_core(root / "checkpoint", root / "model.core", key,
                 PrepareOptions("test.helios/fresh", dtype="bfloat16", capacities=PLAN))
    return lambda: open_core(root / "model.core", accept="test.helios/fresh", trusted_keys=[key.public])


def test_fresh_graphs_serve_the_paged_graphs_tokens(bf16_core, monkeypatch):
    options = LoadOptions(device="cuda", cuda_graphs=True)
    monkeypatch.setattr(fresh_calls, "FRESH_MIN_TOKENS", 1 << 30)
    paged = greedy_run(bf16_core(), PROMPTS, 8, options)  # one prompt per step: its first chunk is fresh
    monkeypatch.setattr(fresh_calls, "FRESH_MIN_TOKENS", 16)
    runtime = build_runtime(bf16_core(), RuntimeOptions(load=options))
    try:
        fresh = [p for p in runtime.model.programs if p.module.has_fresh_graph]
        assert fresh and all(p.packed_token_capacity >= 16 for p in fresh)
    finally:
        runtime.close()
    run = greedy_run(bf16_core(), PROMPTS, 8, options)
    agreeing = [first_difference(tokens, expected) >= 4 for tokens, expected in zip(run.tokens, paged.tokens)]
    assert sum(agreeing) >= len(PROMPTS) - 1, agreeing
    assert logits_error(run, paged) < 3e-2
