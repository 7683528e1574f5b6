"""The decode cohort's packing shortcuts give the per-row path's values: row columns
(`row_sources.ROW_COLUMNS`) equal `ROW_SOURCES` row by row, host page tables written through one
view (`fill_page_tables`) equal `fill_admission` row by row, and the rows key is the per-row tuple
(interned across steps by `KeptValues`)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from helios.contract import serving_pb2 as S
from helios.runtime.execution.bindings import Binding
from helios.runtime.execution.kept_values import KeptValues, rows_key_of
from helios.runtime.execution.pack_staging import Staging
from helios.runtime.execution.row_sources import ROW_COLUMNS, ROW_SOURCES, fill_admission, fill_page_tables
from helios.runtime.records.plan import PlanRow
from helios.runtime.records.request import RequestSpec

SLOTS, MAX_PAGES = 6, 12


def scripted_rows(seed: int, count: int = 6) -> list[PlanRow]:
    """Rows of every kind a step holds: decode, prompt chunks, a second frame's (token on the
    device), a lane without tokens, admitting rows with whole tables, rows gaining pages."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        admits = rng.random() < 0.3
        start = rng.randrange(0, 40)
        query = rng.choice((1, 1, 3))
        on_device = query == 1 and rng.random() < 0.2
        tokens = () if on_device or rng.random() < 0.1 else tuple(rng.randrange(100) for _ in range(query))
        first = 0 if admits else rng.randrange(0, 6)
        pages = tuple(rng.sample(range(50), rng.randrange(0, 4)))
        rows.append(PlanRow(f"r{index}", index, rng.randrange(1, 5), tokens, on_device, start, query, first, pages,
                            rng.random() < 0.8, rng.randrange(9), 1, admits, rng.random() < 0.2))
    return rows


@pytest.mark.parametrize("seed", range(8))
def test_row_columns_equal_the_row_sources(seed):
    rows = scripted_rows(seed)
    for source, column in ROW_COLUMNS.items():
        assert column(rows) == [ROW_SOURCES[source](row, None) for row in rows], S.ValueSource.Name(source)
    assert column(()) == []


def _staging():
    buffers = {"page_table": torch.full((SLOTS, MAX_PAGES), 7, dtype=torch.int32)}
    views = [SimpleNamespace(buffer="page_table", destination="page_table", source=S.VALUE_SOURCE_PAGE_TABLE,
                             indexing=S.INDEXING_PHYSICAL_REQUEST_ROW, offset=0, padding=0, constant=0)]
    return Staging(SimpleNamespace(graphs={"decode": SimpleNamespace(bindings=views)}), buffers, None), buffers


@pytest.mark.parametrize("seed", range(8))
def test_host_page_tables_through_one_view_equal_row_by_row(seed):
    rows = [row for row in scripted_rows(seed) if row.admits or row.new_page_ids]
    request = RequestSpec("r", (1,), 8)
    binding = Binding("page_table", "page_table", S.VALUE_SOURCE_PAGE_TABLE, S.INDEXING_PHYSICAL_REQUEST_ROW, 0, -1, 0)
    tables = []
    for fill in ("one view", "row by row"):
        staging, buffers = _staging()
        staging.begin(0)
        if fill == "one view":
            fill_page_tables(binding, buffers["page_table"], [(row, request) for row in rows], staging)
        else:
            for row in rows:
                fill_admission(binding, buffers["page_table"], row, request, staging)
        tables.append(buffers["page_table"])
    assert torch.equal(tables[0], tables[1]) and not torch.equal(tables[0], torch.full_like(tables[0], 7))


def test_an_entry_past_the_table_fails_either_way():
    staging, buffers = _staging()
    binding = Binding("page_table", "page_table", S.VALUE_SOURCE_PAGE_TABLE, S.INDEXING_PHYSICAL_REQUEST_ROW, 0, -1, 0)
    row = PlanRow("r", 1, 1, (5,), False, 0, 1, MAX_PAGES - 1, (3, 4), True, 0, 1, False, False)
    with pytest.raises(ValueError):
        fill_page_tables(binding, buffers["page_table"], [(row, RequestSpec("r", (1,), 8))], staging)
    with pytest.raises(ValueError):
        fill_admission(binding, buffers["page_table"], row, RequestSpec("r", (1,), 8), staging)


def test_the_rows_key_is_each_rows_identity_and_interned_across_steps():
    rows = scripted_rows(3)
    key = rows_key_of(rows)
    assert key == tuple((r.request_id, r.slot, r.generation, r.query_len, r.samples) for r in rows)
    kept = KeptValues({}, ())
    first = kept.interned(key)
    again = kept.interned(rows_key_of([row._replace(start_pos=row.start_pos + 1) for row in rows]))
    assert first is key and again is key  # the next step's equal key is the kept one
    other = rows_key_of(rows[:-1])
    assert kept.interned(other) is other
