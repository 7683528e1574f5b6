"""Two tensor-parallel ranks of a hybrid core that declares SNAPSHOT, RESTORATION and RESUME graphs
(tests/support/state_graphs_core.py): every rank copies its share of the recurrent state through
the core's programs, and a shared prefix restored that way gives what one rank gives (transformers'
greedy tokens, which one rank gives: tests/runtime/test_state_graphs.py restores through the same
programs on one rank)."""

from __future__ import annotations

from helios.runtime.offline import generate
from ignition.hf_checkpoints import BAMBA
from parallel.conftest import MAX_TOKENS, NAMESPACE, RESTORING, running
from support.state_graphs_core import write_state_graphs_core


def test_two_ranks_restore_through_the_cores_programs_as_one_rank_does(cores, tmp_path):
    path = write_state_graphs_core(cores.open(cores.core(BAMBA, 2)), cores.key, NAMESPACE, tmp_path / "state-tp2.core")
    with running(cores.open(path)) as runtime:
        tokens = [list(generate(runtime.engine, [prompt], MAX_TOKENS)[0].token_ids) for prompt in RESTORING]
        launches = dict(runtime.engine.stats.snapshot().graph_launches)
        restored = runtime.engine.scheduler.counters().snapshots_restored
    assert tokens == cores.reference_tokens(BAMBA, RESTORING)
    assert restored == 1
    assert launches["snapshot"] >= 1 and launches["restoration"] == 1 and launches["resume"] >= 1
