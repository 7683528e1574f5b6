"""Programs captured on the CPU run on a CUDA device once moved there (device machine only)."""

from __future__ import annotations

import pytest
import torch
from torch.export.passes import move_to_device_pass

from helios.abi.program_image import decode_program
from helios.ignition.program_spec import Operation

from .conftest import ALL_OPERATIONS
from .driver import PagedModel, Sequence, generate
from .hf_checkpoints import GEMMA2, GEMMA3, MISTRAL
from .test_equivalence import NEW_TOKENS, assert_matches_reference, random_prompt


@pytest.mark.gpu
# Gemma 3: gelu_tanh_mul; Gemma 2: helios::paged_attention_softcap's Triton kernels (prefill, decode, tuned)
@pytest.mark.parametrize("family", [MISTRAL, GEMMA3, GEMMA2], ids=lambda family: family.name)
def test_moved_programs_generate_the_reference_tokens_on_cuda(prepare, family):
    prepared = prepare(family, ALL_OPERATIONS)
    programs = {}
    for operation, captured in prepared.captured.items():
        program = move_to_device_pass(decode_program(captured.program), "cuda")
        programs[operation] = (captured.spec, program.module())
    model = PagedModel(prepared.recipe.weight_tensors, programs, device="cuda")
    prompts = [random_prompt(11, seed=9), random_prompt(6, seed=10)]
    sequences = [Sequence(slot, list(prompt)) for slot, prompt in enumerate(prompts)]
    generate(model, sequences, NEW_TOKENS, chunk=8, arrivals=[0, 2])
    assert model.state["k_cache"].is_cuda and {Operation.MIXED, Operation.DECODE} <= set(model.operations_run)
    for sequence, prompt in zip(sequences, prompts):
        assert_matches_reference(prepared, sequence, prompt)
