"""Preparation end to end: checkpoint -> captured programs -> contract -> signed core.

`prepare_core` reads a Hugging Face checkpoint directory through its recipe, captures every
(operation, capacity) program with torch.export, declares the serving contract and execution
manifest, and writes one signed core through `CoreWriter`: per-rank weights as one safetensors
resource each (with its weight catalog), one resource per program, the tokenizer and the chat
template. With ``tensor_parallel`` N > 1 the programs are captured once for one rank's share
(`helios.ignition.sharding`) and stored once, shared by every rank; the manifest holds N ranks and a
handle per rank for every variant. Progress goes to the `progress` callback, one line per stage.

Startup tuning: the core also holds the TUNING producer ``tune_attention`` (`helios.ignition.tuning`),
which the runtime runs once at load to choose each DECODE variant's attention split count; the
DECODE programs read it (see `ProgramOptions.attention_tuning`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from safetensors.torch import save as save_safetensors

from helios.contract import serving_pb2 as spb
from helios.core.keys import SigningKey
from helios.core.records import ResourceKind
from helios.core.writer import CoreWriter, WrittenCore
from helios.ignition.architecture import CheckpointError
from helios.ignition.capture_pool import CaptureJob, capture_all, default_workers
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.frontend.sampling import merged_sampling
from helios.ignition.engram import HOST_TABLE, EngramTableError, read_engram
from helios.ignition.preparation.contract import (
    HostTableDeclaration,
    PagedTextDeclaration,
    ProgramResource,
    declare_paged_text,
)
from helios.ignition.program_spec import (
    LOGPROB_OPERATIONS,
    MAX_BATCH_CAPACITY,
    AttentionTuning,
    Capacity,
    Operation,
    ProgramOptions,
)
from helios.ignition.program_spec import ENGRAM_PROJ as PROJ_WEIGHT
from helios.ignition.recipes import Recipe, load_checkpoint
from helios.ignition.recipes.base import NamedWeight
from helios.ignition.safetensors_image import digest_in_background
from helios.ignition.sharding import rank_architecture, rank_weight_files, weight_resources
from helios.ignition.speculative_plan import DRAFT_WEIGHTS_RESOURCE, SpeculativePlan, draft_weights_file, load_draft
from helios.ignition.tuning import TUNING_CAPACITY
from helios.ignition.vision_plan import vision_preparation
from helios.ignition.window_split import window_tokens

TOKENIZER_RESOURCE = "tokenizer.json"
ENGRAM_TABLE_RESOURCE = "weights.engram_table"
TEMPLATE_RESOURCE = "chat_template.jinja"


MAX_CONTEXT_TOKENS = 1 << 24
MAX_PAGE_TOKENS = 4096
MAX_PAGES = 2**31 - 1


@dataclass(frozen=True)
class CapacityPlan:
    """Which program variants to capture and the extents the contract declares."""

    page_tokens: int = 16
    context_tokens: int = 2048
    prefill_tokens: int = 256
    decode_batches: tuple[int, ...] = (1, 4, 16)
    prefill_batches: tuple[int, ...] = (1,)
    mixed: bool = True
    scored_prefill: bool = False
    page_capacity: int | None = None
    speculative: SpeculativePlan | None = None  # a draft model and the SPECULATIVE variants
    # Smaller prompt-token capacities captured beside prefill_tokens for PREFILL and MIXED: a step
    # with fewer prompt tokens runs the smallest program that holds them (a short prompt, or the
    # uncached rest of a prompt served from the prefix cache, does not pay for prefill_tokens).
    prefill_chunks: tuple[int, ...] = ()
    # DECODE keeps each slot's sampled token on the device, so decode rounds can occupy both
    # execution frames (the host packs round N+1 while round N runs).
    device_pending: bool = True
    # Every PREFILL, DECODE, MIXED and SPECULATIVE variant also gets its token-logprobs variant (a
    # second program at the same capacity that returns the sampled tokens' log-probabilities; the
    # runtime runs it only for steps holding a request that asks for them).
    token_logprobs: bool = True
    # Vision-language checkpoints: patch capacities of the VISION programs (one image each; default:
    # the largest image the checkpoint's processor produces).
    patch_capacities: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.page_tokens <= 0 or self.context_tokens <= 0 or self.prefill_tokens <= 0:
            raise CheckpointError("page_tokens, context_tokens and prefill_tokens must be positive")
        if not self.decode_batches or min(self.decode_batches) <= 0:
            raise CheckpointError("at least one positive decode batch capacity is required")
        # Checked before capture, which allocates example inputs of these extents (an unbounded one
        # would exhaust memory) and before the contract, whose extents are 32-bit.
        if self.context_tokens > MAX_CONTEXT_TOKENS:
            raise CheckpointError(f"context_tokens {self.context_tokens} exceeds {MAX_CONTEXT_TOKENS}")
        if not self.page_tokens <= min(self.context_tokens, MAX_PAGE_TOKENS):
            raise CheckpointError(f"page_tokens {self.page_tokens} exceeds context_tokens ({self.context_tokens}) "
                                  f"or {MAX_PAGE_TOKENS}")
        if self.prefill_tokens > self.context_tokens:
            raise CheckpointError(f"prefill_tokens {self.prefill_tokens} exceeds context_tokens ({self.context_tokens})")
        if max(self.decode_batches + self.prefill_batches) > MAX_BATCH_CAPACITY:
            raise CheckpointError(f"batch capacities are at most {MAX_BATCH_CAPACITY}, "
                                  f"got {max(self.decode_batches + self.prefill_batches)}")
        if self.page_capacity is None and -(-self.context_tokens // self.page_tokens) * self.max_concurrency > MAX_PAGES:
            raise CheckpointError(f"{self.context_tokens} context tokens in pages of {self.page_tokens} for "
                                  f"{self.max_concurrency} requests exceed {MAX_PAGES} pages")
        if any(not 0 < chunk < self.prefill_tokens for chunk in self.prefill_chunks):
            raise CheckpointError(f"prefill chunks must lie between 0 and prefill_tokens ({self.prefill_tokens}), "
                                  f"got {list(self.prefill_chunks)}")

    @property
    def max_concurrency(self) -> int:
        return max(self.decode_batches)

    @property
    def attention_tuning(self) -> AttentionTuning:
        return AttentionTuning(tuple(sorted(set(self.decode_batches))), self.context_tokens)

    def variants(self) -> list[tuple[Operation, Capacity]]:
        """Serving variants, then the startup tuning producer (one variant)."""
        tokens = self.prefill_tokens
        chunks = sorted(set(self.prefill_chunks) | {tokens})
        plan = [(Operation.DECODE, Capacity(rows, rows)) for rows in sorted(set(self.decode_batches))]
        plan += [(Operation.PREFILL, Capacity(rows, max(chunk, rows)))
                 for rows in sorted(set(self.prefill_batches)) for chunk in chunks if chunk >= rows or chunk == tokens]
        if self.mixed:
            rows = self.max_concurrency
            plan += [(Operation.MIXED, Capacity(rows, chunk + rows)) for chunk in chunks]
        if self.scored_prefill:
            plan.append((Operation.SCORED_PREFILL, Capacity(1, tokens)))
        if self.speculative is not None:
            plan += self.speculative.variants(self.decode_batches)
        return plan + [(Operation.TUNING, TUNING_CAPACITY)]

    def logprob_variants(self) -> list[tuple[Operation, Capacity]]:
        """The serving variants that get a token-logprobs variant (none without `token_logprobs`)."""
        if not self.token_logprobs:
            return []
        return [(op, capacity) for op, capacity in self.variants() if op.value in LOGPROB_OPERATIONS]


@dataclass(frozen=True)
class PrepareOptions:
    namespace: str
    served_id: str | None = None
    aliases: tuple[str, ...] = ()
    dtype: str | None = None
    license: str = ""
    capacities: CapacityPlan = field(default_factory=CapacityPlan)
    sampling: spb.SamplingDefaults = field(
        default_factory=lambda: spb.SamplingDefaults(seed_policy=spb.SEED_POLICY_RANDOM)
    )
    tensor_parallel: int = 1  # ranks the core is prepared for (one program set, N weight shards)
    # Frontend facts the publisher states instead of the template probes (checkpoint_assets.STATED_KEYS).
    frontend: tuple[tuple[str, str], ...] = ()
    # Processes that capture programs side by side (0: `capture_pool.default_workers`; 1: this one).
    capture_workers: int = 0


def prepare_core(
    checkpoint: Path, output: Path, key: SigningKey, options: PrepareOptions,
    progress: Callable[[str], None] = lambda line: None,
) -> WrittenCore:
    """Writes the signed core for `checkpoint` to `output`; returns what was written."""
    checkpoint = Path(checkpoint)
    recipe = load_checkpoint(checkpoint, options.dtype, options.capacities.context_tokens, progress)
    engram = read_engram(checkpoint, recipe.architecture.hidden_size, recipe.architecture.dtype)
    if engram is not None:  # its projection is a weight of every program (every rank holds it whole)
        proj = engram.proj if recipe.inputs_embeds_scale == 1.0 else engram.proj * recipe.inputs_embeds_scale
        recipe = dataclasses.replace(recipe, extra_weights=(*recipe.extra_weights, NamedWeight(PROJ_WEIGHT, proj)))
    ranks = options.tensor_parallel
    arch = rank_architecture(recipe.architecture, ranks)
    progress(f"recipe: {recipe.source_architecture}, {arch.num_layers} layers, vocab {arch.vocab_size}, {arch.dtype}")
    for notice in recipe.notices:
        progress(f"notice: {notice}")
    # Each rank's file digest (for the cache identity) is hashed in the background while the
    # programs are captured; the weights are compressed straight from the tensors at `write`.
    weight_files = rank_weight_files(recipe, ranks)
    digests = [digest_in_background(weights.image) for weights in weight_files]  # rank, then part order
    assets = read_assets(checkpoint, arch.vocab_size, dict(options.frontend))
    sampling = merged_sampling(checkpoint, options.sampling, options.capacities.context_tokens)
    assets = dataclasses.replace(assets, sampling=sampling)
    declared = assets.frontend
    progress(f"frontend: {declared.family} family, tool parser {spb.ToolParser.Name(declared.tool_parser)}, "
             f"reasoning {spb.ReasoningParser.Name(declared.reasoning_parser)}")
    plan = options.capacities
    writer = CoreWriter()
    programs = []
    variants = plan.variants()
    draft = load_draft(plan.speculative, arch, plan.context_tokens) if plan.speculative is not None else None
    for notice in () if draft is None else draft.notices:  # the draft's rope follows the served context too
        progress(f"notice (draft): {notice}")
    program_options = plan.speculative.options(draft.architecture) if draft is not None else ProgramOptions()
    program_options = dataclasses.replace(program_options, attention_tuning=plan.attention_tuning,
                                          device_pending=plan.device_pending)
    if engram is not None:
        if draft is not None:
            raise EngramTableError("an Engram core cannot speculate: drafts are generated on the device, the "
                                   "n-gram rows of every token are hashed on the host")
        program_options = dataclasses.replace(program_options, engram=engram.options, device_pending=False)
        progress(f"engram: {engram.table.shape[0]} rows x {engram.table.shape[1]}, {engram.heads} heads, "
                 f"{engram.ngram_tokens}-grams (host table)")
    images = vision_preparation(checkpoint, recipe, variants, plan.patch_capacities)
    if images is not None:
        program_options = dataclasses.replace(program_options, multimodal=images.multimodal)
        variants = [*variants[:-1], *images.variants, variants[-1]]  # the TUNING producer stays last
        progress(f"vision: patch capacities {list(images.patch_capacities)}")
    # The token-logprobs variants go before the TUNING producer, which stays last.
    captures = [(op, capacity, False) for op, capacity in variants[:-1]]
    captures += [(op, capacity, True) for op, capacity in plan.logprob_variants()]
    captures.append((*variants[-1], False))
    jobs = [CaptureJob(operation, capacity, dataclasses.replace(program_options, token_logprobs=logprobs))
            for operation, capacity, logprobs in captures]

    def store(index: int, captured) -> None:
        operation, capacity, logprobs = captures[index]
        resource_id = f"program.{operation.value}{'_logprobs' if logprobs else ''}.{_variant_label(capacity)}"
        resource_id += ".rank0" if ranks == 1 else ""  # ranks > 1 share one program resource
        writer.add_resource(resource_id, ResourceKind.PROGRAM_IMAGE, captured.program, rank=0 if ranks == 1 else None)
        programs.extend(ProgramResource(captured.spec, resource_id, rank) for rank in range(ranks))
        progress(f"captured {operation.value}{' (logprobs)' if logprobs else ''} R={capacity.batch_capacity} T={capacity.packed_token_capacity} "
                 f"({len(captured.program) / 1e6:.1f} MB, {captured.seconds:.1f} s) [{index + 1}/{len(captures)}]")

    workers = options.capture_workers or default_workers(len(jobs), arch.num_layers)
    for weights in weight_files:
        writer.add_resource(weights.resource_id, ResourceKind.WEIGHTS, weights.image.segments, rank=weights.rank)
        writer.add_weight_catalog(weights.catalog)
    # The weights are compressed and written to the output on a thread while the programs are
    # captured (worker processes), instead of after them; `write` below finishes the same core.
    writer.begin(output)
    try:
        capture_all(arch, jobs, plan.page_tokens, workers, store, watched=writer.stored_early)
        table = _add_engram_table(writer, engram, ranks) if engram is not None else None
        writer.add_resource(TOKENIZER_RESOURCE, ResourceKind.TOKENIZER, assets.tokenizer_json)
        writer.add_resource(TEMPLATE_RESOURCE, ResourceKind.CHAT_TEMPLATE, assets.chat_template.encode("utf-8"))
        weights_digest = b"".join(digest.result() for digest in digests)  # SHA-256 of each weights file
        if draft is not None:
            draft_data, draft_digest = draft_weights_file(draft)
            # Every rank runs the whole draft, so its weights are one resource shared by all ranks.
            writer.add_resource(DRAFT_WEIGHTS_RESOURCE, ResourceKind.WEIGHTS, draft_data, rank=0 if ranks == 1 else None)
            weights_digest += draft_digest  # the draft's keys/values live in the same cached pages
            progress(f"draft: {draft.source_architecture}, {draft.architecture.num_layers} layers")
        declaration = _declaration(recipe, assets, options, weights_digest)
        declaration = dataclasses.replace(declaration, split_window=window_tokens(arch, program_options))
        if images is not None:
            declaration = dataclasses.replace(declaration, images=images.declare)
        if table is not None:
            declaration = dataclasses.replace(declaration, host_table=table)
        firsts = {weights.rank: weights.resource_id for weights in reversed(weight_files)}  # each rank's first part
        prepared = declare_paged_text(declaration, programs, [firsts[rank] for rank in sorted(firsts)],
                                      DRAFT_WEIGHTS_RESOURCE if draft is not None else None, weight_resources(weight_files))
        writer.set_contract(prepared)
        writer.set_publisher(options.namespace, license=options.license)
        writer.add_signing_key(key)
        progress(f"writing {output}")
        return writer.write(output)
    except BaseException:
        writer.abort()
        raise


def _add_engram_table(writer: CoreWriter, engram, ranks: int) -> HostTableDeclaration:
    """The n-gram table as one weights resource every rank reads (it stays in each rank's host
    memory) and its host-table declaration."""
    table = HostTableDeclaration(HOST_TABLE, engram.ngram_tokens, engram.heads, engram.multipliers,
                                 tuple(engram.table.shape), engram.options.dtype, ENGRAM_TABLE_RESOURCE)
    writer.add_resource(ENGRAM_TABLE_RESOURCE, ResourceKind.WEIGHTS, save_safetensors({table.buffer: engram.table}),
                        rank=0 if ranks == 1 else None)
    return table


def _variant_label(capacity: Capacity) -> str:
    rows, tokens = capacity.batch_capacity, capacity.packed_token_capacity
    if capacity.verify_tokens > 1 or capacity.draft_tokens:
        return f"r{rows}w{capacity.verify_tokens}d{capacity.draft_tokens}t{tokens}"
    return f"r{rows}t{tokens}"


def _declaration(recipe: Recipe, assets, options: PrepareOptions, weights_digest: bytes) -> PagedTextDeclaration:
    plan = options.capacities
    pages_per_request = -(-plan.context_tokens // plan.page_tokens)
    page_capacity = plan.page_capacity or pages_per_request * plan.max_concurrency
    identity = hashlib.sha256(weights_digest + assets.digest.encode()).hexdigest()
    served_id = options.served_id or options.namespace
    return PagedTextDeclaration(
        served_id=served_id, cache_identity=f"sha256:{identity}", vocab_size=recipe.architecture.vocab_size,
        page_tokens=plan.page_tokens, context_tokens=plan.context_tokens, prefill_tokens=plan.prefill_tokens,
        max_concurrency=plan.max_concurrency, page_capacity=page_capacity, eos_token_ids=assets.eos_token_ids,
        sampling=assets.sampling, template_tokens=assets.template_tokens, aliases=options.aliases,
        frontend=assets.frontend, ranks=options.tensor_parallel,
        history_window=history_window(recipe.architecture.layer_extents),
        # Recurrent state is reused only through snapshots: continuation rows for two per request.
        snapshot_capacity=2 * plan.max_concurrency if recipe.architecture.recurrent is not None else 0,
    )


def history_window(layer_extents: tuple[int, ...]) -> int:
    """The cache's sliding-window extent: the widest layer window (or chunk, `Architecture.layer_extents`)
    when every layer reads a bounded extent, else 0 (a full-attention layer reads every position, so no
    page ever falls out of every window)."""
    return max(layer_extents) if layer_extents and all(extent > 0 for extent in layer_extents) else 0
