"""Loading a verified core into an executable model (the `NativeModel::load` of the spec).

Order, and why: the caller hands in a `Core` that `open_core` already verified and authorized, so
nothing here runs on untrusted bytes. `load_model` then

1. resolves settings (core defaults, explicit startup options win) and selects, per serving graph,
   the captured variants that the selected concurrency needs (load-time selection may reduce
   captured concurrency; a missing graph or variant fails startup with `LoadError`);
2. checks, before deserializing a program, that it is a program image (`helios.abi.program_image`:
   graph JSON plus safetensors, nothing unpickled; a core with pickled ``torch.export.save``
   programs fails with `PickledProgramError`), that its graph calls nothing but allowed ops and
   that every ABI op it names is declared in the manifest and registered here with exactly the
   declared schema, then builds it and checks again;
3. loads the rank's weights (safetensors only) into the WEIGHT buffers, checking dtype and shape
   (on a thread, while step 2 deserializes the programs and, for CUDA graphs, builds the graph
   modules the capture will record, `helios.runtime.loading.cuda_graphs.plan_captures`, and on
   one rank dry-runs each on stand-ins so that the Triton variants compile meanwhile,
   `helios.runtime.loading.dry_run_ahead`; a failure of the programs or the weights fails the load);
4. backs every other buffer after graph loading: physical page and state-row extents are chosen
   now and replace preparation's working-set counts (pages sized from the free device memory whose
   CUDA graph capture then runs out of memory are sized again, from a lower fraction: the load
   starts over, `CAPTURE_RETRY_STEP`); on a device, the buffers every step rewrites
   share one allocation (`helios.runtime.loading.step_arena`: one upload per step);
5. runs the startup tuning producers the selected serving graphs depend on (`helios.runtime.loading.tuning`;
   loaded like serving programs in step 2), once, before any CUDA graph is captured and before the
   model is returned; a missing or failing producer fails startup with `TuningProducerError`;
6. on the CPU with `LoadOptions.compile_programs`, compiles every CPU program's pure tensor runs
   with Inductor for the buffers just allocated (`helios.runtime.loading.program_compile`), so
   serving compiles nothing; a failure fails startup with `ProgramCompileError`; otherwise, on the
   CPU, binds C++ kernels for the programs' ABI bodies where a C++ compiler builds them
   (`LoadOptions.cpu_kernels`, `helios.runtime.loading.cpu_kernels`); either way, on one rank, runs
   each program's checked first call now (`check_ahead`), so that no serving step runs the bodies.

The `LoadedModel` owns programs, weights and buffers until it is dropped; serving allocates none.

A process (or thread) loads ONE rank (`LoadOptions.rank`): that rank's graph handles, and for each
WEIGHT buffer the rank's counterpart of the weights resource the manifest names (a resource of
another rank is replaced by the same-position weights resource of this rank; a resource with no
rank is shared). `helios.runtime.parallel.ranks` loads the other ranks and ties them together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import torch

from helios.abi.registry import registered_schemas
from helios.contract import PreparedContract, StartupOptions, resolve_settings
from helios.runtime.loading.constants import write_constants
from helios.runtime.loading.defaults import DEFAULT_MEMORY_FRACTION
from helios.runtime.loading.page_sizing import default_pages, other_bytes, page_bytes
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.servable import check_servable
from helios.contract.settings import ResolvedSettings
from helios.errors import LoadError
from helios.runtime.loading import gc_pause, thread_switch
from helios.runtime.loading.auxiliary import initialization_handles, state_copy_handles, vision_handles
from helios.runtime.loading.cuda_graphs import CaptureMemoryError, capture_programs, choose_gemm_algorithms, plan_captures
from helios.runtime.loading.dry_run_ahead import DryRunAhead, buffer_bytes, fits_twice, stand_in_weights
from helios.runtime.loading.dry_run_record import DryRunRecord
from helios.runtime.loading.kernel_precompile import KernelCompiler, default_compile_workers
from helios.runtime.loading.image_features import FEATURE_BUFFER_INPUT, ImageFeatureCache, default_num_images
from helios.runtime.loading.memory_budget import InsufficientMemoryError, check_fits
from helios.runtime.loading.cpu_kernels import check_ahead, use_cpu_kernels
from helios.runtime.loading.programs import (  # noqa: F401 (LoadedProgram, PickledProgramError: this module's API)
    DeclaredOps, LoadedProgram, MissingVariantError, PickledProgramError, load_program,
)
from helios.runtime.loading.speculation import speculative_handles
from helios.runtime.loading.step_arena import into_arena, step_buffers
from helios.runtime.loading.tuning import producer_handles, run_producers
from helios.runtime.cache.window_pages import window_page_count
from helios.runtime.loading.weight_stream import (  # noqa: F401 (WeightMismatchError: part of this module's API)
    WantedTensor, WeightMismatchError, load_weight_resources,
)

_LOG = logging.getLogger(__name__)
# A load whose CUDA graph capture runs out of device memory beside the pages its memory fraction sized
# (the fraction's remainder too small for the capture's working set: an 8B core on an 80 GB H100 at
# 0.85) loads again with the fraction this much lower, at most this many times.
CAPTURE_RETRY_STEP = 0.1
CAPTURE_RETRIES = 2
SERVING_OPERATIONS = (
    spb.GRAPH_OPERATION_DECODE, spb.GRAPH_OPERATION_PREFILL, spb.GRAPH_OPERATION_MIXED, spb.GRAPH_OPERATION_SPECULATIVE,
    spb.GRAPH_OPERATION_SCORED_PREFILL, spb.GRAPH_OPERATION_RESUME,
)
_DTYPES = {
    mpb.DTYPE_FLOAT32: torch.float32, mpb.DTYPE_FLOAT16: torch.float16, mpb.DTYPE_BFLOAT16: torch.bfloat16,
    mpb.DTYPE_INT64: torch.int64, mpb.DTYPE_INT32: torch.int32, mpb.DTYPE_INT16: torch.int16,
    mpb.DTYPE_INT8: torch.int8, mpb.DTYPE_UINT8: torch.uint8, mpb.DTYPE_BOOL: torch.bool,
    mpb.DTYPE_UINT16: torch.uint16, mpb.DTYPE_UINT32: torch.uint32,
    mpb.DTYPE_FLOAT8_E4M3: torch.float8_e4m3fn, mpb.DTYPE_FLOAT8_E5M2: torch.float8_e5m2,
}


class RankResourceError(LoadError):
    """The rank is outside the manifest's ranks, or the core lacks that rank's weights."""


class TooFewPagesError(LoadError):
    """The physical cache pages asked for are fewer than a program's static page extent (its inputs
    are narrowed to that many pages)."""


@dataclass(frozen=True)
class LoadOptions:
    """Startup options: contract settings overrides, device, physical cache pages and the rank."""

    startup: StartupOptions = StartupOptions()
    device: str = "cpu"
    num_pages: int | None = None
    rank: int = 0  # the tensor-parallel rank this process (or thread) loads
    cuda_graphs: bool = True  # on CUDA: capture every selected program at load and replay it
    # On CUDA without `num_pages`: the share of device memory free after loading that pages may take.
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    # Pages of a window region that owns its page ids (`helios.runtime.cache.window_pages`); None: enough
    # that the window never makes a request wait (`window_page_count`).
    window_pages: int | None = None
    # Vision-language cores: images whose encoded features stay on the device for reuse (None: 16,
    # fewer when 16 of the largest image's would pass 1 GiB).
    image_cache_images: int | None = None
    # On the CPU: compile every program's pure tensor runs with Inductor before the engine is ready
    # (`helios.runtime.loading.program_compile`; needs a C++ compiler, else `ProgramCompileError`).
    compile_programs: bool = False
    # On the CPU without `compile_programs`: bind C++ kernels for the ABI bodies (attention, cache writes,
    # sampling, norms, SiLU-mul, rotary) and the projections (`helios.runtime.loading.cpu_kernels`). None: where a C++ compiler
    # builds them; True: required (`CpuKernelError` otherwise); False: the Python bodies.
    cpu_kernels: bool | None = None
    # On CUDA with `cuda_graphs`: worker processes that compile the Triton kernels the capture's warm-up
    # runs need, side by side, before it (`helios.runtime.loading.kernel_precompile`); None:
    # `default_compile_workers()`, 0: the warm-up runs compile them one after another.
    compile_workers: int | None = None
    # With `compile_workers`: a variant sent while every worker is busy waits, and a freed worker takes the
    # one expected to compile longest (`KernelCompiler`'s `longest_first`: 1.4 s off an 8B core's first
    # load); off: the order they were sent (`bench/cold_start.py --compile-order sent`).
    compile_longest_first: bool = True
    progress: Callable[[str], None] | None = None  # load-time progress lines (compilation), e.g. to stderr


@dataclass(frozen=True)
class LoadedModel:
    """Everything serving needs from a core, owned until drop. Buffers are mutated only by
    the model worker (packing and program execution)."""

    prepared: PreparedContract
    settings: ResolvedSettings
    programs: tuple[LoadedProgram, ...]
    weights: Mapping[str, torch.Tensor]
    buffers: Mapping[str, torch.Tensor]
    num_pages: int
    num_state_rows: int
    tokenizer_json: bytes
    chat_template: str
    device: torch.device
    rank: int = 0
    state_rows_per_request: int = 1  # the most any selected graph needs (at least 1)
    vision_programs: tuple[LoadedProgram, ...] = ()  # VISION variants (image encoders), patch order
    image_cache: ImageFeatureCache | None = None  # with VISION programs on rank zero: allocated at load
    num_window_pages: int = 0  # pages of the window region with its own page ids (0: none)
    # INITIALIZATION variants, smallest batch first: run over the rows a step admits, before it.
    initialization_programs: tuple[LoadedProgram, ...] = ()
    # SNAPSHOT and RESTORATION variants, smallest batch first (`helios.runtime.execution.state_programs`).
    # With them, the state planes hold the slots' rows and then the snapshot rows these programs copy.
    state_copy_programs: tuple[LoadedProgram, ...] = ()

    @property
    def num_slot_state_rows(self) -> int:
        """State rows of the request slots (the first rows of every state plane)."""
        return self.settings.max_concurrency * self.state_rows_per_request


def request_pages(prepared, context_tokens: int) -> int:
    """Pages one request of `context_tokens` takes: its page table, the extent's pages and the
    layout's lookahead (the largest page offset of a page-table view)."""
    cache = prepared.contract.model.cache
    lookahead = max((view.page_offset for view in cache.page_table_views), default=0)
    return -(-context_tokens // cache.page_tokens) + lookahead


def _check_request_pages(prepared, settings, num_pages: int | None) -> None:
    """Before anything loads: physical pages asked for (`--pages`) must hold one request of the
    context extent."""
    if num_pages is None:
        return
    cache = prepared.contract.model.cache
    needed = request_pages(prepared, settings.context_tokens)
    if num_pages < needed:
        raise TooFewPagesError(f"{num_pages} physical cache pages asked for, but one request of the context extent "
                               f"({settings.context_tokens} tokens, {cache.page_tokens} a page) takes {needed}; "
                               f"ask for at least {needed}, or a smaller --context-tokens")


def load_model(core, options: LoadOptions = LoadOptions(), pages: Callable[[], int] | None = None) -> LoadedModel:
    """Loads a verified, authorized `helios.core.reader.Core` (see the module docstring).

    `pages`: called once programs and weights are loaded, for the page count (a tensor-parallel
    peer waits there for rank zero's, so every rank reads its weights at the same time). Pages sized
    from `LoadOptions.memory_fraction` whose capture runs out of device memory load again at a lower
    fraction (`CAPTURE_RETRY_STEP`, logged)."""
    workers = 0
    if serving_device(options.device).type == "cuda" and options.cuda_graphs:
        workers = default_compile_workers() if options.compile_workers is None else options.compile_workers
    # The collector paused: a third of the load's Python time went to its walks (`gc_pause`); the
    # loading thread gets the GIL back from the weight threads sooner (`thread_switch`).
    compiler = KernelCompiler(workers, longest_first=options.compile_longest_first)
    with gc_pause.paused(), thread_switch.shortened(), compiler:
        tried = []
        while True:
            # as given first (a fraction such as 0.004 rounded to 0.0 failed the load); the retries' rounded
            fraction = round(options.memory_fraction - len(tried) * CAPTURE_RETRY_STEP, 2) if tried else \
                options.memory_fraction
            try:
                return _load_model(core, dataclasses.replace(options, memory_fraction=fraction), pages, compiler)
            except CaptureMemoryError as error:
                tried.append(fraction)
                _check_retry(options, pages, tried, error)
            gc.collect()  # the failed load's tensors (cycles of its programs included), then their memory
            torch.cuda.empty_cache()


def _check_retry(options: LoadOptions, pages, tried: list[float], error: CaptureMemoryError) -> None:
    """Whether a load whose capture ran out of device memory at the fractions `tried` starts over with
    `CAPTURE_RETRY_STEP` less: where its pages were sized from the fraction (no --pages, one rank), at
    most `CAPTURE_RETRIES` times (logged); otherwise `error` is raised, naming the fractions tried."""
    lowered = round(tried[-1] - CAPTURE_RETRY_STEP, 2)
    if options.num_pages or pages is not None:
        raise error
    if len(tried) > CAPTURE_RETRIES or lowered <= 0:
        error.args = (f"{error} (tried --memory-fraction {', '.join(f'{f:.2f}' for f in tried)})",)
        raise error
    _LOG.warning("%s; loading again with --memory-fraction %.2f (start with it to skip this attempt)", str(error),
                 lowered)


def _load_model(core, options: LoadOptions, pages, compiler: KernelCompiler) -> LoadedModel:
    prepared = core.prepared
    compiler.ran_ahead, compiler.ahead_seconds = False, 0.0  # this attempt's dry run, if it makes one
    # Reading the core checked the specification's rules; what this runtime serves is checked here
    # (the same table `helios contract check` and preparation apply: helios.contract.servable).
    check_servable(prepared.contract, prepared.manifest)
    settings = resolve_settings(prepared, options.startup)
    device = serving_device(options.device)
    if not 0 <= options.rank < prepared.manifest.ranks:
        raise RankResourceError(f"rank {options.rank} is not one of the core's {prepared.manifest.ranks} ranks")
    _check_request_pages(prepared, settings, options.num_pages)
    handles = select_handles(prepared, settings.max_concurrency, options.rank, settings.speculative_widths,
                             token_logprobs=options.startup.token_logprobs is not False)
    declared = {op.name: op.schema for op in prepared.manifest.abi_operations}
    declared = DeclaredOps(declared, registered_schemas())  # the registered ops, listed once per load
    # Weights decode, verify and copy (native code that releases the GIL) on a thread while the
    # programs deserialize here (Python that holds it): the two overlap instead of adding up.
    initial = initialization_handles(prepared, options.rank)
    copies = state_copy_handles(prepared, options.rank)
    # Programs that CUDA graphs capture are recorded from rewritten copies, whose code the capture
    # generates: their own code is generated only if something calls them (`lazy_code`).
    captured = device.type == "cuda" and options.cuda_graphs
    record = None  # what an earlier load's dry run found, if there is one (`dry_run_record`)
    if captured and prepared.manifest.ranks == 1 and compiler.workers:
        record = DryRunRecord.for_load(core.body_sha256, handles, (
            settings.max_concurrency, settings.context_tokens, settings.snapshot_capacity, options.window_pages))
    # Its workers start now, at a lower priority (`KernelCompiler.start`), unless an earlier load's dry run
    # left a record: they then start only where a variant it lists is not on disk any more.
    compiler.start(spawn=record is None or not record.exists())
    with ThreadPoolExecutor(1, thread_name_prefix="helios-weights") as background:
        loading = background.submit(_load_weights_on_device, core, prepared, device, options.rank)
        programs = tuple(load_program(core, prepared, handle, declared, device, lazy_code=captured)
                         for handle in handles)
        tuning = producer_handles(prepared, dict.fromkeys(h.graph for h in handles), options.rank)
        producers = tuple(load_program(core, prepared, handle, declared, device) for handle in tuning)
        initializers = tuple(load_program(core, prepared, handle, declared, device, lazy_code=captured)
                             for handle in initial)
        state_copies = tuple(load_program(core, prepared, handle, declared, device, lazy_code=captured)
                             for handle in copies)
        graphs = dict.fromkeys(h.graph for h in handles + initial + copies)
        rows_per_request = max(1, prepared.state_rows_per_request(graphs))
        # Execution rows, then (for a core that copies state with its own programs) the snapshot rows.
        snapshot_rows = settings.snapshot_capacity if state_copies else 0
        num_state_rows = (settings.max_concurrency + snapshot_rows) * rows_per_request
        context_pages = -(-settings.context_tokens // prepared.contract.model.cache.page_tokens)
        row_tokens = max(h.capacity.packed_token_capacity for h in handles)
        num_window_pages = window_page_count(prepared, settings.max_concurrency, row_tokens, context_pages,
                                             options.window_pages)
        least_pages = static_pages(prepared, programs + producers + initializers + state_copies)
        ahead, precompile = None, compiler  # the capture's compiler: none where there is nothing to compile
        if record is not None and compiler.active and _compiled_already(record, device):
            record = precompile = None  # no dry run: it would compile nothing (nor is the record written again)
        elif captured:  # the Triton precompile's dry run, on stand-ins, as each plan is built
            compiler.spawn_workers()
            ahead = _dry_run_ahead(prepared, producers, compiler, device, max(context_pages + 1, least_pages),
                                   num_state_rows, num_window_pages)
        plans = plan_captures(programs, device, ahead=ahead) if captured else None  # built while the weights load
        if ahead is not None:
            ahead.close()
        weights = loading.result()
    if plans is not None:  # the projections' cuBLASLt algorithms, timed while the device memory is free
        choose_gemm_algorithms(plans, device)
    vision_graphs = vision_handles(prepared, options.rank)
    # Allocated before pages are sized from the free memory, so the pages leave room for it.
    image_cache = None
    if vision_graphs and options.rank == 0:  # tensor-parallel ranks serve no images
        image_cache = _image_cache(prepared, options.image_cache_images, device)
    num_pages = pages() if pages is not None else options.num_pages or default_pages(
        prepared, device, options.memory_fraction, num_state_rows, context_pages, settings.page_capacity,
        num_window_pages)
    if num_pages < least_pages:
        raise TooFewPagesError(f"{num_pages} physical cache pages asked for, but the core's programs take "
                               f"{least_pages} (a static page extent); ask for at least {least_pages}")
    buffers = _allocate_pages(prepared, num_pages, num_state_rows, device, num_window_pages)
    write_constants(prepared, buffers)
    run_producers(producers, lambda p: program_arguments(p, weights, buffers))
    vision = tuple(load_program(core, prepared, handle, declared, device, lazy_code=captured)
                   for handle in vision_graphs)
    if captured:
        programs = capture_programs(programs, lambda p: program_arguments(p, weights, buffers), buffers, device,
                                    keep=tuned_outputs(prepared), compiler=precompile, plans=plans)
        if vision:  # the image encoders replay as CUDA graphs too
            vision = capture_programs(vision, lambda p: program_arguments(p, weights, buffers), buffers, device,
                                      keep=tuned_outputs(prepared))
        if record is not None and compiler.active:
            record.save(compiler.revealed.values(), device)
        if initializers:
            initializers = capture_programs(initializers, lambda p: program_arguments(p, weights, buffers), buffers,
                                            device, keep=tuned_outputs(prepared))
        if state_copies:
            state_copies = capture_programs(state_copies, lambda p: program_arguments(p, weights, buffers), buffers,
                                            device, keep=tuned_outputs(prepared))
    every = programs + initializers + state_copies + vision
    if device.type == "cpu" and options.compile_programs:  # before ready: serving compiles nothing
        from helios.runtime.loading.program_compile import compile_programs  # sympy, fake tensors: CPU only

        compile_programs(every, lambda p: program_arguments(p, weights, buffers), options.progress)
    kernels = device.type == "cpu" and (options.compile_programs
                                        or use_cpu_kernels(every, options.cpu_kernels, options.progress,
                                                           lambda p: [weights[name] for name in p.weights]))
    if kernels and prepared.manifest.ranks == 1:
        # Kernels round otherwise than the checked bodies: no serving step runs the bodies. (A
        # tensor-parallel rank's programs need the group's collectives, bound after load.)
        check_ahead(every, lambda p: program_arguments(p, weights, buffers), buffers, keep=tuned_outputs(prepared),
                    progress=options.progress)
    write_constants(prepared, buffers)  # again: capture zeroes the buffers after its warm-up runs
    return LoadedModel(
        prepared, settings, programs, MappingProxyType(weights), MappingProxyType(buffers), num_pages,
        num_state_rows, core.read_resource(resource_of_kind(core, "TOKENIZER")),
        core.read_resource(resource_of_kind(core, "CHAT_TEMPLATE")).decode("utf-8"), device, options.rank,
        rows_per_request,
        vision,
        image_cache,
        num_window_pages=num_window_pages,
        initialization_programs=initializers,
        state_copy_programs=state_copies,
    )


def _compiled_already(record: DryRunRecord, device: torch.device) -> bool:
    """Whether every Triton variant `record` lists (the last dry run of this core's load) is in Triton's
    cache for `device`: the dry run would compile nothing (logged)."""
    listed = record.all_on_disk(device)
    if listed is not None:
        _LOG.info("Triton kernels: the %d variants this core's last dry run found are in Triton's cache: "
                  "no dry run", listed)
    return listed is not None


class DeviceUnavailableError(LoadError):
    """The startup device is not a torch device string, or this process cannot use it."""


def _dry_run_ahead(prepared: PreparedContract, producers, compiler: KernelCompiler, device: torch.device,
                   num_pages: int, num_state_rows: int, num_window_pages: int) -> DryRunAhead | None:
    """The precompile's dry run on stand-ins (`helios.runtime.loading.dry_run_ahead`): stand-in weights
    and buffers of `num_pages` pages, constants written and producers run; None where it is not made
    (no workers, several ranks, or the stand-ins do not fit twice beside the weights)."""
    if not compiler.active or prepared.manifest.ranks != 1:
        return None
    try:
        buffers = _allocate(prepared, num_pages, num_state_rows, device, num_window_pages)
        if not fits_twice(prepared.manifest, _DTYPES, buffer_bytes(buffers), device):
            _LOG.info("the Triton precompile's dry run waits for the capture (its stand-ins do not fit twice)")
            del buffers
            torch.cuda.empty_cache()  # the pages are sized from the free memory
            return None
        weights = stand_in_weights(prepared.manifest, _DTYPES, device)
        write_constants(prepared, buffers)
        run_producers(producers, lambda p: program_arguments(p, weights, buffers))
    except Exception as error:  # noqa: BLE001 - the capture's own dry run then finds the variants
        _LOG.info("the Triton precompile's dry run waits for the capture (stand-ins: %s: %s)",
                  type(error).__name__, error)
        buffers = weights = None
        torch.cuda.empty_cache()
        return None
    arguments = [*buffers.values(), *weights.values()]
    return DryRunAhead(compiler, arguments, lambda p: program_arguments(p, weights, buffers), device)


def serving_device(name: str) -> torch.device:
    """The torch device for `name` ("cpu", "cuda", "cuda:N"); a CUDA device gets its index."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        raise DeviceUnavailableError(f"{name!r} is not a device: {error}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceUnavailableError(f"device {name!r}: models run on the CPU or on CUDA")
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(f"device {name!r}: this process sees no CUDA device")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise DeviceUnavailableError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device("cuda", index)


def select_handles(prepared: PreparedContract, concurrency: int, rank: int = 0,
                   widths: tuple[int, ...] = (), token_logprobs: bool = True) -> list[mpb.GraphHandle]:
    """The rank's handles of the serving graphs, reduced to the variants `concurrency` can use;
    SPECULATIVE handles only of the widest of the selected `widths` (none without widths); no
    token-logprobs variant unless `token_logprobs`."""
    selected = []
    for operation in SERVING_OPERATIONS:
        for graph in prepared.graphs_for(operation):
            if graph.token_logprobs and not token_logprobs:
                continue
            handles = [h for h in prepared.manifest.graph_handles if h.graph == graph.name and h.rank == rank]
            if operation == spb.GRAPH_OPERATION_SPECULATIVE:
                handles = speculative_handles(handles, widths)
            selected += _reduce(handles, concurrency)
    operations = {prepared.graphs[h.graph].operation for h in selected}
    if spb.GRAPH_OPERATION_DECODE not in operations:
        raise MissingVariantError("the core has no DECODE program: it cannot generate")
    if not operations & {spb.GRAPH_OPERATION_PREFILL, spb.GRAPH_OPERATION_MIXED}:
        raise MissingVariantError("the core has no PREFILL or MIXED program: it cannot consume prompts")
    for handle in selected:
        if not handle.program_inputs or not handle.program_outputs:
            raise MissingVariantError(f"graph {handle.graph!r}: the manifest does not name the program's inputs/outputs")
    return selected


def _reduce(handles: list[mpb.GraphHandle], concurrency: int) -> list[mpb.GraphHandle]:
    """Variants with B <= concurrency, plus every variant (each token capacity) of the smallest
    B above it when no variant has B == concurrency."""
    ordered = sorted(handles, key=lambda h: (h.capacity.batch_capacity, h.capacity.packed_token_capacity))
    kept = [h for h in ordered if h.capacity.batch_capacity <= concurrency]
    larger = [h for h in ordered if h.capacity.batch_capacity > concurrency]
    if larger and (not kept or kept[-1].capacity.batch_capacity < concurrency):
        rows = larger[0].capacity.batch_capacity
        kept += [h for h in larger if h.capacity.batch_capacity == rows]
    return kept


def tuned_outputs(prepared: PreparedContract) -> set[str]:
    """Buffers the startup tuning producers write (serving programs only read them)."""
    return {output for entry in prepared.manifest.tuning_catalog for output in entry.outputs}


def static_pages(prepared: PreparedContract, programs) -> int:
    """The most physical pages any of `programs` takes as a static extent of a page-sized buffer (0
    when every page dimension is symbolic, as preparation exports them): `program_arguments` narrows
    such an input to that many pages, so fewer pages than this cannot be served, nor dry-run."""
    page_dims = {buffer.name: [dim for dim, d in enumerate(buffer.shape) if d.WhichOneof("extent") == "load_extent"
                               and d.load_extent == mpb.LOAD_EXTENT_PHYSICAL_PAGES]
                 for buffer in prepared.manifest.buffers}
    least = 0
    for program in programs:
        for name, shape in zip(program.inputs, program.input_shapes):
            for dim in page_dims.get(name, ()):
                if dim < len(shape) and shape[dim] is not None:
                    least = max(least, shape[dim])
    return least


def program_arguments(program: LoadedProgram, weights: Mapping[str, torch.Tensor],
                      buffers: Mapping[str, torch.Tensor]) -> list:
    """The program's call arguments: its weight list, then its input buffers narrowed to the
    program's static extents. The same tensors every call (a captured graph relies on it)."""
    inputs = [_narrow(buffers[name], shape) for name, shape in zip(program.inputs, program.input_shapes)]
    return [[weights[name] for name in program.weights], *inputs]


def _narrow(buffer: torch.Tensor, shape: tuple[int | None, ...]) -> torch.Tensor:
    view = buffer
    for dim, extent in enumerate(shape):
        if extent is not None and view.shape[dim] != extent:
            view = view.narrow(dim, 0, extent)
    return view


def _load_weights_on_device(core, prepared: PreparedContract, device: torch.device,
                            rank: int) -> dict[str, torch.Tensor]:
    """`_load_weights` with `device` current (a thread starts on the process's default device)."""
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        return _load_weights(core, prepared, device, rank)


def _load_weights(core, prepared: PreparedContract, device: torch.device, rank: int) -> dict[str, torch.Tensor]:
    """The rank's WEIGHT buffers, each weights resource decoded once, straight into its tensors, the
    resources side by side (`helios.runtime.loading.weight_stream.load_weight_resources`); dtype and
    shape are checked against the manifest first."""
    wanted: dict[str, dict[str, WantedTensor]] = {}
    for buffer in prepared.manifest.buffers:
        if buffer.role == mpb.BUFFER_ROLE_WEIGHT:
            shape = tuple(dim.size for dim in buffer.shape)
            resource_id = rank_resource(core, buffer.resource_id, rank)
            wanted.setdefault(resource_id, {})[buffer.name] = WantedTensor(_DTYPES[buffer.dtype], shape)
    check_fits("the weights", sum(core.resource(r).decoded_nbytes for r in wanted), device)
    resources = {r: (core.resource(r).decoded_nbytes, names) for r, names in wanted.items()}
    host = {b.name for b in prepared.manifest.buffers
            if b.role == mpb.BUFFER_ROLE_WEIGHT and b.placement == mpb.PLACEMENT_HOST}
    on_host = {r: item for r, item in resources.items() if set(item[1]) <= host}  # host staging tables
    weights = load_weight_resources(core.open_resource, {r: v for r, v in resources.items() if r not in on_host},
                                    device)
    if on_host:
        weights.update(load_weight_resources(core.open_resource, on_host, torch.device("cpu")))
    for name in host & weights.keys():  # a host table sharing a resource with device weights
        weights[name] = weights[name].cpu()
    return weights


def rank_resource(core, resource_id: str, rank: int) -> str:
    """`rank`'s counterpart of a weights resource: itself when shared (no rank) or already the
    rank's, else the rank's weights resource at the same position among its rank's resources."""
    info = core.resource(resource_id)
    if info.rank is None or info.rank == rank:
        return resource_id
    same = [r.id for r in core.resources if r.kind == info.kind and r.rank == info.rank]
    mine = [r.id for r in core.resources if r.kind == info.kind and r.rank == rank]
    if len(mine) != len(same):
        raise RankResourceError(
            f"rank {rank} has {len(mine)} {info.kind.name.lower()} resources; rank {info.rank} has {len(same)}"
        )
    return mine[same.index(resource_id)]


def _allocate(prepared: PreparedContract, num_pages: int, num_rows: int, device,
              num_window_pages: int = 0) -> dict[str, torch.Tensor]:
    extents = {mpb.LOAD_EXTENT_PHYSICAL_PAGES: num_pages, mpb.LOAD_EXTENT_STATE_ROWS: num_rows,
               mpb.LOAD_EXTENT_WINDOW_PAGES: num_window_pages}
    buffers = {}
    for buffer in prepared.manifest.buffers:
        if buffer.role == mpb.BUFFER_ROLE_WEIGHT:
            continue
        shape = [extents[d.load_extent] if d.WhichOneof("extent") == "load_extent" else d.size for d in buffer.shape]
        if buffer.placement == mpb.PLACEMENT_DEVICE or buffer.role == mpb.BUFFER_ROLE_INPUT:
            # A program reads its inputs on its own device: a MAPPED_HOST or HOST input is realised as
            # device memory the packer writes through its pinned staging (uploaded asynchronously, as
            # for DEVICE inputs), since a torch program cannot read pinned host memory in place.
            buffers[buffer.name] = torch.zeros(shape, dtype=_DTYPES[buffer.dtype], device=device)
        else:  # host buffers of a CUDA model are pinned: the device copies into them asynchronously
            pinned = device.type == "cuda"
            buffers[buffer.name] = torch.zeros(shape, dtype=_DTYPES[buffer.dtype], pin_memory=pinned)
    if device.type != "cpu":  # the buffers a step rewrites, side by side: one upload (`step_arena`)
        names = step_buffers(prepared.graphs, prepared.manifest.completion.submission_input)
        buffers = into_arena(buffers, [name for name in names
                                       if name in buffers and buffers[name].device.type != "cpu"])
    return buffers


def _allocate_pages(prepared: PreparedContract, num_pages: int, num_rows: int, device,
                    num_window_pages: int) -> dict[str, torch.Tensor]:
    """The serving buffers (`_allocate`), refused with `InsufficientMemoryError` where they cannot fit:
    on the CPU checked first against the memory available (nothing is allocated then); on CUDA (whose
    default is sized from the free memory, an explicit count is not) when the allocator runs out."""
    nbytes = num_pages * page_bytes(prepared) + other_bytes(prepared, num_rows, num_window_pages)
    what, remedy = f"{num_pages} cache pages and the other buffers", " (fewer pages: --pages N)"
    if device.type == "cpu":
        check_fits(what, nbytes, device, remedy=remedy)
    try:
        return _allocate(prepared, num_pages, num_rows, device, num_window_pages)
    except torch.OutOfMemoryError as error:
        raise InsufficientMemoryError(f"{what} need {nbytes} bytes on {device}, more than its allocator found free"
                                      f"{remedy}") from error


def _image_cache(prepared: PreparedContract, num_images: int | None, device) -> ImageFeatureCache:
    """The feature cache: `num_images` (default: `default_num_images`) slots of the largest image's
    feature rows, in the dtype and width of the prompt programs' feature buffer."""
    buffer = next((b for b in prepared.manifest.buffers if b.name == FEATURE_BUFFER_INPUT), None)
    if buffer is None or len(buffer.shape) != 2:
        raise LoadError(f"the core declares VISION graphs but no [features, width] {FEATURE_BUFFER_INPUT!r} buffer")
    vision = prepared.contract.model.vision
    rows = max(vision.patch_capacities) // vision.patches_per_feature
    width, dtype = buffer.shape[1].size, _DTYPES[buffer.dtype]
    if num_images is None:
        num_images = default_num_images(rows, width, dtype.itemsize)
    return ImageFeatureCache(num_images, rows, width, dtype, device)


def resource_of_kind(core, kind: str) -> str:
    """The id of `core`'s resource of `kind` (a `ResourceKind` name); `LoadError` when it holds none."""
    for info in core.resources:
        if info.kind.name == kind:
            return info.id
    raise LoadError(f"the core holds no {kind.lower()} resource")
