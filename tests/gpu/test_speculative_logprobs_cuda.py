"""Token log-probabilities under speculative decoding on CUDA, with and without CUDA graphs.

The draft core `helios prepare --draft` writes (tests/speculative/support.py `allocating_core`: a
one-layer draft, widths 1 and 4, device-allocated prefixes) has token-logprobs twins of its
SPECULATIVE programs. Loaded on CUDA, requests asking for `top_logprobs` keep speculating (rounds
run, some accept proposals) and get the tokens and, within float tolerance, the log-probabilities
and alternatives of the same requests decoded plainly on the same device. Requests with a logit
bias (a nudge and a ban, a forced token) keep speculating too, with plain decoding's tokens.
"""

from __future__ import annotations

import math

import pytest

from helios.core.reader import open_core
from helios.runtime.engine import EngineRequest
from helios.runtime.loading.model import LoadOptions
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime
from speculative.support import ALLOCATING_NAMESPACE, Counting, allocating_core

pytestmark = pytest.mark.gpu
PROMPTS = [list(range(3, 43)), [5, 6, 7], [9], [40, 41, 42, 40, 41, 42, 40, 41]]
MAX_TOKENS = 20
TOP = 3
# per prompt: a nudge and a ban, none, a forced token, a nudge
BIASES = [((7, 3.0), (11, -100.0)), (), ((42, 100.0),), ((40, -2.0), (41, 1.5))]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return allocating_core(tmp_path_factory)


def run(prepared, speculative: bool, cuda_graphs: bool, biases=((),) * len(PROMPTS)):
    core = open_core(prepared.core, accept=ALLOCATING_NAMESPACE, trusted_keys=[prepared.public_key])
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=cuda_graphs),
                                                 policy=SchedulerPolicy(speculative=speculative)))
    try:
        counting = Counting()
        counting.wrap(runtime.engine.executor)
        events: dict[str, list] = {}
        for index, (prompt, bias) in enumerate(zip(PROMPTS, biases)):
            request_id = f"r{index}"
            events[request_id] = []
            spec = RequestSpec(request_id, tuple(prompt), MAX_TOKENS, top_logprobs=TOP, logit_bias=bias)
            runtime.engine.submit(EngineRequest(spec, events[request_id].append))
        runtime.engine.run_until_idle()
    finally:
        runtime.close()
    for received in events.values():
        assert [e.reason for e in received if isinstance(e, FinishEvent)] == [FinishReason.LENGTH]
    tokens = {r: [t for e in evs if isinstance(e, TokenEvent) for t in e.token_ids] for r, evs in events.items()}
    logprobs = {r: [lp for e in evs if isinstance(e, TokenEvent) for lp in e.logprobs] for r, evs in events.items()}
    return tokens, logprobs, counting


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_speculation_returns_the_logprobs_of_plain_decoding_on_cuda(prepared, cuda_graphs):
    plain_tokens, plain_logprobs, plain = run(prepared, False, cuda_graphs)
    tokens, logprobs, counting = run(prepared, True, cuda_graphs)
    assert plain.rounds == 0 and counting.rounds > 0 and counting.accepted > 0
    assert tokens == plain_tokens
    for request_id, expected in plain_logprobs.items():
        got = logprobs[request_id]
        assert len(got) == len(expected) == MAX_TOKENS
        for mine, theirs in zip(got, expected):
            assert math.isclose(mine.logprob, theirs.logprob, rel_tol=1e-3, abs_tol=1e-3), (request_id, mine, theirs)
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top]
            assert all(math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3) for (_, a), (_, b) in zip(mine.top, theirs.top))


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_biased_requests_keep_speculating_with_plain_decodings_tokens_on_cuda(prepared, cuda_graphs):
    plain_tokens, plain_logprobs, plain = run(prepared, False, cuda_graphs, BIASES)
    tokens, logprobs, counting = run(prepared, True, cuda_graphs, BIASES)
    assert plain.rounds == 0 and counting.rounds > 0
    assert all(counting.speculated[f"r{index}"] > 0 for index in range(len(PROMPTS))), counting.speculated
    assert tokens == plain_tokens
    assert tokens["r2"] == [42] * MAX_TOKENS and 11 not in tokens["r0"]
    for request_id, expected in plain_logprobs.items():
        for mine, theirs in zip(logprobs[request_id], expected):
            assert math.isclose(mine.logprob, theirs.logprob, rel_tol=1e-3, abs_tol=1e-3), (request_id, mine, theirs)
