"""Token log-probabilities through the runtime on the CPU (`support.logprob_runs`): requests that
ask get each token's log-probability and alternatives from the token-logprobs variants, equal to
``log_softmax`` of the programs' logits; a request in the same batch that does not ask gets none."""

from __future__ import annotations

import pytest

from helios.contract import StartupOptions
from helios.core.reader import open_core
from helios.runtime.scheduling.admission import UnsupportedRequest
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.loading.model import LoadOptions
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime
from support.logprob_runs import GREEDY, REQUESTS, check_logprob_run
from support.server_core import tiny_core


def test_logprobs_equal_log_softmax_of_the_programs_logits(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    max_tokens = 6
    asking = sum(top is not None for _, top, _ in REQUESTS)
    assert check_logprob_run(opened, max_tokens=max_tokens) == asking * max_tokens


def test_a_start_without_the_logprobs_programs_refuses_logprobs_requests(tmp_path_factory):
    """StartupOptions(token_logprobs=False) (``helios serve --no-logprobs``) loads none of the
    variants; plain requests serve, a request asking for log-probabilities is rejected at admission."""
    core = tiny_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    assert any(g.token_logprobs for g in opened.prepared.graphs.values())  # the core holds them
    load = LoadOptions(StartupOptions(token_logprobs=False))
    runtime = build_runtime(opened, RuntimeOptions(load=load))
    try:
        assert runtime.model.programs and not any(p.token_logprobs for p in runtime.model.programs)
        with pytest.raises(UnsupportedRequest, match="no token-logprobs program is loaded"):
            runtime.engine.scheduler.submit(RequestSpec("direct", (5, 6, 7), 2, top_logprobs=1))
        events = []
        for request_id, top in (("asks", 1), ("plain", None)):
            spec = RequestSpec(request_id, (5, 6, 7), 2, top_logprobs=top)
            runtime.engine.submit(EngineRequest(spec, AdmissionValues((5, 6, 7), 1, GREEDY, 2, (), top), events.append))
        runtime.engine.run_until_idle()
        finished = {e.request_id: e for e in events if isinstance(e, FinishEvent)}
        assert finished["asks"].reason is FinishReason.REJECTED
        assert "no token-logprobs program is loaded" in finished["asks"].message
        assert sum(len(e.token_ids) for e in events if isinstance(e, TokenEvent) and e.request_id == "plain") == 2
    finally:
        runtime.close()
