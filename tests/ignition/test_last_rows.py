"""Prompt programs (PREFILL, MIXED) run the last layer's output projection and MLP on each row's last
packed token only (`GenerationProgram.last_rows_only`): the same greedy tokens, logits to float
rounding and cache planes bit for bit as the programs that run the whole last layer, over chunked
prompts, rows joining mid-way, latent attention, experts, attention sinks and recurrent mixers; and
the left-out work is exactly the last layer's projections of the other tokens (the hybrid
decoder's: its last MLP's)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helios.ignition.capture import build_program
from helios.ignition.program_spec import Capacity, Operation, program_spec
from helios.ignition.recipes import load_checkpoint

from .driver import PagedModel, RowWork, Sequence, generate
from .hf_checkpoints import BAMBA, DEEPSEEK, GPT_OSS, LLAMA3, QWEN3_MOE, random_model, write_checkpoint

PROMPTS = ([3, 17, 101, 5, 9, 64, 2, 88, 41, 7, 30], [12, 4, 77, 31, 8, 19, 60], [45, 2, 90, 33, 21])


def paged_models(recipe):
    """(prompt programs leaving the other tokens out, the same programs running the whole last layer)."""
    arch = recipe.architecture
    capacities = {Operation.PREFILL: Capacity(4, 32), Operation.MIXED: Capacity(4, 32), Operation.DECODE: Capacity(4, 4)}
    programs = {op: (program_spec(arch, op, capacity, 4), build_program(arch, op, 4)) for op, capacity in capacities.items()}
    whole = {}
    for op, (spec, module) in programs.items():
        module = copy.copy(module)
        module.last_rows_only = False
        whole[op] = (spec, module)
    return PagedModel(recipe.weight_tensors, programs), PagedModel(recipe.weight_tensors, whole)


@pytest.fixture(scope="module", params=(LLAMA3, DEEPSEEK, GPT_OSS, QWEN3_MOE, BAMBA), ids=lambda f: f.name)
def recipe(request, tmp_path_factory):
    model = random_model(request.param)
    return load_checkpoint(write_checkpoint(model, tmp_path_factory.mktemp(request.param.name)))


def test_prompt_programs_sample_and_cache_as_the_whole_last_layer_does(recipe):
    last_rows, whole = paged_models(recipe)
    outputs = []
    for model in (last_rows, whole):
        sequences = [Sequence(slot, list(prompt)) for slot, prompt in enumerate(PROMPTS)]
        tokens = generate(model, sequences, 6, chunk=4, arrivals=[0, 1, 3])
        outputs.append((tokens, [torch.stack(s.logits) for s in sequences], model.state))
    assert {Operation.PREFILL, Operation.MIXED, Operation.DECODE} <= set(last_rows.operations_run)
    assert outputs[0][0] == outputs[1][0]
    for mine, theirs in zip(outputs[0][1], outputs[1][1]):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    for name, plane in outputs[0][2].items():
        assert torch.equal(plane, outputs[1][2][name]), name


def test_the_left_out_work_is_the_last_layers_projections_of_the_other_tokens(tmp_path):
    recipe = load_checkpoint(write_checkpoint(random_model(LLAMA3), tmp_path))
    arch = recipe.architecture
    flops = []
    for model in paged_models(recipe):
        first, second = Sequence(0, list(PROMPTS[0])), Sequence(1, list(PROMPTS[1]))
        for sequence in (first, second):
            model.admit(sequence, len(sequence.token_ids))
        rows = [RowWork(first, tuple(PROMPTS[0]), 0, sample=True), RowWork(second, tuple(PROMPTS[1][:5]), 0, sample=False)]
        with FlopCounterMode(display=False) as counter:
            model.run(Operation.PREFILL, rows)
        flops.append(counter.get_total_flops())
    spec = paged_models(recipe)[0].programs[Operation.PREFILL][0]
    packed, sampled_rows = spec.capacity.packed_token_capacity, spec.capacity.batch_capacity
    per_token = arch.q_size * arch.hidden_size + 3 * arch.hidden_size * arch.intermediate_size  # o, gate/up, down
    assert flops[1] - flops[0] == 2 * (packed - sampled_rows) * per_token


def test_the_hybrid_decoder_leaves_out_its_last_mlp_for_the_other_tokens(tmp_path):
    recipe = load_checkpoint(write_checkpoint(random_model(BAMBA), tmp_path))
    arch = recipe.architecture
    flops = []
    for model in paged_models(recipe):
        sequence = Sequence(0, list(PROMPTS[0]))
        model.admit(sequence, len(sequence.token_ids))
        with FlopCounterMode(display=False) as counter:
            model.run(Operation.PREFILL, [RowWork(sequence, tuple(PROMPTS[0]), 0, sample=True)])
        flops.append(counter.get_total_flops())
    spec = paged_models(recipe)[0].programs[Operation.PREFILL][0]
    packed, sampled_rows = spec.capacity.packed_token_capacity, spec.capacity.batch_capacity
    assert flops[1] - flops[0] == 2 * (packed - sampled_rows) * 3 * arch.hidden_size * arch.intermediate_size
