"""Token log-probabilities through the runtime on the CPU (`support.logprob_runs`): requests that
ask get each token's log-probability and alternatives from the token-logprobs variants, equal to
``log_softmax`` of the programs' logits; a request in the same batch that does not ask gets none."""

from __future__ import annotations

from helios.core.reader import open_core
from support.logprob_runs import REQUESTS, check_logprob_run
from support.server_core import tiny_core


def test_logprobs_equal_log_softmax_of_the_programs_logits(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    max_tokens = 6
    asking = sum(top is not None for _, top, _ in REQUESTS)
    assert check_logprob_run(opened, max_tokens=max_tokens) == asking * max_tokens
