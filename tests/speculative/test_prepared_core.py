"""`helios prepare TARGET --draft DRAFT` end to end: captured programs in a signed core, loaded by
the runtime, generating exactly what transformers generates greedily.

The core's wider programs allocate prefixes on the device (ceilings of 4 per lane, P = 2 per lane),
so the captured allocation, verification and commit run through the real loader, packer, executor
and completion validation (the core `support.allocating_core` prepares once per run, which
test_served_parity.py serves too). Startup options select the served width and history drafting.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from helios.cli.main import main
from helios.contract import StartupOptions
from helios.contract import serving_pb2 as spb
from helios.contract.settings import StartupOptionError
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime

from .support import ALLOCATING_NAMESPACE, Counting, allocating_core

NAMESPACE = ALLOCATING_NAMESPACE
PROMPTS = [list(range(3, 43)), [5, 6, 7], [9], [40, 41, 42, 40, 41, 42, 40, 41]]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    # prepared by `helios prepare --draft ...` once per run; test_served_parity serves it too
    made = allocating_core(tmp_path_factory)
    return made.checkpoint, made.core, made.public_key


@pytest.fixture(scope="module")
def expected(prepared) -> list[list[int]]:
    """transformers' greedy continuation of every prompt."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(prepared[0])).float().eval()
    tokens = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        tokens.append(out[0, len(prompt):].tolist())
    return tokens


def test_the_core_declares_draft_storage_and_speculative_variants(prepared):
    _, core, public = prepared
    contract = open_core(core, accept=NAMESPACE, trusted_keys=[public]).prepared
    cache = contract.contract.model.cache
    assert [(r.name, list(r.planes)) for r in cache.regions][1] == ("draft", ["draft_k_cache", "draft_v_cache"])
    views = [(v.destination, v.page_offset) for v in cache.page_table_views]
    assert views == [("page_table", 0), ("draft_page_table", 0)]
    assert [(c.name, c.lag_tokens) for c in cache.cursors] == [("draft", 0)]
    assert list(contract.contract.speculative_widths) == [1, 4]
    # The SPECULATIVE graph and its token-logprobs twin, which declares the same extents and bindings.
    graph, twin = contract.graphs_for(spb.GRAPH_OPERATION_SPECULATIVE)
    assert (graph.token_logprobs, twin.token_logprobs) == (0, 20)
    for declared in (graph, twin):
        assert declared.length_source == spb.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT and declared.has_copied_inputs
        assert declared.draft_cursor == "draft"
        extents = {(v.batch_capacity, v.token_capacity, v.packed_token_capacity, v.draft_tokens,
                    v.confidence_width, v.lane_limit) for v in declared.variants}
        assert extents == {(4, 1, 4, 0, 0, 1), (4, 4, 8, 3, 3, 4)}
        # The lanes' logit bias, in the buffers the plain programs read (written at admission).
        bias = {b.source: (b.buffer, b.indexing) for b in declared.bindings
                if b.source in (spb.VALUE_SOURCE_LOGIT_BIAS_IDS, spb.VALUE_SOURCE_LOGIT_BIAS_VALUES)}
        assert bias == {spb.VALUE_SOURCE_LOGIT_BIAS_IDS: ("logit_bias_ids", spb.INDEXING_PHYSICAL_REQUEST_ROW),
                        spb.VALUE_SOURCE_LOGIT_BIAS_VALUES: ("logit_bias_values", spb.INDEXING_PHYSICAL_REQUEST_ROW)}
    assert contract.logit_bias_width == 300
    completion = contract.manifest.completion
    assert completion.confidence_buffer == "proposal_confidence"
    assert contract.buffers["proposal_confidence"].shape == (2, 4, 3)


def test_generate_with_the_draft_core_matches_transformers(prepared, expected, capsys):
    _, core, public = prepared
    capsys.readouterr()
    code = main(["generate", str(core), "--accept", NAMESPACE, "--trust", str(public),
                 "--prompt-ids", json.dumps(PROMPTS), "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json"])
    assert code == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [result["token_ids"] for result in results] == expected


def runtime_tokens(prepared, startup: StartupOptions):
    _, core, public = prepared
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[public]),
                            RuntimeOptions(load=LoadOptions(startup=startup)))
    counting = Counting()
    counting.wrap(runtime.engine.executor)
    results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    widths = {p.speculative.verify_tokens for p in runtime.model.programs if p.speculative is not None}
    return [list(r.token_ids) for r in results], widths, counting


def test_startup_selects_width_and_history_drafting(prepared, expected):
    tokens, widths, counting = runtime_tokens(prepared, StartupOptions(history_drafting=True))
    assert tokens == expected and widths == {4}
    assert counting.trimmed_rounds > 0 and counting.accepted > 0
    tokens, widths, counting = runtime_tokens(prepared, StartupOptions(speculative_width=1))
    assert tokens == expected and widths == {1}
    assert counting.rounds > 0 and counting.tokens_per_lane == 1.0
    with pytest.raises(StartupOptionError):
        runtime_tokens(prepared, StartupOptions(learned_speculation=False, history_drafting=True))
