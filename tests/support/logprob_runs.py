"""Token log-probabilities through the real runtime, checked against the programs' own logits.

`check_logprob_run(core, load)` builds the runtime with `load` options (device, CUDA graphs), records
the logits row of every sampling row (one execution frame, see `support.runtime_runs`), and submits
prompts of different lengths in one batch: some greedy requests asking for alternatives, one asking
for none, one sampled request asking for the chosen token only. Every token event of an asking
request must carry the token's log-probability, equal to ``log_softmax`` of its recorded logits (the
op's distribution for unpenalized, unmasked rows, whatever the temperature), the greedy token its
argmax, and the alternatives the most probable ids; the other request's events carry None. Used by
tests/runtime/test_token_logprobs_runtime.py (CPU) and tests/gpu/test_logprobs_cuda.py.
"""

from __future__ import annotations

import torch

from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishReason, TokenEvent
from helios.runtime.loading.model import LoadOptions
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime
from support.runtime_runs import record_logits

GREEDY = (0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0)
SAMPLED = (1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0)
# (prompt, top_logprobs, sampling)
REQUESTS = [([5, 6, 7], 3, GREEDY), ([9] * 20, 5, GREEDY), ([11, 12], None, GREEDY), ([13, 14, 15, 16], 0, SAMPLED)]
TOLERANCE = 1e-5


def _recorder(tokens: list, finished: dict):
    def on_event(event) -> None:
        if isinstance(event, TokenEvent):
            tokens.append(event)
        else:
            finished[event.request_id] = event
    return on_event


def check_logprob_run(core, load: LoadOptions = LoadOptions(), max_tokens: int = 6) -> int:
    """Runs `REQUESTS` and checks every event (see the module docstring); returns the number of
    token log-probabilities checked."""
    runtime = build_runtime(core, RuntimeOptions(load=load))
    events: dict[str, list[TokenEvent]] = {}
    finished = {}
    try:
        runtime.engine.frames = 1
        recorded = record_logits(runtime.engine.executor)
        for index, (prompt, top, sampling) in enumerate(REQUESTS):
            request_id = f"r{index}"
            events[request_id] = []
            spec = RequestSpec(request_id, tuple(prompt), max_tokens, top_logprobs=top)
            admission = AdmissionValues(tuple(prompt), 7 + index, sampling, max_tokens, (), top)

            runtime.engine.submit(EngineRequest(spec, admission, _recorder(events[request_id], finished)))
        runtime.engine.run_until_idle()
    finally:
        runtime.close()
    checked = 0
    for index, (_, top, sampling) in enumerate(REQUESTS):
        request_id = f"r{index}"
        assert finished[request_id].reason == FinishReason.LENGTH, finished[request_id]
        for position, event in enumerate(events[request_id]):
            if top is None:
                assert event.logprobs is None
                continue
            (values,) = event.logprobs
            row = torch.log_softmax(recorded[request_id][position].double(), dim=-1)
            (token,) = event.token_ids
            assert abs(values.logprob - row[token].item()) < TOLERANCE, (request_id, position)
            if sampling == GREEDY:
                assert token == int(row.argmax())
            assert len(values.top) == top
            expected = torch.topk(row, top)
            assert [i for i, _ in values.top] == expected.indices.tolist()
            assert max((abs(v - e) for (_, v), e in zip(values.top, expected.values.tolist())), default=0) < TOLERANCE
            checked += 1
    return checked


def transformers_logprob_table(checkpoint_dir):
    """`table(ids)`: float64 log_softmax of `transformers`' float32 logits after every prefix of
    `ids` (row i scores ids[i + 1]), for the checkpoint a test core was prepared from."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint_dir)).float().eval()

    def table(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)

    return table
