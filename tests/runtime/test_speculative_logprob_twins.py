"""Token-logprobs twins of SPECULATIVE programs on the runtime side: pairing (`logprob_twins`,
`speculates_with_logprobs`) and one `TokenLogprobs` per emitted token (`with_token_logprobs`)."""

from __future__ import annotations

import math

import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.execution.program_variants import logprob_twins, speculates_with_logprobs, variant_name
from helios.runtime.execution.step_output import with_token_logprobs
from helios.runtime.loading.model import LoadedProgram
from helios.runtime.loading.speculation import SpeculativeShape
from helios.runtime.records.events import TokenLogprobs
from helios.runtime.records.plan import RowResult

SPECULATIVE, DECODE = spb.GRAPH_OPERATION_SPECULATIVE, spb.GRAPH_OPERATION_DECODE


def program(graph: str, operation: int, rows: int, tokens: int, width: int | None = None,
            logprobs: int = 0, source: int = spb.VALUE_SOURCE_QUERY_LENGTH, inputs: tuple = ()) -> LoadedProgram:
    shape = None if width is None else SpeculativeShape(width, width - 1, width, source, 0)
    return LoadedProgram(graph, operation, rows, tokens, torch.nn.Identity(), (), inputs, (), (), shape, logprobs,
                         bool(logprobs))


def test_speculative_programs_pair_with_their_twins_by_verify_width():
    decode, decode_twin = program("decode", DECODE, 4, 4), program("decode_logprobs", DECODE, 4, 4, logprobs=5)
    narrow = program("speculative", SPECULATIVE, 4, 4, width=1)
    wide = program("speculative", SPECULATIVE, 4, 4, width=4)  # same B and P, another W
    wide_twin = program("speculative_logprobs", SPECULATIVE, 4, 4, width=4, logprobs=5)
    twins = logprob_twins([decode, decode_twin, narrow, wide, wide_twin])
    assert twins == {variant_name(decode): decode_twin, variant_name(wide): wide_twin}
    assert not speculates_with_logprobs([decode, decode_twin, narrow, wide, wide_twin], 5)  # the narrow one has none
    assert speculates_with_logprobs([decode, decode_twin, wide, wide_twin], 5)
    assert not speculates_with_logprobs([decode, decode_twin], 5)  # nothing speculates
    assert not speculates_with_logprobs([decode, decode_twin, wide, wide_twin], 6)  # fewer alternatives than asked


def test_plain_programs_alike_in_capacities_and_inputs_get_no_twin():
    """Two SPECULATIVE graphs of one capacity that differ in their length source (exact lengths and
    device-allocated prefixes, as the example contract declares) each pair with their own twin, in any
    order; two plain graphs alike in everything pairing sees get none (the later one's twin was taken
    for both, whatever it computes)."""
    allocating, exact = (spb.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT, spb.VALUE_SOURCE_QUERY_LENGTH)
    confident = program("speculate_confident", SPECULATIVE, 4, 8, width=4, source=allocating)
    confident_twin = program("speculate_confident_logprobs", SPECULATIVE, 4, 8, width=4, logprobs=5, source=allocating)
    w4 = program("speculate_w4", SPECULATIVE, 4, 8, width=4, source=exact)
    w4_twin = program("speculate_w4_logprobs", SPECULATIVE, 4, 8, width=4, logprobs=5, source=exact)
    twins = logprob_twins([confident, w4, w4_twin, confident_twin])
    assert twins == {variant_name(confident): confident_twin, variant_name(w4): w4_twin}
    decode = program("decode", DECODE, 4, 4, inputs=("a",))
    host_fed = program("decode_host_fed", DECODE, 4, 4, inputs=("a",))
    twin = program("decode_logprobs", DECODE, 4, 4, logprobs=5, inputs=("a",))
    assert logprob_twins([decode, host_fed, twin]) == {}
    other = program("decode_host_fed", DECODE, 4, 4, inputs=("a", "pending"))
    assert logprob_twins([decode, other, twin]) == {variant_name(decode): twin}


def test_every_emitted_token_of_a_speculative_lane_gets_its_position_values():
    inf = float("-inf")
    chosen = torch.tensor([[-0.5, -0.25, -1.0], [-2.0, inf, inf], [inf, inf, inf], [-0.75, -1.5, inf]])
    top_ids = torch.arange(4 * 3 * 2).reshape(4, 3, 2)
    top_values = -top_ids.to(torch.float32) / 8
    results = (RowResult(0, 1, 10, (7, 8, 9), 3, 2), RowResult(1, 1, 5, (3,), 3, 0), RowResult(2, 1, 4, ()),
               RowResult(3, 1, 6, (1, 2), 2, 1))
    out = with_token_logprobs(results, [2, 1, 2, None], (chosen, top_ids, top_values))
    expected = tuple(TokenLogprobs(chosen[0, j].item(), ((2 * j, -2 * j / 8), (2 * j + 1, -(2 * j + 1) / 8)))
                     for j in range(3))  # position j: its chosen value, ids 2j and 2j + 1 first
    assert out[0].logprobs == expected
    assert out[1].logprobs == (TokenLogprobs(-2.0, ((6, -6 / 8),)),)  # one token: the first position's values
    assert out[2].logprobs is None and out[3].logprobs is None  # emits nothing; asks for nothing
    assert out[0]._replace(logprobs=None) == results[0]


def test_a_row_program_scores_its_one_token():
    scores = (torch.tensor([-0.5, -1.0]), torch.tensor([[4, 5], [6, 7]]), torch.tensor([[-0.5, -1.5], [-1.0, -2.0]]))
    out = with_token_logprobs((RowResult(0, 1, 3, (4,)), RowResult(1, 1, 3, ())), [1, 2], scores)
    assert out[0].logprobs == (TokenLogprobs(-0.5, ((4, -0.5),)),) and out[1].logprobs is None
    assert math.isinf(with_token_logprobs((RowResult(0, 1, 3, (4,)),), [0], (torch.tensor([-math.inf]),) + tuple(
        t[:1] for t in scores[1:]))[0].logprobs[0].logprob)
