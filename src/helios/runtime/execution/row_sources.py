"""Row values of shared packing (`helios.runtime.execution.packer`): the value of each per-row
source, the per-token values of packed sources, and the per-slot values written when a row admits
a slot or gains pages (PHYSICAL_REQUEST_ROW bindings, through the packer's host staging).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Callable, Mapping, Sequence

import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.cache.window_pages import UNHELD_PAGE_ID
from helios.runtime.execution.pack_staging import Staging
from helios.runtime.execution.pack_values import eos_row, host_array, padded
from helios.runtime.records.plan import PlanRow
from helios.runtime.records.request import RequestSpec

S = spb


ROW_SOURCES: Mapping[int, Callable[[PlanRow, RequestSpec], object]] = {
    S.VALUE_SOURCE_SLOT: lambda row, req: row.slot,
    S.VALUE_SOURCE_GENERATION: lambda row, req: row.generation,
    S.VALUE_SOURCE_QUERY_LENGTH: lambda row, req: row.query_len,
    S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: lambda row, req: row.query_len,
    S.VALUE_SOURCE_SAMPLING_DECISION: lambda row, req: int(row.samples),
    S.VALUE_SOURCE_CONSUMED_TOKEN_START: lambda row, req: row.start_pos,
    S.VALUE_SOURCE_CONSUMED_TOKEN_END: lambda row, req: row.start_pos + row.query_len,
    S.VALUE_SOURCE_SEED_BITS: lambda row, req: req.sampling.seed,
    S.VALUE_SOURCE_SAMPLING_PARAMETERS: lambda row, req: req.sampling.packed(),
    S.VALUE_SOURCE_OUTPUT_LIMIT: lambda row, req: req.max_output_tokens,
    S.VALUE_SOURCE_PENDING_TOKEN: lambda row, req: _pending_token(row, req),
}
_BIAS_SOURCES = {S.VALUE_SOURCE_LOGIT_BIAS_IDS, S.VALUE_SOURCE_LOGIT_BIAS_VALUES}  # written at admission


def _field(name: str) -> Callable[[Sequence[PlanRow]], list]:
    getter = itemgetter(PlanRow._fields.index(name))
    return lambda rows: list(map(getter, rows))


# The row sources that read the rows alone, as whole columns: each the list of `ROW_SOURCES`'s values
# of the rows (one pass per column instead of a call per row; the packer's usual decode step).
ROW_COLUMNS: Mapping[int, Callable[[Sequence[PlanRow]], list]] = {
    S.VALUE_SOURCE_SLOT: _field("slot"),
    S.VALUE_SOURCE_GENERATION: _field("generation"),
    S.VALUE_SOURCE_QUERY_LENGTH: _field("query_len"),
    S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: _field("query_len"),
    S.VALUE_SOURCE_CONSUMED_TOKEN_START: _field("start_pos"),
    S.VALUE_SOURCE_CONSUMED_TOKEN_END: lambda rows: [row.start_pos + row.query_len for row in rows],
    S.VALUE_SOURCE_SAMPLING_DECISION: lambda rows: [int(row.samples) for row in rows],
    S.VALUE_SOURCE_PENDING_TOKEN: lambda rows: [-1 if row.pending_on_device else (row.token_ids[0] if row.token_ids
                                                                                  else None) for row in rows],
}


def _pending_token(row: PlanRow, req: RequestSpec):
    """The token a one-token lane feeds next: the completed pending token of a generating lane, or
    the last prompt token of a lane whose prompt has one token left. A multi-token prompt lane
    feeds its first packed token (the program's override then changes nothing). A lane of a second
    frame feeds -1: its token exists only in the program's device state (``pending_token_view``)."""
    if row.pending_on_device:
        return -1
    return row.token_ids[0] if row.token_ids else None


def packed_values(source: int, row: PlanRow, req: RequestSpec) -> list:
    if source == S.VALUE_SOURCE_PROMPT_TOKENS:
        return list(row.token_ids)
    if source == S.VALUE_SOURCE_SAMPLING_DECISION:  # 1 on the token a sampling lane samples after
        count = len(row.token_ids) if row.token_ids else row.query_len
        return [int(row.samples and i == count - 1) for i in range(count)]
    if source == S.VALUE_SOURCE_PROMPT_POSITIONS:
        return list(range(row.start_pos, row.start_pos + len(row.token_ids)))
    prompt = req.prompt_ids  # SCORED_TARGET_TOKENS: the token each position predicts
    return [prompt[p + 1] if p + 1 < len(prompt) else None for p in range(row.start_pos, row.start_pos + len(row.token_ids))]


def fill_page_tables(binding, target: torch.Tensor, touched: Sequence[tuple[PlanRow, RequestSpec]],
                     staging: Staging) -> None:
    """`fill_admission` of a PAGE_TABLE binding for every touched (row, request): a host table's new
    entries of rows that do not admit are written through one numpy view of the table (the same
    entries `Staging.write_entries` writes through a view of each row)."""
    array = host_array(target) if not binding.window else None
    if array is None:
        for row, req in touched:
            fill_admission(binding, target, row, req, staging)
        return
    for row, req in touched:
        ids = row.new_page_ids
        if row.admits:
            fill_admission(binding, target, row, req, staging)
        elif ids:
            start = row.page_table_start
            array[row.slot, start:start + len(ids)] = ids


def fill_admission(binding, target: torch.Tensor, row: PlanRow, req: RequestSpec, staging: Staging) -> None:
    source, slot = binding.source, row.slot
    if source == S.VALUE_SOURCE_PAGE_TABLE:
        # A window table's released entries upload as a valid id its window masks (never read).
        ids = tuple(max(page, UNHELD_PAGE_ID) for page in row.new_window_ids) if binding.window else row.new_page_ids
        if row.admits:  # the whole row in one write: padding around the new entries
            staging.write_entries(target[slot], ids, row.page_table_start, binding.padding)
        elif ids:
            staging.write_entries(target[slot], ids, row.page_table_start)
    elif source in _BIAS_SOURCES:
        if row.admits:  # ids -1 padded, values 0 padded, to the buffer's width
            width = target.shape[-1]
            if len(req.logit_bias) > width:
                raise ValueError(f"{len(req.logit_bias)} logit-bias entries exceed the prepared {width}")
            column = 0 if source == S.VALUE_SOURCE_LOGIT_BIAS_IDS else 1
            values = [entry[column] for entry in req.logit_bias]
            # A row the packer's last write left padding needs no write for a request without bias.
            holds_padding = staging.padded_row(binding.buffer_name, slot, padded=not values)
            if values or not holds_padding:
                staging.write_row(binding.buffer_name, target[slot], values + [binding.padding] * (width - len(values)))
    elif source == S.VALUE_SOURCE_PROMPT_HISTOGRAM:
        # The whole prompt, prefix-cache hits included (their rows start past it). Only penalties
        # read it: a request without one leaves the row (`helios.runtime.execution.prompt_histogram`).
        if row.admits and req.sampling.penalised:
            staging.write_counts(binding.buffer_name, target[slot], req.prompt_ids)
    elif source == S.VALUE_SOURCE_EOS_IDS:
        if row.admits:
            staging.write_row(binding.buffer_name, target[slot], eos_row(req, target, binding))
    elif row.admits:
        value = ROW_SOURCES[source](row, req)
        if isinstance(value, tuple):
            staging.write_row(binding.buffer_name, target[slot], padded(value, target, binding))
        else:
            target[slot] = value + binding.offset

