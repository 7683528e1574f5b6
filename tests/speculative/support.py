"""Speculative test support: truncated drafts, and runtimes over eager (uncaptured) programs.

`eager_runtime` declares the same contract and manifest as `helios prepare` would for a plan, but
calls the programs' eager modules instead of captured ones, so the real scheduler, packer, executor
and completion validation run without paying torch.export for every family and width. The
captured path is covered separately (test_capture.py, test_prepared_core.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from helios.contract import StartupOptions, resolve_settings
from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import weight_layout
from helios.ignition.capture import build_program
from helios.ignition.export import CapacityPlan
from helios.ignition.preparation.contract import (
    FrontendDeclaration,
    PagedTextDeclaration,
    ProgramResource,
    declare_paged_text,
)
from helios.ignition.program_spec import DRAFT_PREFIX, ProgramOptions, ProgramSpec, program_spec
from helios.ignition.recipes import Recipe
from helios.ignition.recipes.base import NamedWeight
from helios.ignition.speculative_plan import DRAFT_WEIGHTS_RESOURCE
from helios.runtime.engine import Engine
from helios.runtime.execution.executor import Executor
from helios.runtime.execution.program_variants import program_table
from helios.runtime.execution.geometry import capacities_for
from helios.runtime.loading.model import LoadedModel, LoadedProgram, _allocate, select_handles
from helios.runtime.execution.packer import Packer
from helios.runtime.scheduling.policy import SchedulerPolicy
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.loading.speculation import speculative_shape
from helios.runtime.records.stats import WorkerStats

WEIGHTS_RESOURCE = "weights.rank0"


def truncated(recipe: Recipe, num_layers: int) -> Recipe:
    """The first `num_layers` layers of `recipe` with its embeddings, final norm and head."""
    full = recipe.architecture
    moe = full.moe
    if moe is not None:
        sparse = tuple(layer for layer in moe.sparse_layers if layer < num_layers)
        moe = dataclasses.replace(moe, sparse_layers=sparse) if sparse else None
    kept = lambda layers: tuple(layer for layer in layers if layer < num_layers)  # noqa: E731
    temperature = full.query_temperature
    if temperature is not None:
        temperature = dataclasses.replace(temperature, layers=kept(temperature.layers))
    arch = dataclasses.replace(full, num_layers=num_layers, layer_windows=full.layer_windows[:num_layers], moe=moe,
                               nope_layers=kept(full.nope_layers), local_rope_layers=kept(full.local_rope_layers),
                               layer_chunks=full.layer_chunks[:num_layers], qk_unnormed_layers=kept(full.qk_unnormed_layers),
                               query_temperature=temperature)
    names = {slot.name for slot in weight_layout(arch)}  # (no local rope table without local layers)
    keep = [w for w in recipe.weights if w.name in names]
    return Recipe(recipe.source_architecture, arch, tuple(NamedWeight(w.name, w.tensor) for w in keep))


@dataclass
class Counting:
    """Wraps an executor's finish: counts speculative rounds, lanes and emitted tokens."""

    rounds: int = 0
    lanes: int = 0
    emitted: int = 0
    accepted: int = 0
    trimmed_rounds: int = 0  # rounds whose ceilings summed above P and whose offers filled P
    operations: Counter = dataclasses.field(default_factory=Counter)
    speculated: Counter = dataclasses.field(default_factory=Counter)  # request id -> tokens from rounds
    active: bool = True

    def wrap(self, executor: Executor) -> None:
        finish = executor.finish

        def counted(launched):
            output = finish(launched)
            plan = launched.plan
            if not self.active:
                return output
            self.operations[plan.operation.name] += 1
            if plan.operation.name == "SPECULATIVE":
                self.rounds += 1
                self.lanes += len(output.results)
                self.emitted += sum(len(r.token_ids) for r in output.results)
                self.accepted += sum(r.accepted_drafts for r in output.results)
                for row, result in zip(plan.rows, output.results):
                    self.speculated[row.request_id] += len(result.token_ids)
                offered = sum(r.offered_tokens for r in output.results)
                ceilings = sum(row.token_ceiling for row in plan.rows)
                self.trimmed_rounds += ceilings > plan.variant.packed_token_capacity == offered
            return output

        executor.finish = counted

    def stop(self) -> None:
        """Counts stay as they are from now on."""
        self.active = False

    @property
    def tokens_per_lane(self) -> float:
        return self.emitted / max(1, self.lanes)


def eager_model(recipe: Recipe, draft: Recipe | None, plan: CapacityPlan, startup: StartupOptions = StartupOptions(),
                num_pages: int | None = None) -> LoadedModel:
    """A LoadedModel of `plan`'s programs as eager modules (see the module docstring)."""
    arch = recipe.architecture
    options = plan.speculative.options(draft.architecture) if plan.speculative else ProgramOptions()
    options = dataclasses.replace(options, attention_tuning=plan.attention_tuning)  # as prepare_core does
    specs = {}
    for operation, capacity in plan.variants():
        spec = program_spec(arch, operation, capacity, plan.page_tokens, options)
        label = f"{capacity.batch_capacity}.{capacity.verify_tokens}.{capacity.packed_token_capacity}"
        specs[f"{operation.value}.{label}"] = spec
    programs = [ProgramResource(spec, resource_id) for resource_id, spec in specs.items()]
    prepared = declare_paged_text(_declaration(recipe, plan), programs, [WEIGHTS_RESOURCE],
                                  DRAFT_WEIGHTS_RESOURCE if draft is not None else None)
    settings = resolve_settings(prepared, startup)
    handles = select_handles(prepared, settings.max_concurrency, 0, settings.speculative_widths)
    loaded = tuple(_program(prepared, handle, specs[handle.resource_id], arch) for handle in handles)
    weights = {f"w.{w.name}": w.tensor for w in recipe.weights}
    if draft is not None:
        weights.update({f"w.{DRAFT_PREFIX}{w.name}": w.tensor for w in draft.weights})
    pages = num_pages or settings.page_capacity
    rows = settings.max_concurrency
    buffers = _allocate(prepared, pages, rows, torch.device("cpu"))
    return LoadedModel(prepared, settings, loaded, MappingProxyType(weights), MappingProxyType(buffers), pages, rows,
                       b"", "", torch.device("cpu"))


def eager_runtime(model: LoadedModel, policy: SchedulerPolicy = SchedulerPolicy(),
                  host_pages: int = 0) -> tuple[Engine, Counting]:
    packer = Packer(model.prepared, model.buffers, 1)
    executor = Executor(model, packer, program_table(model), host_pages)
    counting = Counting()
    counting.wrap(executor)
    scheduler = Scheduler.create(capacities_for(model, 256, host_pages), policy)
    return Engine(scheduler, executor, WorkerStats()), counting


def _program(prepared, handle, spec: ProgramSpec, arch) -> LoadedProgram:
    graph = prepared.graphs[handle.graph]
    module = build_program(arch, spec.operation, spec.page_tokens, spec.options, spec.capacity)
    shapes = tuple(tuple(d if isinstance(d, int) else None for d in s.shape) for s in spec.inputs[1:])
    return LoadedProgram(
        graph=handle.graph, operation=graph.operation, batch_capacity=handle.capacity.batch_capacity,
        packed_token_capacity=handle.capacity.packed_token_capacity, module=module,
        weights=tuple(graph.resource_dependencies), inputs=tuple(handle.program_inputs),
        outputs=tuple(handle.program_outputs), input_shapes=shapes, speculative=speculative_shape(prepared, handle),
    )


def _declaration(recipe: Recipe, plan: CapacityPlan) -> PagedTextDeclaration:
    pages = -(-plan.context_tokens // plan.page_tokens) * plan.max_concurrency
    identity = hashlib.sha256(repr(recipe.architecture).encode()).hexdigest()
    return PagedTextDeclaration(
        served_id="test", cache_identity=f"sha256:{identity}", vocab_size=recipe.architecture.vocab_size,
        page_tokens=plan.page_tokens, context_tokens=plan.context_tokens, prefill_tokens=plan.prefill_tokens,
        max_concurrency=plan.max_concurrency, page_capacity=plan.page_capacity or pages,
        eos_token_ids=(recipe.architecture.vocab_size - 1,),
        sampling=spb.SamplingDefaults(seed_policy=spb.SEED_POLICY_RANDOM),
        frontend=FrontendDeclaration(assistant_boundary=spb.AssistantBoundary(
            message_start="<s>", message_end="</s>", assistant_header="assistant\n")),
    )


def write_truncated_checkpoint(source: Path, directory: Path, num_layers: int) -> Path:
    """A Hugging Face checkpoint of the first `num_layers` layers of the one at `source`."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(source))
    model.model.layers = model.model.layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:num_layers]
    model.save_pretrained(directory)
    return directory


# The speculative core that test_prepared_core.py (`helios prepare --draft` end to end) and
# test_served_parity.py (its "allocating" server) both open: the chat checkpoint's Qwen3 weights
# (seed 3) with their first layer as the draft, widths 1 and 4 allocating prefixes on the device
# (ceilings of 4 a lane within P = 2 a lane), MIXED steps, scored prefill and token log-probabilities;
# prepared once per run (one copy for all the xdist workers).
ALLOCATING_NAMESPACE = "test.helios/speculative"
ALLOCATING_SERVED_ID = "tiny-chat"


@dataclass(frozen=True)
class AllocatingCore:
    checkpoint: Path
    draft: Path
    core: Path
    public_key: Path


def allocating_core(tmp_path_factory) -> AllocatingCore:
    from helios.cli.main import main
    from ignition.hf_checkpoints import QWEN3
    from support.chat_checkpoint import write_chat_checkpoint
    from support.shared_prepare import prepared_once, shared_root

    root = shared_root(tmp_path_factory.getbasetemp()) / "speculative-allocating"
    made = AllocatingCore(root / "checkpoint", root / "draft", root / "model.core", root / "publisher.key.pub")
    done = root / ".prepared"

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        write_chat_checkpoint(QWEN3, made.checkpoint, seed=3)
        write_truncated_checkpoint(made.checkpoint, made.draft, 1)
        key = root / "publisher.key"
        assert main(["keygen", "-o", str(key)]) == 0
        assert main([
            "prepare", str(made.checkpoint), "-o", str(made.core), "--key", str(key),
            "--namespace", ALLOCATING_NAMESPACE, "--served-id", ALLOCATING_SERVED_ID,
            "--context-tokens", "256", "--prefill-tokens", "32", "--decode-batches", "4", "--scored-prefill",
            "--draft", str(made.draft), "--speculative-widths", "1,4", "--allocate-prefixes", "--packed-per-lane", "2",
        ]) == 0
        done.touch()

    prepared_once(root, done, prepare)
    return made
