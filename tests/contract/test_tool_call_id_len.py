"""The frontend's `tool_call_id_len`: random alphanumeric tool-call ids of 8 to 64 characters (Mistral
templates render only nine), or 0 / absent, as in every core written before the field: ids are then
`call_<request id>_<index>`."""

from __future__ import annotations

import json

import pytest

from contract.documents import example_doc
from helios.contract import PreparedContract
from helios.errors import ContractError


def load(length: int | None) -> PreparedContract:
    doc = example_doc()
    if length is not None:
        doc["contract"]["model"]["frontend"]["tool_call_id_len"] = length
    return PreparedContract.from_json(json.dumps(doc))


@pytest.mark.parametrize("length, expected", [(None, 0), (0, 0), (8, 8), (9, 9), (64, 64)])
def test_absent_or_a_usable_length_loads(length, expected):
    assert load(length).contract.model.frontend.tool_call_id_len == expected


@pytest.mark.parametrize("length", [1, 7, 65, 1000])
def test_ids_too_short_to_stay_distinct_or_too_long_are_rejected(length):
    with pytest.raises(ContractError) as caught:
        load(length)
    assert caught.value.path == "contract.model.frontend.tool_call_id_len"
