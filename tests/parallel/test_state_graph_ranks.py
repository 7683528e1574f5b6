"""Two tensor-parallel ranks of a hybrid core that declares SNAPSHOT, RESTORATION and RESUME graphs
(tests/support/state_graphs_core.py): every rank copies its share of the recurrent state through
the core's programs, and a shared prefix restored that way gives what one rank gives."""

from __future__ import annotations

from helios.runtime.offline import generate
from ignition.hf_checkpoints import BAMBA
from parallel.conftest import MAX_TOKENS, NAMESPACE, PROMPTS, running
from support.state_graphs_core import write_state_graphs_core


def _restoring_run(cores, ranks: int, tmp_path):
    path = write_state_graphs_core(cores.open(cores.core(BAMBA, ranks)), cores.key, NAMESPACE,
                                   tmp_path / f"state-tp{ranks}.core")
    with running(cores.open(path)) as runtime:
        prompts = [PROMPTS[0], PROMPTS[0] + [7, 8, 9]]
        tokens = [list(generate(runtime.engine, [prompt], MAX_TOKENS)[0].token_ids) for prompt in prompts]
        launches = dict(runtime.engine.stats.snapshot().graph_launches)
        return tokens, runtime.engine.scheduler.counters().snapshots_restored, launches


def test_two_ranks_restore_through_the_cores_programs_as_one_rank_does(cores, tmp_path):
    one_tokens, one_restored, one_launches = _restoring_run(cores, 1, tmp_path)
    two_tokens, two_restored, two_launches = _restoring_run(cores, 2, tmp_path)
    assert two_tokens == one_tokens
    assert one_restored == two_restored == 1
    for launches in (one_launches, two_launches):
        assert launches["snapshot"] >= 1 and launches["restoration"] == 1 and launches["resume"] >= 1
