"""The compiled CPU greedy sampling kernel (`helios.runtime.loading.greedy_kernel`): where it
decides, the tokens are the replaced body's bit for bit (ties, unchosen rows, vocabularies not a
multiple of the vector width or of 32, strided parameter columns); a drawing, penalised or
restricted chosen row and a non-finite maximum in any row leave the decision to that body; compiled
programs point their sampling calls at it."""

from __future__ import annotations

import pytest
import torch

from helios.abi import cpu_bodies, sampling
from helios.runtime.loading.greedy_kernel import bind_greedy_sampling, build_kernel, greedy_sample
from abi.test_sampling_cpu import _awkward_logits, _inputs

ROWS = torch.tensor([True, False, True, True, True, False, True, True])


def _args(inputs: dict, rows=ROWS) -> list:
    return [inputs[name] for name in ("logits", "seeds", "counters", "temperature", "top_k", "top_p", "min_p",
                                      "penalties", "prompt_counts", "output_counts", "grammar_mask", "mask_rows")] + [rows]


def _strided_parameters(inputs: dict) -> dict:
    """temperature and penalties as columns of one [R, 7] parameter table (as the runtime packs them)."""
    table = torch.zeros(inputs["temperature"].shape[0], 7)
    table[:, 0], table[:, 1:4] = inputs["temperature"], inputs["penalties"]
    return dict(inputs, temperature=table[:, 0], penalties=table[:, 1:4])


def _decided(inputs: dict, rows=ROWS) -> tuple[torch.Tensor, bool]:
    """(the kernel body's tokens, whether the kernel decided them), checked against `sample_rows`."""
    statuses = []
    kernel = build_kernel()

    def spy(*args):
        kernel(*args)
        statuses.append(int(args[1][0]))
    got = greedy_sample(spy, cpu_bodies.sample_rows)(*_args(inputs, rows))
    assert torch.equal(got, cpu_bodies.sample_rows(*_args(inputs, rows)))
    return got, statuses == [0]


@pytest.mark.parametrize("vocab", [7, 64, 70, 1000])
def test_where_the_kernel_decides_its_tokens_are_the_bodys(vocab):
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 4, (8, vocab), generator=generator).float()  # many ties at the maximum
    logits[5] = -1.0
    for inputs in (_inputs(logits, seed=1), _strided_parameters(_inputs(logits, seed=1))):
        got, decided = _decided(inputs)
        assert decided and (got[~ROWS] == sampling.NO_TOKEN).all()
        assert int(got[2]) == int(torch.argmax(logits[2]))  # torch's argmax: the lowest id of the maximum


def test_a_late_maximum_of_a_large_vocabulary_is_found_with_its_lowest_id():
    logits = torch.randn(8, 32003, generator=torch.Generator().manual_seed(5))
    logits[0, 31999] = logits[0, 32002] = 50.0  # ties in the last vector and the tail
    logits[2, 32001] = 60.0  # in the tail
    logits[3, 17] = logits[3, 16001] = 70.0
    got, decided = _decided(_inputs(logits, seed=5))
    assert decided and got[0] == 31999 and got[2] == 32001 and got[3] == 17


@pytest.mark.parametrize("case", ["drawing", "penalised", "nan penalty", "restricted", "nan logit", "inf logit",
                                  "all -inf", "unchosen nan"])
def test_what_the_kernel_does_not_decide_the_body_decides(case):
    inputs = _inputs(torch.randn(8, 70, generator=torch.Generator().manual_seed(2)), seed=2)
    if case == "drawing":
        inputs["temperature"][3] = 0.7
    elif case == "penalised":
        inputs["penalties"][2] = torch.tensor([1.0, 0.0, 0.5])
    elif case == "nan penalty":
        inputs["penalties"][2, 0] = float("nan")
    elif case == "restricted":
        inputs["grammar_mask"][4, 1] = 0  # ids 32..63 disallowed on a chosen masked row
    elif case == "nan logit":
        inputs["logits"][2, 9] = float("nan")
    elif case == "inf logit":
        inputs["logits"][6, 1] = float("inf")
    elif case == "all -inf":
        inputs["logits"][3] = float("-inf")
    elif case == "unchosen nan":
        inputs["logits"][1, 3] = float("nan")  # a row no one samples still holds a non-finite maximum
    _, decided = _decided(inputs)
    assert not decided


@pytest.mark.parametrize("case", ["unchosen drawing", "unchosen restricted", "unmasked restriction",
                                  "nan temperature", "bits past the vocabulary"])
def test_rows_that_cannot_change_a_greedy_token_leave_the_decision_to_the_kernel(case):
    inputs = _inputs(_awkward_logits(8, 70, seed=4)[:, :].clamp(-5, 5).nan_to_num(0.0), seed=4)
    if case == "unchosen drawing":
        inputs["temperature"][1] = 0.9
    elif case == "unchosen restricted":
        inputs["grammar_mask"][5, 0] = 0
    elif case == "unmasked restriction":
        inputs["grammar_mask"][2, 0], inputs["mask_rows"][2] = 0, False
    elif case == "nan temperature":
        inputs["temperature"][2] = float("nan")  # compares false: greedy, as the body has it
    elif case == "bits past the vocabulary":
        inputs["grammar_mask"][:, 2] = 0x3F  # ids 64..69 allowed, the bits past 70 clear
    _, decided = _decided(inputs)
    assert decided


def test_compiled_programs_point_their_sampling_calls_at_the_kernel():
    graph = torch.fx.Graph()
    args = [graph.placeholder(f"a{i}") for i in range(14)]
    graph.call_function(cpu_bodies.sample_rows_gathering, tuple(args))
    graph.call_function(cpu_bodies.sample_rows, tuple(args[:13]))
    graph.output(None)
    assert bind_greedy_sampling(graph, build_kernel()) == 2
    assert [n.target.__name__ for n in graph.nodes if n.op == "call_function"] == ["greedy_sample_kernel"] * 2
