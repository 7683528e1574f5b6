"""The greedy graph's sampling call reads counts through the slots (`helios.runtime.loading.sampling_rewrite`).

A tiny random Llama core is loaded the way a CUDA model builds its programs (the exported graph,
without the CPU rewrites); each program's greedy variant (`greedy_module`) is checked to call
`greedy_rows` on the count tables and to gather no [R, V] counts, and a stand-in "captured"
executor that replays the eager module (full) and its greedy variant serves greedy requests -
plain, penalised, with a logit bias, fewer than a program's rows (padding rows), with one and two
execution frames - with exactly the CPU path's tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

import helios.runtime.loading.programs as program_loading
import helios.runtime.service as service
from helios.abi.sampling import NEUTRAL_SAMPLING_PARAMETERS, SampleVariant, split_sampling_parameters
from helios.abi.sampling_rows import greedy_rows, greedy_rows_biased
from helios.core.keys import SigningKey, load_signing_key, write_key_pair
from helios.core.reader import open_core
from helios.ignition.tensor_parallel import with_logit_bias
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.engine import EngineRequest
from helios.runtime.execution.executor import GraphExecutor
from helios.runtime.execution.packer import Packer
from helios.runtime.loading.cuda_graphs import CapturedProgram, greedy_module, variant_module
from helios.runtime.loading.model import program_arguments
from helios.runtime.loading.sampling_rewrite import bind_greedy_rows
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import GREEDY, SamplingParams
from helios.runtime.service import build_runtime
from ignition.hf_checkpoints import LLAMA3
from support.chat_checkpoint import VOCAB_SIZE, write_chat_checkpoint
from support.shared_prepare import prepared_once, shared_root

NAMESPACE = "test.helios/greedy-rows"
_CHOOSER = random.Random(3)
PROMPTS = [[_CHOOSER.randrange(3, 300) for _ in range(n)] for n in (1, 6, 19, 3, 40)]
MAX_TOKENS = 10
PENALISED = SamplingParams(repetition_penalty=1.4, presence_penalty=0.3, frequency_penalty=0.2)
# Per request: sampling parameters and logit bias.
REQUESTS = [(GREEDY, ()), (PENALISED, ()), (GREEDY, ()), (GREEDY, ((5, 30.0), (7, -2.0))), (PENALISED, ())]
_INDEX = torch.ops.aten.index.Tensor


class _Replayed(CapturedProgram):
    """A captured program's stand-in: the eager module and its greedy variant, run on the
    recorded arguments whatever the call passes."""

    def __init__(self, module, arguments):
        self.module, self.greedy, self.arguments = module, greedy_module(module), arguments
        self.replays = {True: 0, False: 0}

    def replay(self, greedy: bool, fresh: bool = False):
        self.replays[greedy] += 1
        return (self.greedy if greedy else self.module)(*self.arguments)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def core_path(tmp_path_factory, request):
    """A float32 core (the greedy graph adds the bias to the float32 logits in place) and a bfloat16
    one (it samples the head's product: `greedy_rows_biased`)."""
    return greedy_rows_core(tmp_path_factory.getbasetemp(), request.param)


def greedy_rows_core(base, dtype: str):
    """(core path, signing key) of the tiny Llama 3 core of `dtype` (128 tokens of context, 16-token
    prompt steps, decode batches 1 and 8, token-logprobs twins), prepared once per test run under
    `base`'s shared root (test_step_calls, test_fresh_calls and test_capture_plan_copies use the same
    cores; xdist workers share them)."""
    root = shared_root(base) / f"greedy-rows-{dtype}"
    path = root / "model.core"

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        key = SigningKey.generate()
        write_key_pair(root / "publisher.key", key, [NAMESPACE])
        checkpoint = write_chat_checkpoint(LLAMA3, root / "checkpoint", seed=9)
        plan = CapacityPlan(context_tokens=128, prefill_tokens=16, decode_batches=(1, 8))
        scratch = root / "model.core.partial"
        prepare_core(checkpoint, scratch, key, PrepareOptions(NAMESPACE, capacities=plan, dtype=dtype))
        scratch.rename(path)

    prepared_once(root, path, prepare)
    return path, load_signing_key(root / "publisher.key")


def _runtime(core_path):
    path, key = core_path
    return build_runtime(open_core(path, accept=NAMESPACE, trusted_keys=[key.public]))


_REFERENCES: dict = {}  # core path -> the CPU path's tokens of the requests


def reference_tokens(core_path) -> list[list[int]]:
    """The requests' tokens on the CPU path of a fresh runtime with one frame (two frames give the same:
    tests/runtime/test_two_frames_runtime.py), served once per core and process."""
    path, _ = core_path
    if path not in _REFERENCES:
        runtime = _runtime(core_path)
        try:
            _REFERENCES[path] = _serve(runtime, 1)
        finally:
            runtime.close()
    return _REFERENCES[path]


def _serve(runtime, frames: int) -> list[list[int]]:
    runtime.engine.frames = frames
    tokens: dict[str, list[int]] = {}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            tokens[event.request_id].extend(event.token_ids)

    for index, (prompt, (sampling, bias)) in enumerate(zip(PROMPTS, REQUESTS)):
        tokens[f"r{index}"] = []
        spec = RequestSpec(f"r{index}", tuple(prompt), MAX_TOKENS, sampling=sampling, logit_bias=bias)
        runtime.engine.submit(EngineRequest(spec, record))
    runtime.engine.run_until_idle()
    return [tokens[f"r{index}"] for index in range(len(PROMPTS))]


def _exported_runtime(core_path, monkeypatch, replayed=_Replayed):
    """The runtime with the programs a CUDA model builds (no CPU rewrites), replayed eagerly by
    `replayed` (a captured program's stand-in), and its per-step values packed into per-frame
    mirrors as a device model's are."""
    monkeypatch.setattr(program_loading, "cpu_program", lambda module: module)
    monkeypatch.setattr(service, "Packer", functools.partial(Packer, staged=True))
    runtime = _runtime(core_path)
    executor, model = runtime.engine.executor, runtime.engine.executor.model
    programs = {
        name: dataclasses.replace(p, module=replayed(p.module, program_arguments(p, model.weights, model.buffers)))
        for name, p in executor._programs.items()
    }
    runtime.engine.executor = GraphExecutor(model, executor.packer, programs)
    return runtime, programs


def _widens_a_product(module) -> bool:
    """Whether `module` widens a bfloat16 [R, V] product to the float32 logits it samples."""
    return any(n.target is torch.ops.aten.to.dtype and n.args[1] == torch.float32
               and n.args[0].meta["val"].dtype == torch.bfloat16 and n.meta["val"].shape[-1] == VOCAB_SIZE
               for n in module.graph.nodes if n.op == "call_function")


def _gathers(module) -> list:
    return [n for n in module.graph.nodes if n.op == "call_function" and n.target is _INDEX
            and n.args[0].op == "placeholder" and n.args[0].target in ("prompt_counts", "output_counts")]


def test_greedy_graphs_read_counts_through_the_slots(core_path, monkeypatch, request):
    runtime, programs = _exported_runtime(core_path, monkeypatch)
    bfloat16 = request.node.callspec.params["core_path"] == "bfloat16"
    try:
        for program in programs.values():
            full, greedy = program.module.module, program.module.greedy
            calls = [n for n in greedy.graph.nodes if n.op == "call_function"]
            rows = [n for n in calls if n.target in (greedy_rows, greedy_rows_biased)]
            assert len(rows) == 1, program.graph
            # A token-logprobs variant (no greedy graph is captured for it) scores with the gathers.
            assert len(_gathers(full)) == 2 and len(_gathers(greedy)) == (2 if program.token_logprobs else 0)
            slots = rows[0].args[4 if rows[0].target is greedy_rows else 6]
            assert slots.op == "placeholder" and slots.target == "request_slots"
            if program.token_logprobs:
                continue
            # a bfloat16 core's greedy graph samples the head's product: no float32 logits, no biased copy
            widened = _widens_a_product(full)
            assert widened == bfloat16 and (rows[0].target is greedy_rows_biased) == widened, program.graph
            assert not _widens_a_product(greedy)
            if widened:
                assert torch.ops.aten.scatter_add.default not in {n.target for n in calls}
            assert bind_greedy_rows(greedy.graph) == 0  # nothing left to rewrite
    finally:
        runtime.close()


@pytest.mark.parametrize("frames", [1, 2])
def test_greedy_graphs_give_the_cpu_path_tokens(core_path, monkeypatch, frames):
    expected = reference_tokens(core_path)
    assert all(len(tokens) == MAX_TOKENS for tokens in expected)
    runtime, programs = _exported_runtime(core_path, monkeypatch)
    try:
        assert _serve(runtime, frames) == expected
        assert sum(p.module.replays[True] for p in programs.values()) > MAX_TOKENS  # the greedy graphs ran
        if frames == 2:
            assert runtime.engine.stats.second_frames > 0
    finally:
        runtime.close()


def test_graphs_without_the_pattern_are_left_alone():
    """A sampling call whose counts are not gathered through clamped slots keeps its call."""

    class Direct(torch.nn.Module):
        def forward(self, logits, seeds, counters, params, penalties, prompt, output, mask, rows):
            return torch.ops.helios.sample(logits, seeds, counters, params[:, 0], params[:, 1].to(torch.int32),
                                           params[:, 2], params[:, 3], penalties, prompt, output, mask, rows)

    rows, vocab = 2, 40
    inputs = (torch.randn(rows, vocab), torch.zeros(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64),
              torch.zeros(rows, 4), torch.ones(rows, 3), torch.zeros(rows, vocab, dtype=torch.int32),
              torch.zeros(rows, vocab, dtype=torch.int32), torch.full((rows, 2), -1, dtype=torch.int32),
              torch.ones(rows, dtype=torch.bool))
    module = torch.export.export(Direct(), inputs, strict=False).module()
    bound = variant_module(module, SampleVariant.GREEDY)
    assert bind_greedy_rows(bound.graph) == 0
    assert torch.equal(greedy_module(module)(*inputs), module(*inputs))


def test_a_call_whose_tokens_escape_unmasked_is_left_alone():
    """The tail of a program that reads the tokens of rows that do not sample (as a speculative
    program's draws may): the counts are gathered as usual, but the call keeps its padding rows'
    tokens, so nothing is rewritten."""
    inputs = _sampler_inputs()
    module = torch.export.export(_Sampler(), inputs, strict=False).module()
    for node in module.graph.nodes:  # expose the sampled tokens themselves as an extra output
        if node.op == "output":
            sample = next(n for n in module.graph.nodes if n.op == "call_function" and "sample" in str(n.target))
            node.args = ((*node.args[0], sample),)
    module.recompile()
    bound = variant_module(module, SampleVariant.GREEDY)
    assert bind_greedy_rows(bound.graph) == 0


class _Sampler(torch.nn.Module):
    """The sampling tail of a program (`helios.ignition.program.GenerationProgram.sample`): logits
    of the rows, the logit bias of their slots added out of place, counts gathered at the slots."""

    def forward(self, scores, request_slots, bias_ids, bias_values, params, prompt_counts, output_counts,
                grammar_mask, seeds, sample_rows):
        logits = scores.to(torch.float32)  # the head's output widened, as a program does
        slots = request_slots.clamp(min=0)
        biased = with_logit_bias(logits, bias_ids[slots], bias_values[slots])
        temperature, top_k, top_p, min_p, penalties = split_sampling_parameters(params)
        allow = torch.ones_like(sample_rows)
        sampled = torch.ops.helios.sample(biased, seeds, seeds, temperature, top_k, top_p, min_p, penalties,
                                          prompt_counts[slots], output_counts[slots], grammar_mask, allow)
        return torch.where(sample_rows, sampled, torch.full_like(sampled, -1)), logits


def _sampler_inputs(rows: int = 6, vocab: int = 300, slots: int = 4, width: int = 5, dtype=torch.bfloat16):
    generator = torch.Generator().manual_seed(2)
    scores = (torch.randn(rows, vocab, generator=generator) * 4).to(dtype)
    request_slots = torch.tensor([2, 0, 3, 1, -1, -1][:rows])
    bias_ids = torch.full((slots, width), -1, dtype=torch.int64)
    bias_ids[0, :3] = torch.tensor([0, 17, 250])  # id 0 biased too: padding entries clamp to 0 as well
    bias_ids[3, :2] = torch.tensor([5, 6])
    bias_values = torch.where(bias_ids >= 0, torch.randn(slots, width, generator=generator) * 40, 0.0)
    params = torch.tensor([NEUTRAL_SAMPLING_PARAMETERS] * rows)
    params[1, 4:] = torch.tensor([1.5, 0.5, 0.25])  # row 1 (slot 0) penalised
    counts = [(torch.rand(slots, vocab, generator=generator) < 0.1).to(torch.int32) * 2 for _ in range(2)]
    mask = torch.full((rows, -(-vocab // 32)), -1, dtype=torch.int32)
    return (scores, request_slots, bias_ids, bias_values, params, *counts, mask,
            torch.zeros(rows, dtype=torch.int64), request_slots >= 0)


def test_the_bias_is_added_in_place_and_the_logits_stay_unbiased():
    """Float32 logits: the greedy graph adds the bias to them in place and puts it back."""
    inputs = _sampler_inputs(dtype=torch.float32)
    module = torch.export.export(_Sampler(), inputs, strict=False).module()
    plain = variant_module(module, SampleVariant.GREEDY)
    rewritten = greedy_module(module)
    targets = [n.target for n in rewritten.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.scatter_add.default not in targets and torch.ops.aten.scatter_add_.default in targets
    assert greedy_rows in targets and not _gathers(rewritten) and len(_gathers(plain)) == 2
    (expected, logits), (got, got_logits) = plain(*inputs), rewritten(*inputs)
    assert torch.equal(got, expected) and (got[inputs[1] < 0] == -1).all()
    assert torch.equal(got_logits, logits)  # unbiased, bit for bit
    unbiased = inputs[0].float().argmax(dim=-1).tolist()
    assert expected.tolist()[1] != unbiased[1] or expected.tolist()[2] != unbiased[2]  # the bias counts


def test_a_bfloat16_product_is_sampled_without_its_float32_copies():
    """The head's bfloat16 product: the greedy graph samples it with the bias added in the kernel's
    combine (`greedy_rows_biased`), makes neither float32 copy, and returns the product as its
    logits: the float32 logits' values before widening."""
    inputs = _sampler_inputs()
    module = torch.export.export(_Sampler(), inputs, strict=False).module()
    plain = variant_module(module, SampleVariant.GREEDY)
    rewritten = greedy_module(module)
    targets = [n.target for n in rewritten.graph.nodes if n.op == "call_function"]
    assert greedy_rows_biased in targets and greedy_rows not in targets and not _gathers(rewritten)
    assert not {torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default} & set(targets)
    assert not [n for n in rewritten.graph.nodes if n.target is torch.ops.aten.to.dtype and n.args[0].name == "scores"]
    (expected, logits), (got, got_logits) = plain(*inputs), rewritten(*inputs)
    assert torch.equal(got, expected) and (got[inputs[1] < 0] == -1).all()
    assert got_logits.dtype == torch.bfloat16 and torch.equal(got_logits.float(), logits)
    unbiased = inputs[0].float().argmax(dim=-1).tolist()
    assert expected.tolist()[1] != unbiased[1] or expected.tolist()[2] != unbiased[2]  # the bias counts


def test_a_product_read_elsewhere_keeps_its_float32_logits():
    """A widened product the graph reads elsewhere too (not only the sampling and the output) keeps
    the float32 logits and the in-place bias."""
    inputs = _sampler_inputs()

    class Scored(_Sampler):
        def forward(self, scores, request_slots, bias_ids, bias_values, params, prompt_counts, output_counts,
                    grammar_mask, seeds, sample_rows):
            tokens, logits = super().forward(scores, request_slots, bias_ids, bias_values, params, prompt_counts,
                                             output_counts, grammar_mask, seeds, sample_rows)
            return tokens, logits, logits.sum(dim=-1)

    module = torch.export.export(Scored(), inputs, strict=False).module()
    targets = [n.target for n in greedy_module(module).graph.nodes if n.op == "call_function"]
    assert greedy_rows in targets and greedy_rows_biased not in targets
    assert torch.ops.aten.scatter_add_.default in targets
