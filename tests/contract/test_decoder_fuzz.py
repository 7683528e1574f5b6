"""Property tests: whatever bytes or JSON reach the decoder, the only exception that escapes
is `ContractError` (never DecodeError, KeyError, IndexError, ZeroDivisionError, ...).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.documents import example_doc, example_text
from helios.contract import PreparedContract
from helios.contract.files import load_bytes
from helios.errors import ContractError

EXAMPLE = PreparedContract.from_json(example_text())
CONTRACT_BYTES, MANIFEST_BYTES = EXAMPLE.encode()
FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def only_contract_errors(call, *args) -> None:
    try:
        call(*args)
    except ContractError as error:
        assert isinstance(error.path, str)


@st.composite
def mutated(draw, original: bytes) -> bytes:
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 6))):
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        action = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if action == "flip" and data:
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif action == "set" and data:
            data[position] = draw(st.integers(0, 255))
        elif action == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and data:
            del data[position : position + draw(st.integers(1, 8))]
        elif action == "truncate":
            del data[position:]
    return bytes(data)


@FUZZ
@given(st.binary(max_size=600), st.binary(max_size=600))
def test_random_bytes(contract_bytes, manifest_bytes):
    only_contract_errors(PreparedContract.decode, contract_bytes, manifest_bytes)


@FUZZ
@given(mutated(CONTRACT_BYTES))
def test_mutated_contract_bytes(contract_bytes):
    only_contract_errors(PreparedContract.decode, contract_bytes, MANIFEST_BYTES)


@FUZZ
@given(mutated(MANIFEST_BYTES))
def test_mutated_manifest_bytes(manifest_bytes):
    only_contract_errors(PreparedContract.decode, CONTRACT_BYTES, manifest_bytes)


@FUZZ
@given(mutated(EXAMPLE.to_bundle()))
def test_mutated_bundle_file(data):
    only_contract_errors(load_bytes, data)


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, path + (i,))
    if path:
        yield path


LEAVES = list(_leaves(example_doc()))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(LEAVES), JSON_VALUES), min_size=1, max_size=3))
def test_mutated_json_values(replacements):
    doc = example_doc()
    for path, value in replacements:
        target = doc
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed this location
    only_contract_errors(PreparedContract.from_json, json.dumps(doc))


@FUZZ
@given(st.text(max_size=200))
def test_random_text(text):
    only_contract_errors(PreparedContract.from_json, text)
