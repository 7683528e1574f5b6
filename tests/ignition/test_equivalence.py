"""Exported, saved and re-loaded programs against Hugging Face transformers on the same weights.

For every family (float32): logits within 1e-4 relative error and greedy tokens identical to
`generate(do_sample=False)`: 32 for a continuously batched set of prompts of different lengths, 16 for a
prompt whose prefix pages were written earlier; 16 for a single prompt (PREFILL then DECODE) for the
EVERY_PROGRAM families and scored log-probabilities within 1e-4 for the SCORED families (every family
with HELIOS_EQUIVALENCE_SWEEP=1).
"""

from __future__ import annotations

from typing import Mapping

import pytest
import torch

from helios.ignition.architecture import Architecture, weight_layout
from helios.ignition.capture import build_program
from helios.ignition.program_spec import Operation, program_spec
from support.sweeps import swept

from .conftest import ALL_OPERATIONS, CHECK_OPERATIONS, PAGE_TOKENS, VARIANTS
from .driver import PagedModel, RowWork, Sequence, generate
from .hf_checkpoints import FAMILIES

# The batch's prompts of up to 14 tokens and 32 new tokens reach position 45: past every family's window
# (at most 8), chunk (Llama 4's 8, the Mamba scans' 8) and Ministral 3's temperature step (16) at least
# twice. Scaled ropes (llama3, yarn, linear) rotate by position alone; LongRoPE's long factors and positions
# past an original context are test_phi3_recipe's and test_long_positions' own checks. The single prompt
# (PREFILL then DECODE) and the cached-prefix prompt (a suffix prefill) check their path with SHORT_TOKENS,
# still past every window and chunk (positions 28 and 29).
NEW_TOKENS = 32
SHORT_TOKENS = 16
TOLERANCE = 1e-4


# The families whose checks take the PREFILL and DECODE programs too (every program of VARIANTS); the
# others, like a family module's FamilyChecks, run every step through MIXED. A program's operation changes the
# decoder in two places only: latent attention up-projects a prompt's context in PREFILL (DeepSeek), and
# PREFILL / MIXED leave the last layer's other rows out past attention; windows bind their own region in every
# program (gpt-oss's sliding layers beside full ones, with sinks, as Qwen2's mixed layers do).
# HELIOS_EQUIVALENCE_SWEEP=1 runs every family's PREFILL and DECODE programs: the MoE and q/k-norm bodies and
# Qwen2's windows they add are the same modules MIXED runs (Llama 3 covers the plain path's programs).
EVERY_PROGRAM = {"llama3", "deepseek", "gpt_oss"}
# The families whose scored check runs by default (their SCORED_PREFILL program captured): a scoring program runs
# the family's decoder as MIXED does (every family's generation checks here), then scores every row with the
# logits; these three score through dense, latent with mixture layers, and sink and window with mixture layers
# decoders (the EVERY_PROGRAM families: their SCORED_PREFILL is among the programs they capture anyway).
# HELIOS_EQUIVALENCE_SWEEP=1 scores every family (Mixtral's mixture layers: DeepSeek's and gpt-oss's score by
# default); test_config_fuzz scores every drawn family group's eager program.
SCORED = {"llama3", "deepseek", "gpt_oss"}
SCORED_FAMILIES = tuple(family for family in FAMILIES if family.name in SCORED or swept("HELIOS_EQUIVALENCE_SWEEP"))
# The single-prompt check runs PREFILL then DECODE where a family has them (EVERY_PROGRAM); the other families'
# single prompt would run every step through MIXED, as each prompt of their continuous batch check does (as in
# FamilyChecks), so they run it with HELIOS_EQUIVALENCE_SWEEP=1.
SINGLE_FAMILIES = tuple(family for family in FAMILIES
                        if family.name in EVERY_PROGRAM or swept("HELIOS_EQUIVALENCE_SWEEP"))


def operations(family) -> tuple[Operation, ...]:
    """What `family`'s checks here capture: see EVERY_PROGRAM and SCORED."""
    if family.name in EVERY_PROGRAM or swept("HELIOS_EQUIVALENCE_SWEEP"):
        return ALL_OPERATIONS
    return CHECK_OPERATIONS if family.name in SCORED else (Operation.MIXED,)


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param, operations(request.param))


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def random_prompt(length: int, seed: int, vocab_size: int = 128) -> list[int]:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference_last_logits(prepared, prompt: list[int]) -> torch.Tensor:
    """transformers' logits at the last position of `prompt` [V]."""
    with torch.no_grad():
        return prepared.reference(torch.tensor([prompt])).logits[0, -1]


def prefill_logits(arch: Architecture, weights, prompt: list[int]) -> torch.Tensor:
    """The logits at the last position of one PREFILL of `prompt` by `arch`'s program with `weights`
    (its layout's tensors, in order), built eagerly: no export needed here [V]."""
    capacity = dict(VARIANTS)[Operation.PREFILL]
    spec = program_spec(arch, Operation.PREFILL, capacity, PAGE_TOKENS)
    model = PagedModel(weights, {Operation.PREFILL: (spec, build_program(arch, Operation.PREFILL, PAGE_TOKENS))})
    sequence = Sequence(0, list(prompt))
    model.admit(sequence, len(prompt))
    return model.run(Operation.PREFILL, [RowWork(sequence, tuple(prompt), 0, sample=True)])["logits"][0]


def assert_change_matters(prepared, prompt: list[int], arch: Architecture | None = None, weights=None) -> None:
    """The prepared recipe's prefill logits of `prompt` are the reference's within TOLERANCE, and with `arch`
    and / or `weights` in place of the prepared ones (a switch turned off, tensors reordered or swapped) they
    are more than ten times TOLERANCE off: what was changed matters."""
    recipe = prepared.recipe
    expected = reference_last_logits(prepared, prompt)
    assert relative_error(prefill_logits(recipe.architecture, recipe.weight_tensors, prompt), expected) < TOLERANCE
    changed = prefill_logits(arch or recipe.architecture, recipe.weight_tensors if weights is None else weights, prompt)
    assert relative_error(changed, expected) > 10 * TOLERANCE


def layout_tensors(recipe, arch: Architecture) -> list[torch.Tensor]:
    """The recipe's weight tensors that `arch`'s layout names, in order (for an `arch` with a switch
    turned off that drops slots)."""
    names = {slot.name for slot in weight_layout(arch)}
    return [w.tensor for w in recipe.weights if w.name in names]


def with_checkpoint_qk_order(recipe, layout: torch.Tensor) -> list[torch.Tensor]:
    """The recipe's weight tensors with each head's q/k rows (qkv weights and biases) put back from
    `layout` (a head's row order: `helios.ignition.recipes.glm4.rotary_layout`) into the checkpoint's
    order, for a check that the layout matters."""
    arch, inverse, head_dim = recipe.architecture, torch.argsort(layout), len(layout)
    unordered = []
    for w in recipe.weights:
        tensor = w.tensor
        if w.name.startswith("layers.") and w.name.endswith(("qkv.weight", "qkv.bias")):
            q, k, v = tensor.split([arch.q_size, arch.kv_size, arch.kv_size])
            q, k = (x.reshape(-1, head_dim, *x.shape[1:])[:, inverse].reshape(x.shape) for x in (q, k))
            tensor = torch.cat((q, k, v))
        unordered.append(tensor)
    return unordered


def assert_two_rank_shares(recipe, rows: Mapping[str, int] | None = None, columns: Mapping[str, int] | None = None,
                           whole: tuple[str, ...] = ()) -> None:
    """Each of two ranks' weights (`helios.ignition.sharding.rank_weights`) holds its share of the
    `rows` tensors (rank r: rows r * width to (r + 1) * width, width the value), its share of the
    `columns` tensors' columns likewise, and the `whole` tensors whole."""
    from helios.ignition.sharding import rank_weights

    full = dict(recipe.weights)
    for rank in range(2):
        cut = dict(rank_weights(recipe, 2, rank))
        for name, width in (rows or {}).items():
            assert torch.equal(cut[name], full[name][rank * width:(rank + 1) * width]), (name, rank)
        for name, width in (columns or {}).items():
            assert torch.equal(cut[name], full[name][:, rank * width:(rank + 1) * width]), (name, rank)
        for name in whole:
            assert torch.equal(cut[name], full[name]), (name, rank)


def reference_greedy(model, prompt: list[int], new_tokens: int = NEW_TOKENS) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation of `prompt` (`new_tokens`) and the logits behind each token [n, V]."""
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    assert len(tokens) == new_tokens
    return tokens, torch.cat(out.logits)


def assert_matches_reference(prepared, sequence: Sequence, prompt: list[int]) -> None:
    """`sequence`'s greedy tokens (as many as it generated) and their logits are the reference's."""
    assert sequence.generated
    tokens, logits = reference_greedy(prepared.reference, prompt, len(sequence.generated))
    assert sequence.generated == tokens
    assert relative_error(torch.stack(sequence.logits), logits) < TOLERANCE


@pytest.mark.parametrize("prepared", SCORED_FAMILIES, indirect=True, ids=lambda family: family.name)
def test_scored_prefill_logits_and_logprobs_match(prepared):
    prompts = [random_prompt(13, seed=1), random_prompt(9, seed=2)]
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequences = [Sequence(slot, list(prompt)) for slot, prompt in enumerate(prompts)]
    rows = []
    for sequence, prompt in zip(sequences, prompts):
        model.admit(sequence, len(prompt))
        rows.append(RowWork(sequence, tuple(prompt), 0, sample=True, targets=tuple(prompt[1:]) + (7,)))
    outputs = model.run(Operation.SCORED_PREFILL, rows)
    start = 0
    for row, prompt in enumerate(prompts):
        with torch.no_grad():
            logits = prepared.reference(torch.tensor([prompt])).logits[0]
        targets = torch.tensor(prompt[1:] + [7])
        expected = torch.log_softmax(logits, dim=-1)[torch.arange(len(prompt)), targets]
        scored = outputs["target_logprobs"][start:start + len(prompt)]
        assert relative_error(scored, expected) < TOLERANCE
        assert relative_error(outputs["logits"][row], logits[-1]) < TOLERANCE
        assert outputs["sampled_ids"][row].item() == logits[-1].argmax().item()
        start += len(prompt)
    assert torch.all(outputs["target_logprobs"][start:] == 0)  # padding tokens score nothing


@pytest.mark.parametrize("prepared", SINGLE_FAMILIES, indirect=True, ids=lambda family: family.name)
def test_single_prompt_greedy_matches(prepared):
    prompt = random_prompt(13, seed=3)
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequence = Sequence(0, list(prompt))
    generate(model, [sequence], SHORT_TOKENS, chunk=16)
    assert model.operations_run[0] is model.variant(Operation.PREFILL)
    assert set(model.operations_run[1:]) == {model.variant(Operation.DECODE)}
    assert_matches_reference(prepared, sequence, prompt)


def test_continuous_batch_of_different_lengths_matches(prepared):
    prompts = [random_prompt(5, seed=4), random_prompt(14, seed=5), random_prompt(9, seed=6)]
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequences = [Sequence(slot, list(prompt)) for slot, prompt in enumerate(prompts)]
    generate(model, sequences, NEW_TOKENS, chunk=8, arrivals=[0, 0, 3])
    assert {model.variant(Operation.PREFILL), Operation.MIXED, model.variant(Operation.DECODE)} <= \
        set(model.operations_run)
    for sequence, prompt in zip(sequences, prompts):
        assert_matches_reference(prepared, sequence, prompt)


def test_prompt_continuing_from_cached_prefix_pages_matches(prepared):
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    first = Sequence(0, random_prompt(10, seed=7))
    model.admit(first, 10)
    model.run(model.variant(Operation.PREFILL), [RowWork(first, tuple(first.token_ids), 0, sample=False)])
    prompt = first.token_ids[:8] + random_prompt(6, seed=8)
    shared_pages = first.pages[:2]  # the two full pages of the common 8-token prefix
    # (and the same pages of the sliding layers' own region where the layers mix windows)
    second = Sequence(1, list(prompt), pages=list(shared_pages), window_pages=first.window_pages[:2], num_cached=8)
    generate(model, [second], SHORT_TOKENS, chunk=16)
    assert second.pages[:2] == shared_pages
    assert model.operations_run[1] is model.variant(Operation.PREFILL)  # only the 6-token suffix was prefilled
    assert_matches_reference(prepared, second, prompt)


class FamilyChecks:
    """The module's checks against transformers as methods, for a family's own test module:
    ``class TestAgainstTransformers(FamilyChecks)`` there runs them on that module's `prepared`
    fixture (one prepared checkpoint per module serves these and the module's own tests). With the
    default `prepare(family)` (MIXED captured) every generation step runs MIXED.

    The scored check (and the SCORED_PREFILL program `prepare` captures for it) and the single-prompt
    check run with HELIOS_EQUIVALENCE_SWEEP=1. A scoring program runs the family's decoder as MIXED does
    (the checks here), then scores every row with the family's logits; by default three of this module's
    families score through captured programs (dense, latent and sink and window layers, the latter two with
    mixture layers: SCORED),
    test_config_fuzz scores every drawn family group's eager program, and test_phi3_recipe scores past
    LongRoPE's context. With MIXED alone, a single prompt's prefill and decode steps are those the
    continuous batch check runs for each of its prompts."""

    if swept("HELIOS_EQUIVALENCE_SWEEP"):
        def test_scored_prefill_logits_and_logprobs_match(self, prepared):
            test_scored_prefill_logits_and_logprobs_match(prepared)

        def test_single_prompt_greedy_matches(self, prepared):
            test_single_prompt_greedy_matches(prepared)

    def test_continuous_batch_of_different_lengths_matches(self, prepared):
        test_continuous_batch_of_different_lengths_matches(prepared)

    def test_prompt_continuing_from_cached_prefix_pages_matches(self, prepared):
        test_prompt_continuing_from_cached_prefix_pages_matches(prepared)
