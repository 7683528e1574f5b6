"""At least one invalid document per rule: each is rejected with `ContractError` naming the
expected field path. The documents are mutations of examples/contract.json (see cases_*.py).
"""

from __future__ import annotations

import json

import pytest

from contract.cases_contract import CASES as CONTRACT_CASES
from contract.cases_graphs import CASES as GRAPH_CASES
from contract.cases_manifest import CASES as MANIFEST_CASES
from contract.documents import example_doc
from helios.contract import PreparedContract
from helios.errors import ContractError

ALL_CASES = CONTRACT_CASES + GRAPH_CASES + MANIFEST_CASES


def test_case_names_are_distinct_and_plentiful():
    names = [case.__name__ for case in ALL_CASES]
    assert len(names) == len(set(names))
    assert len(names) >= 40


@pytest.mark.parametrize("mutate", ALL_CASES, ids=lambda case: case.__name__)
def test_rejected_with_field_path(mutate):
    doc = example_doc()
    expected = mutate(doc)
    with pytest.raises(ContractError) as caught:
        PreparedContract.from_json(json.dumps(doc))
    assert caught.value.path == expected, str(caught.value)
    assert caught.value.reason
    assert str(caught.value).startswith(expected)
