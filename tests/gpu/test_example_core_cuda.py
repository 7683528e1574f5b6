"""The example contract's core (`helios.ignition.contract_core` on examples/contract-tiny.json) on
CUDA, eager and as CUDA graphs: greedy tokens equal the plain reference through the speculative
programs (history candidates accepted), the decode programs (biased requests), an image through the
VISION program, and the Engram rows staged from the pinned host frames; on the CPU the same is
tests/ignition/test_contract_core.py."""

from __future__ import annotations

import pytest

from helios.contract import StartupOptions
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.ignition.contract_core import reference_model
from ignition.test_contract_core import PROMPTS, Recorder, _run, _tokens, core  # noqa: F401 (core: the fixture)
from support.example_core import open_example

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_the_example_core_serves_the_reference_tokens_on_cuda(core, cuda_graphs):  # noqa: F811
    load = LoadOptions(startup=StartupOptions(history_drafting=True), device="cuda", cuda_graphs=cuda_graphs)
    runtime = build_runtime(open_example(core), RuntimeOptions(load=load))
    try:
        reference = reference_model({k: v.cpu() for k, v in runtime.model.weights.items()})
        assert runtime.model.weights["w.engram"].device.type == "cpu"
        recorder = Recorder(runtime)
        results = generate(runtime.engine, PROMPTS, 16)
        assert [list(r.token_ids) for r in results] == [reference.greedy(p, 16) for p in PROMPTS], \
            [r.message for r in results]
        chain = reference.greedy([11], 12)
        again = generate(runtime.engine, [[11, *chain, 11]], 12)
        assert list(again[0].token_ids) == chain and recorder.accepted > 0
        bias = {5: 4.0, 17: 3.0}
        specs = [RequestSpec(f"b{i}", tuple(PROMPTS[i]), 10, logit_bias=tuple(bias.items())) for i in range(3)]
        events = _run(runtime, specs)
        assert [_tokens(events[s.request_id]) for s in specs] == [reference.greedy(PROMPTS[i], 10, bias=bias)
                                                                   for i in range(3)]
        assert {"prefill", "speculate_w4", "speculate_confident", "decode_host_fed"} <= set(recorder.graphs)
    finally:
        runtime.close()
