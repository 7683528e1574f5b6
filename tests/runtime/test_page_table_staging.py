"""Page-table entries of a device model go through pinned per-frame staging (asynchronous copies).

The staging must hold every entry one step can write to every device page table (a core with a
draft model binds two), so that no step falls back to a synchronous copy. ``meta`` tensors stand in
for a device here: anything off the CPU takes the staged path.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from helios.contract import serving_pb2 as S
from helios.runtime.execution.bindings import Binding
from helios.runtime.execution.pack_staging import Staging
from helios.runtime.execution.row_sources import fill_admission
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.plan import PlanRow

SLOTS, MAX_PAGES = 8, 256


def _staging(tables):
    buffers = {name: torch.zeros(SLOTS, MAX_PAGES, dtype=torch.int32, device="meta") for name in tables}
    views = [SimpleNamespace(buffer=n, destination=n, source=S.VALUE_SOURCE_PAGE_TABLE,
                             indexing=S.INDEXING_PHYSICAL_REQUEST_ROW, offset=0, padding=0, constant=0) for n in tables]
    return Staging(SimpleNamespace(graphs={"prefill": SimpleNamespace(bindings=views)}), buffers, None), buffers, views


def test_one_step_admitting_every_slot_with_long_cached_prompts_is_staged_whole_in_both_tables():
    staging, buffers, views = _staging(("page_table", "draft_page_table"))
    request = RequestSpec("r", (1,), 8)
    pages = 201  # a 3,200-token cached prompt plus one new page, uploaded at admission
    rows = [PlanRow(f"r{i}", i, 1, (5,), False, 3200, 10, 0, tuple(range(i * pages, (i + 1) * pages)), True, 0, 1,
                    True, False) for i in range(SLOTS)]
    for frame in (0, 1):
        staging.begin(frame)
        for view in views:
            binding = Binding(view.destination, view.buffer, view.source, view.indexing, 0, 0, 0)
            for row in rows:
                fill_admission(binding, buffers[view.buffer], row, request, staging)
        # All staged (no synchronous fallback); an admitted row is staged whole, padding included.
        assert staging._entries_used == 2 * SLOTS * MAX_PAGES


def test_the_frames_stage_into_separate_pinned_entries():
    staging, _, _ = _staging(("page_table",))
    staging.begin(0)
    first = staging._entries
    staging.begin(1)
    assert staging._entries.data_ptr() != first.data_ptr()
    staging.begin(2)
    assert staging._entries.data_ptr() == first.data_ptr()


def _page_row(admits: bool, start: int, pages) -> PlanRow:
    return PlanRow("r", 2, 1, (5,), False, 0, 1, start, tuple(pages), True, 0, 1, admits, False)


def test_an_admitted_row_is_one_staged_copy_with_padding_around_its_entries_then_new_entries_only():
    staging, buffers, views = _staging(("page_table",))
    binding = Binding("page_table", "page_table", views[0].source, views[0].indexing, 0, -1, 0)
    request = RequestSpec("r", (1,), 8)
    staging.begin(0)
    fill_admission(binding, buffers["page_table"], _page_row(True, 0, (7, 8, 9)), request, staging)
    assert staging._entries[:MAX_PAGES].tolist() == [7, 8, 9] + [-1] * (MAX_PAGES - 3)
    fill_admission(binding, buffers["page_table"], _page_row(False, 3, (10,)), request, staging)
    assert staging._entries_used == MAX_PAGES + 1 and staging._entries[MAX_PAGES].item() == 10


def test_a_host_page_table_row_gets_the_same_values():
    table = torch.full((SLOTS, MAX_PAGES), 55, dtype=torch.int32)
    staging = Staging(SimpleNamespace(graphs={}), {"page_table": table}, None)
    binding = Binding("page_table", "page_table", S.VALUE_SOURCE_PAGE_TABLE, S.INDEXING_PHYSICAL_REQUEST_ROW, 0, -1, 0)
    request = RequestSpec("r", (1,), 8)
    fill_admission(binding, table, _page_row(True, 0, (7, 8, 9)), request, staging)
    fill_admission(binding, table, _page_row(False, 3, (10,)), request, staging)
    assert table[2].tolist() == [7, 8, 9, 10] + [-1] * (MAX_PAGES - 4) and table[1].eq(55).all()
