"""Startup settings resolution: core defaults fill missing settings; explicit startup options win.

`resolve_settings(contract, options)` is the one place that merges the two. Every option is
optional (None means "not given"); a given option is validated against the prepared capacities
(load-time selection may reduce concurrency, context, prefill chunk and speculative width,
never raise them). Settings the core does not record fall back to neutral built-in values
(temperature 1, top_p 1, no top-k, no penalties, output limit = context). The result is frozen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from helios.contract import serving_pb2 as spb
from helios.errors import ContractError

if TYPE_CHECKING:
    from helios.contract.prepared import PreparedContract

STARTUP = "startup"
NEUTRAL_SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


class StartupOptionError(ContractError):
    """A startup option the prepared contract cannot honour (path ``startup.<option>``)."""

    exit_code = 2
    http_status = 400


@dataclass(frozen=True)
class SamplingOptions:
    """Explicit startup overrides of the sampling defaults; None means "use the core's"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_output_tokens: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class StartupOptions:
    """Explicit startup options; None means "not given"."""

    max_concurrency: int | None = None
    context_tokens: int | None = None
    prefill_tokens: int | None = None
    page_capacity: int | None = None
    snapshot_capacity: int | None = None
    speculative_width: int | None = None
    learned_speculation: bool | None = None
    history_drafting: bool | None = None
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    # False: the core's token-logprobs program variants are not loaded (a faster start; requests that
    # ask for log-probabilities are then refused as by a core prepared without them).
    token_logprobs: bool | None = None


@dataclass(frozen=True)
class ResolvedSampling:
    """Complete default sampling parameters; explicit request values still win per request."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    max_output_tokens: int
    seed_policy: int
    seed: int | None


@dataclass(frozen=True)
class ResolvedSettings:
    """Settings a runtime starts with. `speculative_widths` are the selected W values, ascending."""

    max_concurrency: int
    context_tokens: int
    prefill_tokens: int
    page_capacity: int
    snapshot_capacity: int
    speculative_widths: tuple[int, ...]
    learned_speculation: bool
    history_drafting: bool
    sampling: ResolvedSampling
    eos_token_ids: tuple[int, ...]


def _fail(option: str, message: str):
    raise StartupOptionError(f"{STARTUP}.{option}", message)


def _bounded(option: str, value: int | None, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        _fail(option, f"{value!r} is outside the prepared range [{low}, {high}]")
    return value


def resolve_settings(contract: "PreparedContract", options: StartupOptions | None = None) -> ResolvedSettings:
    """Merge `options` over the core defaults of a validated contract."""
    options = options or StartupOptions()
    serving = contract.contract
    context = _bounded("context_tokens", options.context_tokens, serving.context_tokens, 1, serving.context_tokens)
    prefill_high = min(serving.prefill_tokens, context)
    prefill = _bounded("prefill_tokens", options.prefill_tokens, prefill_high, 1, prefill_high)
    concurrency = _bounded("max_concurrency", options.max_concurrency, serving.max_concurrency, 1, serving.max_concurrency)
    pages_needed = math.ceil(context / serving.model.cache.page_tokens)
    pages = _bounded("page_capacity", options.page_capacity, serving.page_capacity, pages_needed, 2**63 - 1)
    snapshots = _resolve_snapshots(contract, options.snapshot_capacity)
    learned, widths = _resolve_speculation(contract, options)
    drafting = _resolve_history_drafting(contract, options.history_drafting, learned, widths)
    return ResolvedSettings(
        max_concurrency=concurrency,
        context_tokens=context,
        prefill_tokens=prefill,
        page_capacity=pages,
        snapshot_capacity=snapshots,
        speculative_widths=widths,
        learned_speculation=learned,
        history_drafting=drafting,
        sampling=_resolve_sampling(serving, options.sampling, context),
        eos_token_ids=tuple(serving.defaults.eos_token_ids),
    )


def _resolve_snapshots(contract: "PreparedContract", value: int | None) -> int:
    default = contract.contract.snapshot_capacity
    if value is None:
        return default
    # Continuation rows are allocated at load (a core with SNAPSHOT and RESTORATION programs sizes
    # its state planes' snapshot rows by this count): any count can be backed.
    high = 2**63 - 1
    return _bounded("snapshot_capacity", value, default, 0, high)


def _resolve_speculation(contract: "PreparedContract", options: StartupOptions) -> tuple[bool, tuple[int, ...]]:
    widths = tuple(contract.contract.speculative_widths)
    wider = any(w > 1 for w in widths)
    learned = wider if options.learned_speculation is None else bool(options.learned_speculation)
    if learned and not wider:
        _fail("learned_speculation", "the core selects no speculative width above 1")
    if options.speculative_width is not None:
        # 1 turns speculation off, whatever widths the core has (a core without any takes it too)
        if options.speculative_width not in widths and options.speculative_width != 1:
            _fail("speculative_width", f"{options.speculative_width!r} is not a prepared width {list(widths)}")
        widths = tuple(w for w in widths if w <= options.speculative_width)
    if not learned:
        widths = tuple(w for w in widths if w == 1)
    return learned, widths


def _resolve_history_drafting(contract: "PreparedContract", value: bool | None, learned: bool, widths) -> bool:
    if not value:
        return False
    if not learned:
        _fail("history_drafting", "history drafting requires enabled learned speculation")
    if not any(width > 1 for width in widths):  # it drafts only into rounds wider than one token
        _fail("history_drafting", f"history drafting requires a selected speculative width above 1 (selected: {list(widths)})")
    for graph in contract.graphs_for(spb.GRAPH_OPERATION_SPECULATIVE):
        selected = any(v.token_capacity in widths and v.token_capacity > 1 for v in graph.variants)
        if selected and not graph.has_copied_inputs:
            _fail("history_drafting", f"selected graph {graph.name!r} has no copied-token inputs")
    return True


def _resolve_sampling(serving: spb.ServingContract, options: SamplingOptions, context: int) -> ResolvedSampling:
    core = serving.defaults.sampling
    values = {}
    for name, neutral in NEUTRAL_SAMPLING.items():
        given = getattr(options, name)
        values[name] = given if given is not None else (getattr(core, name) if core.HasField(name) else neutral)
    _check_sampling(values)
    core_limit = min(core.max_output_tokens, context) if core.HasField("max_output_tokens") else context
    limit = _bounded("sampling.max_output_tokens", options.max_output_tokens, core_limit, 1, context)
    policy, seed = core.seed_policy, (core.seed if core.HasField("seed") else None)
    if options.seed is not None:
        if isinstance(options.seed, bool) or not isinstance(options.seed, int) or not 0 <= options.seed < 2**64:
            _fail("sampling.seed", f"{options.seed!r} is not a 64-bit unsigned seed")
        policy, seed = spb.SEED_POLICY_FIXED, options.seed
    return ResolvedSampling(**values, max_output_tokens=limit, seed_policy=policy, seed=seed)


def _check_sampling(values: dict) -> None:
    rules = {
        "temperature": lambda v: 0.0 <= v < math.inf,
        "top_p": lambda v: 0.0 < v <= 1.0,
        "top_k": lambda v: isinstance(v, int) and v >= 0,
        "min_p": lambda v: 0.0 <= v <= 1.0,
        "repetition_penalty": lambda v: 0.0 < v < math.inf,
        "presence_penalty": lambda v: -2.0 <= v <= 2.0,
        "frequency_penalty": lambda v: -2.0 <= v <= 2.0,
    }
    for name, valid in rules.items():
        value = values[name]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and valid(value)
        if not ok:
            _fail(f"sampling.{name}", f"{value!r} is out of range")


