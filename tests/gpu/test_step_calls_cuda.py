"""The capture-time bookkeeping rewrite on CUDA (`helios.runtime.loading.step_calls`): served through
captured graphs, plain, penalised and biased greedy requests (fewer than the program's rows: padding
rows) get exactly the tokens of the graphs captured without it, with one and two frames, and the
captured DECODE graphs map cache slots and accumulate counts and pending tokens through the one-launch
kernels; with the rotary fusion at capture on, the tokens are those of the unfused graphs."""

from __future__ import annotations

import pytest
import torch

import helios.runtime.loading.step_calls as step_calls
from helios.abi.accumulate import accumulate_into
from helios.abi.slots import packed_slots
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_greedy_rows_graph import MAX_TOKENS, NAMESPACE, _serve, core_path  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cuda_tokens(core_path, frames: int, check=None) -> list[list[int]]:  # noqa: F811
    path, key = core_path
    options = RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=True))
    runtime = build_runtime(open_core(path, accept=NAMESPACE, trusted_keys=[key.public]), options)
    try:
        if check is not None:
            check(runtime.model)
        tokens = _serve(runtime, frames)
        assert runtime.engine.stats.graph_launches["decode"] > MAX_TOKENS // 2
        return tokens
    finally:
        runtime.close()


def _bound(model) -> None:
    decode = next(p for p in model.programs if p.graph == "decode" and not p.token_logprobs)
    full, greedy = decode.module.eager_modules
    for module in (full, greedy):
        assert len([n for n in module.graph.nodes if n.target is accumulate_into]) == 2
        assert len([n for n in module.graph.nodes if n.target is packed_slots]) == 1


@pytest.mark.parametrize("frames", [1, 2])
def test_captured_graphs_give_the_tokens_of_the_graphs_without_the_rewrite(core_path, frames, monkeypatch):  # noqa: F811
    rewritten = _cuda_tokens(core_path, frames, _bound if frames == 1 else None)
    with monkeypatch.context() as patch:
        patch.setattr(step_calls, "STEP_CALLS", False)
        before = _cuda_tokens(core_path, frames)
    assert all(len(tokens) == MAX_TOKENS for tokens in before)
    assert rewritten == before


def test_captured_graphs_with_the_rotary_fusion_give_the_same_tokens(core_path, monkeypatch):  # noqa: F811
    """`rotary_calls.FUSE_AT_CAPTURE` on and off: the served tokens of the captured graphs agree (the
    fused launch rounds as the two kernels do; bench/step_launches_ab.py compares logits at 8B shapes)."""
    import helios.runtime.loading.rotary_calls as rotary_calls

    with monkeypatch.context() as patch:
        patch.setattr(rotary_calls, "FUSE_AT_CAPTURE", True)
        fused = _cuda_tokens(core_path, 2, _fused)
    with monkeypatch.context() as patch:
        patch.setattr(rotary_calls, "FUSE_AT_CAPTURE", False)
        split = _cuda_tokens(core_path, 2)
    assert fused == split


def _fused(model) -> None:
    decode = next(p for p in model.programs if p.graph == "decode" and not p.token_logprobs)
    for module in decode.module.eager_modules:
        assert any(n.target is torch.ops.helios.rotary_paged_attention.default for n in module.graph.nodes)
