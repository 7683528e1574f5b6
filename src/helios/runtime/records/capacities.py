"""Prepared capacities the scheduler plans against: program variants, storage layout, limits.

Everything here is immutable after validation (construction raises `LoadError` for a geometry
the runtime cannot serve: a missing decode- or prefill-capable variant, a selected concurrency
above every decode variant, ...). The engine builds these from the loaded contract and the
physical cache capacities chosen after graph loading; the scheduler only reads them.

The storage description is deliberately generic: it names history regions by kind and the
page-table views that index them. Policy derives from the kinds (whether complete pages alone
capture a prefix's state, how many extra pages a shifted view references), never from a model
family.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

from helios.errors import LoadError


class Operation(enum.IntEnum):
    """The operation a captured program performs (contract enum; zero selects nothing)."""

    UNSPECIFIED = 0
    PREFILL = 1
    DECODE = 2
    MIXED = 3
    SCORED_PREFILL = 4
    SPECULATIVE = 5
    RESUME = 6  # a prompt program for steps holding a lane that continues from a restored or readmitted endpoint


class LengthSource(enum.IntEnum):
    """How a speculative program learns per-lane target lengths."""

    UNSPECIFIED = 0
    QUERY_LENGTH = 1  # exact host-selected lengths whose total fits P
    PREFIX_LIMIT = 2  # immutable ceilings; the program allocates prefixes within P


class HistoryKind(enum.IntEnum):
    """Kinds of attention-history storage a contract may declare."""

    UNSPECIFIED = 0
    PAGED_KV = 1
    PAGED_LATENT = 2
    SLIDING_WINDOW = 3
    RECURRENT = 4
    CONTINUATION = 5


PAGED_KINDS = frozenset({HistoryKind.PAGED_KV, HistoryKind.PAGED_LATENT, HistoryKind.SLIDING_WINDOW})


@dataclass(frozen=True)
class ProgramVariant:
    """One captured program at one capacity.

    `batch_capacity` is B (request rows), `packed_token_capacity` P (total token rows). For
    SPECULATIVE programs `draft_tokens` is D (proposal draws), `verify_tokens` W (per-lane target
    capacity including the pending token). `device_pending` says the pending token is a readable
    device state view (so a second frame can consume it without host feedback).
    `draft_lag_tokens` is the completion cursor's lag, or None when the program has no draft cursor.
    `admits_slots` (DECODE): a row of it may be a slot generation's first one (a prefix-cache or
    shared-prompt admission with one token left); False when the program only reads per-slot state
    that prompt programs initialize (e.g. mrope rotary deltas), so such a row must run in a prompt
    program.
    """

    name: str
    operation: Operation
    batch_capacity: int
    packed_token_capacity: int
    draft_tokens: int = 0
    verify_tokens: int = 1
    length_source: LengthSource = LengthSource.QUERY_LENGTH
    device_pending: bool = True
    draft_lag_tokens: int | None = None
    admits_slots: bool = True

    @property
    def lane_limit(self) -> int:
        """Most tokens one lane may emit in one round: min(D + 1, W), or 1 outside speculation."""
        if self.operation != Operation.SPECULATIVE:
            return 1
        return min(self.draft_tokens + 1, self.verify_tokens)

    def fits(self, num_rows: int, num_tokens: int) -> bool:
        return num_rows <= self.batch_capacity and num_tokens <= self.packed_token_capacity


@dataclass(frozen=True)
class HistoryRegion:
    """One declared history region. `tokens_per_record` is the compression ratio of paged planes."""

    name: str
    kind: HistoryKind
    tokens_per_record: int = 1
    window_tokens: int = 0


@dataclass(frozen=True)
class PageTableView:
    """A page-table destination; `page_offset` extra pages it references beyond the frontier;
    `region` the history region its ids address."""

    name: str
    page_offset: int = 0
    region: str = ""


@dataclass(frozen=True)
class StorageLayout:
    """The storage contract the page allocator serves.

    One page id spans every paged region but `window_region`: a SLIDING_WINDOW region whose planes
    are sized by their own page count (WINDOW_PAGES) owns a second page-id space, with a table per
    request of its own (same logical pages) whose pages are released as they fall out of its window
    (`helios.runtime.cache.window_pages`). "" when every paged region shares the one space.
    `restores_through_programs`: the core copies slot state to and from snapshot rows with its own
    SNAPSHOT and RESTORATION programs, so a snapshot row holds state in the core's form, which only
    its RESTORATION program reads back (`helios.runtime.cache.snapshots`).
    """

    page_tokens: int
    regions: tuple[HistoryRegion, ...] = (HistoryRegion("kv", HistoryKind.PAGED_KV),)
    views: tuple[PageTableView, ...] = (PageTableView("kv"),)
    window_region: str = ""
    restores_through_programs: bool = False

    def __post_init__(self) -> None:
        if self.window_region:
            region = next((r for r in self.regions if r.name == self.window_region), None)
            if region is None or region.kind != HistoryKind.SLIDING_WINDOW or region.window_tokens <= 0:
                raise LoadError(f"region {self.window_region!r} owns page ids but is no sliding window")
            if any(v.page_offset for v in self.views if v.region == self.window_region):
                raise LoadError(f"a view of the window region {self.window_region!r} declares a page offset")

    @property
    def window(self) -> HistoryRegion | None:
        """The region with its own page-id space, or None."""
        return next((r for r in self.regions if r.name == self.window_region), None) if self.window_region else None

    @property
    def pages_capture_state(self) -> bool:
        """True when complete pages alone hold a prefix's state, so page-level reuse is exact.

        Recurrent or continuation regions carry state outside pages; such prefixes are reused
        only through snapshots taken at exact endpoints.
        """
        return all(region.kind in PAGED_KINDS for region in self.regions)

    @cached_property
    def lookahead_pages(self) -> int:
        return max((view.page_offset for view in self.views), default=0)

    @cached_property
    def release_window(self) -> int:
        """Token extent beyond which history pages are released; 0 when every page is kept.

        A page id spans every paged region, so a page can go only when it is outside every
        region's window: only when all paged regions are sliding windows, and then the widest
        window decides. One paged key/value or latent region (a full-attention layer) keeps all.
        """
        paged = [region for region in self.regions
                 if region.kind in PAGED_KINDS and region.name != self.window_region]
        if not paged or any(region.kind != HistoryKind.SLIDING_WINDOW for region in paged):
            return 0
        return max(region.window_tokens for region in paged)

    def releasable_pages(self, num_committed: int) -> int:
        """Leading pages that no query at a position >= `num_committed` reads: a query at p reads
        positions (p - window, p], so positions below num_committed - window + 1 are never read
        again (a shifted view's extra pages keep as many more)."""
        if self.release_window <= 0:
            return 0
        unread = max(0, num_committed - self.release_window + 1)
        return max(0, unread // self.page_tokens - self.lookahead_pages)

    def pages_for(self, num_tokens: int) -> int:
        """Page-table entries a request needs to hold `num_tokens` positions in every view."""
        if num_tokens <= 0:
            return 0
        return -(-num_tokens // self.page_tokens) + self.lookahead_pages


@dataclass(frozen=True)
class CacheGeometry:
    """Physical cache capacities chosen at load (they replace preparation's working-set counts)."""

    layout: StorageLayout
    num_pages: int
    max_pages_per_request: int
    num_continuation_rows: int = 0
    num_host_slots: int = 0
    identity: bytes = b""
    num_window_pages: int = 0  # pages of the layout's window region (its own page ids); 0 without one

    @property
    def page_tokens(self) -> int:
        return self.layout.page_tokens


@dataclass(frozen=True)
class StopLimits:
    """Host-stop limits a prepared request may not exceed."""

    max_stop_strings: int = 4
    max_stop_bytes: int = 4096
    max_stop_sequences: int = 16
    max_stop_sequence_tokens: int = 64


@dataclass(frozen=True)
class Capacities:
    """Selected serving capacities. `max_active` is the selected concurrency (request slots)."""

    max_active: int
    context_tokens: int
    prefill_tokens: int
    vocab_size: int
    variants: tuple[ProgramVariant, ...]
    cache: CacheGeometry
    input_vocab_size: int = 0  # 0: same as vocab_size
    queue_capacity: int = 256
    stops: StopLimits = field(default_factory=StopLimits)
    token_logprobs: int = 0  # alternatives the loaded token-logprobs programs return per row (0: none loaded)
    speculative_logprobs: bool = False  # every SPECULATIVE program has a token-logprobs twin
    speculative_logit_bias: bool = False  # every SPECULATIVE program applies a lane's logit bias
    logit_bias_width: int = 0  # logit-bias entries one request may hold (the programs' input width; 0: none)
    eos_width: int = 0  # EOS ids one request may hold where programs match them on the device (0: any number)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def page_tokens(self) -> int:
        return self.cache.page_tokens

    @property
    def input_limit(self) -> int:
        return self.input_vocab_size or self.vocab_size

    @cached_property
    def _by_operation(self) -> dict[Operation, tuple[ProgramVariant, ...]]:
        table: dict[Operation, list[ProgramVariant]] = {}
        for variant in self.variants:
            table.setdefault(variant.operation, []).append(variant)
        key = lambda v: (v.packed_token_capacity, v.batch_capacity, v.name)  # noqa: E731
        return {op: tuple(sorted(vs, key=key)) for op, vs in table.items()}

    def has(self, operation: Operation) -> bool:
        return operation in self._by_operation

    def limits(self, operation: Operation) -> tuple[int, int]:
        """(most rows, most packed tokens) over the variants of `operation`; (0, 0) if none."""
        variants = self._by_operation.get(operation, ())
        rows = max((v.batch_capacity for v in variants), default=0)
        tokens = max((v.packed_token_capacity for v in variants), default=0)
        return min(rows, self.max_active), tokens

    def select(self, operation: Operation, num_rows: int, num_tokens: int) -> ProgramVariant | None:
        """The smallest variant of `operation` holding the cohort, or None."""
        for variant in self._by_operation.get(operation, ()):
            if variant.fits(num_rows, num_tokens):
                return variant
        return None


def _validate(caps: Capacities) -> None:
    geometry = caps.cache
    positive = {
        "max_active": caps.max_active,
        "context_tokens": caps.context_tokens,
        "prefill_tokens": caps.prefill_tokens,
        "vocab_size": caps.vocab_size,
        "cache.page_tokens": geometry.page_tokens,
        "cache.num_pages": geometry.num_pages,
        "cache.max_pages_per_request": geometry.max_pages_per_request,
    }
    for name, value in positive.items():
        if value <= 0:
            raise LoadError(f"capacity {name} must be positive, got {value}")
    counts = {  # optional pools: 0 means none (a negative one would silently hold nothing)
        "cache.num_continuation_rows": geometry.num_continuation_rows,
        "cache.num_host_slots": geometry.num_host_slots,
        "cache.num_window_pages": geometry.num_window_pages,
    }
    for name, value in counts.items():
        if value < 0:
            raise LoadError(f"capacity {name} must not be negative, got {value}")
    if caps.queue_capacity <= 0:
        raise LoadError(f"capacity queue_capacity must be positive, got {caps.queue_capacity}")
    if geometry.max_pages_per_request > geometry.num_pages:
        raise LoadError("cache.max_pages_per_request exceeds cache.num_pages")
    if bool(geometry.layout.window_region) != (geometry.num_window_pages > 0):
        raise LoadError("cache.num_window_pages must be positive exactly when the layout has a window region")
    for variant in caps.variants:
        _validate_variant(variant)
    decode_rows = max(caps.limits(Operation.DECODE)[0], caps.limits(Operation.MIXED)[0])
    if decode_rows < caps.max_active:
        raise LoadError(f"no decode-capable variant holds the selected concurrency {caps.max_active}")
    prefill_tokens = max(caps.limits(Operation.PREFILL)[1], caps.limits(Operation.MIXED)[1])
    if prefill_tokens < caps.prefill_tokens:
        raise LoadError(f"no prefill-capable variant holds the prefill extent {caps.prefill_tokens}")


def _validate_variant(variant: ProgramVariant) -> None:
    if variant.operation == Operation.UNSPECIFIED:
        raise LoadError(f"variant {variant.name}: unspecified operation")
    if variant.batch_capacity <= 0 or variant.packed_token_capacity < variant.batch_capacity:
        raise LoadError(f"variant {variant.name}: needs 0 < batch_capacity <= packed_token_capacity")
    if variant.operation == Operation.SPECULATIVE:
        if variant.draft_tokens < 0 or variant.verify_tokens < 1:
            raise LoadError(f"variant {variant.name}: needs draft_tokens >= 0 and verify_tokens >= 1")
        if variant.length_source == LengthSource.UNSPECIFIED:
            raise LoadError(f"variant {variant.name}: speculative program binds no length source")
    elif variant.operation == Operation.DECODE and variant.packed_token_capacity != variant.batch_capacity:
        raise LoadError(f"variant {variant.name}: a decode program packs one token per row")
