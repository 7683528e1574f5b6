"""The rewritten greedy graphs on CUDA (`helios.runtime.loading.sampling_rewrite`, the greedy kernel's
slot-indexed counts): served through captured graphs, plain, penalised and biased greedy requests
(fewer than the program's rows: padding rows) get exactly the tokens of the greedy graphs as they
were captured before the rewrite (the bound GREEDY variant alone), with one and two frames; the
sampling tail replayed from a CUDA graph samples what the bound GREEDY variant samples and leaves
the logits output unbiased bit for bit (a bfloat16 product sampled without its float32 copies)."""

from __future__ import annotations

import pytest
import torch

import helios.runtime.loading.cuda_graphs as cuda_graphs
from helios.abi.sampling import SampleVariant
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_greedy_rows_graph import (MAX_TOKENS, NAMESPACE, _Sampler, _sampler_inputs, _serve,
                                            core_path)  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _cuda_tokens(core_path, frames: int) -> list[list[int]]:  # noqa: F811
    path, key = core_path
    options = RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=True))
    runtime = build_runtime(open_core(path, accept=NAMESPACE, trusted_keys=[key.public]), options)
    try:
        tokens = _serve(runtime, frames)
        assert runtime.engine.stats.graph_launches["decode"] > MAX_TOKENS // 2
        return tokens
    finally:
        runtime.close()


@pytest.mark.parametrize("frames", [1, 2])
def test_captured_greedy_graphs_give_the_tokens_of_the_graphs_before(core_path, frames, monkeypatch):  # noqa: F811
    rewritten = _cuda_tokens(core_path, frames)
    with monkeypatch.context() as patch:  # the greedy graphs as captured before the rewrite
        patch.setattr(cuda_graphs, "greedy_module", lambda module: cuda_graphs.variant_module(
            module, SampleVariant.GREEDY))
        before = _cuda_tokens(core_path, frames)
    assert all(len(tokens) == MAX_TOKENS for tokens in before)
    assert rewritten == before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_sampling_tail_in_a_cuda_graph_samples_the_greedy_variants_tokens(dtype):
    """A bfloat16 product is sampled by `greedy_rows_biased` (the logits output: the product, put back
    bit for bit); float32 logits by `greedy_rows` with the bias added in place."""
    cuda = [t.cuda() for t in _sampler_inputs(rows=6, vocab=5000, dtype=dtype)]
    # exported on the device: the exported graph asserts its inputs' device
    module = torch.export.export(_Sampler().cuda(), tuple(cuda), strict=False).module()
    plain = cuda_graphs.variant_module(module, SampleVariant.GREEDY)
    rewritten = cuda_graphs.greedy_module(module)
    expected, logits = plain(*cuda)
    rewritten(*cuda)  # warm-up: Triton compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = rewritten(*cuda)
    graph.replay()
    torch.cuda.synchronize()
    got, got_logits = outputs
    assert torch.equal(got, expected) and bool((got[cuda[1] < 0] == -1).all())
    assert got_logits.dtype == dtype and torch.equal(got_logits.float(), logits)
    assert torch.equal(cuda[0].float(), logits)  # the product itself as it was
