"""Token log-probabilities on CUDA (`support.logprob_runs`), with and without CUDA graphs: the
token-logprobs variants' values equal ``log_softmax`` of the programs' own logits, for greedy and
sampled requests in one batch beside a request that asks for none."""

from __future__ import annotations

import pytest

from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from support.logprob_runs import REQUESTS, check_logprob_run
from support.server_core import tiny_core

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
def test_logprobs_on_cuda_equal_log_softmax_of_the_logits(tmp_path_factory, cuda_graphs):
    core = tiny_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    asking = sum(top is not None for _, top, _ in REQUESTS)
    checked = check_logprob_run(opened, LoadOptions(device="cuda", cuda_graphs=cuda_graphs), max_tokens=6)
    assert checked == asking * 6
