"""The rewritten greedy graphs on CUDA (`helios.runtime.loading.sampling_rewrite`, the greedy kernel's
slot-indexed counts): served through captured graphs, plain, penalised and biased greedy requests
(fewer than the program's rows: padding rows) get the CPU path's tokens with one and two frames;
the sampling tail replayed from a CUDA graph samples what the bound GREEDY variant samples and
leaves the logits output unbiased bit for bit."""

from __future__ import annotations

import pytest
import torch

from helios.abi.sampling import SampleVariant
from helios.core.reader import open_core
from helios.runtime.loading.cuda_graphs import greedy_module, variant_module
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_greedy_rows_graph import (MAX_TOKENS, NAMESPACE, _runtime, _Sampler, _sampler_inputs, _serve,
                                            core_path)  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("frames", [1, 2])
def test_captured_greedy_graphs_give_the_cpu_path_tokens(core_path, frames):  # noqa: F811
    reference = _runtime(core_path)
    try:
        expected = _serve(reference, frames)
    finally:
        reference.close()
    path, key = core_path
    options = RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=True))
    runtime = build_runtime(open_core(path, accept=NAMESPACE, trusted_keys=[key.public]), options)
    try:
        got = _serve(runtime, frames)
        assert runtime.engine.stats.graph_launches["decode"] > MAX_TOKENS // 2
    finally:
        runtime.close()
    assert got == expected


def test_the_sampling_tail_in_a_cuda_graph_samples_the_greedy_variants_tokens():
    inputs = _sampler_inputs(rows=6, vocab=5000)
    module = torch.export.export(_Sampler(), inputs, strict=False).module()
    cuda = [t.cuda() for t in inputs]
    plain = variant_module(module, SampleVariant.GREEDY).cuda()
    rewritten = greedy_module(module).cuda()
    expected, logits = plain(*cuda)
    rewritten(*cuda)  # warm-up: Triton compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = rewritten(*cuda)
    graph.replay()
    torch.cuda.synchronize()
    got, got_logits = outputs
    live = cuda[2] >= 0
    assert torch.equal(got[live], expected[live]) and bool((got[~live] == -1).all())
    assert torch.equal(got_logits, logits)
