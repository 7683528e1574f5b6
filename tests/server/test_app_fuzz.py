"""Schema-driven fuzzing of the completion endpoints (what schemathesis would do), in-process over a
real tiny core.

Bodies are generated from the app's own OpenAPI document: schema-valid bodies, and mutations of
them (a required field dropped, an unknown field added, a value of the wrong type) plus bodies that
are not JSON objects at all. For every one the server must answer with a documented status and an
OpenAI-style body: 200 (a complete JSON body or an SSE stream that ends in ``[DONE]`` or in one
error event), 400, 429 or 503 for scheduler admission rejection; never 500, never a crash. A body
the document accepts must never fail schema validation (the document describes what the server
accepts, no more and no less).
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helios.contract.settings import SamplingOptions, StartupOptions
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions
from helios.server.app import create_app
from support.server_core import SERVED_ID, served_tiny_core
from support.sweeps import swept

PATHS = ("/v1/chat/completions", "/v1/completions")
# Generated bodies: 100 by default (both endpoints, schema-valid and mutated bodies, every status the module text
# names), 200 with HELIOS_OPENAPI_FUZZ_SWEEP=1 (more bodies through the same validation and generation paths, as
# test_openapi_schemathesis' sweep draws).
FUZZ_EXAMPLES = 200 if swept("HELIOS_OPENAPI_FUZZ_SWEEP") else 100
SCHEMA_VIOLATION = "invalid request body:"
JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


class SchemaStrategies:
    """Hypothesis strategies for the JSON Schema subset FastAPI/pydantic emit (refs, anyOf/oneOf,
    const/enum, objects with required/optional/additional properties, arrays, bounded scalars)."""

    def __init__(self, components: dict):
        self._components = components

    def of(self, schema: dict, depth: int = 0) -> st.SearchStrategy:
        if "$ref" in schema:
            return st.deferred(lambda: self.of(self._components[schema["$ref"].rsplit("/", 1)[1]], depth + 1))
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return st.one_of([self.of(option, depth) for option in schema[key]])
        kind = schema.get("type")
        if kind is None:
            return JSON_VALUES
        return getattr(self, "_" + kind)(schema, depth)

    def _null(self, schema, depth):
        return st.none()

    def _boolean(self, schema, depth):
        return st.booleans()

    def _integer(self, schema, depth):
        low = _bound(schema, "minimum", "exclusiveMinimum", 1, -(2**63))
        high = _bound(schema, "maximum", "exclusiveMaximum", -1, 2**63)
        small = st.integers(max(low, -3), min(high, max(low, -3) + 12))
        edges = st.sampled_from(sorted({low, high, max(low, min(high, 2**31))}))
        return small | edges

    def _number(self, schema, depth):
        low, high = schema.get("minimum"), schema.get("maximum")
        exclusive_low = schema.get("exclusiveMinimum")
        floats = st.floats(
            min_value=low if low is not None else exclusive_low, max_value=high,
            exclude_min=low is None and exclusive_low is not None, allow_nan=False, allow_infinity=False,
        )
        return floats

    def _string(self, schema, depth):
        low, high = schema.get("minLength", 0), min(schema.get("maxLength", 24), 24)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
        return st.text(min_size=low, max_size=max(low, high))

    def _array(self, schema, depth):
        low = schema.get("minItems", 0)
        high = min(schema.get("maxItems", low + 3), low + (3 if depth < 3 else 1))
        return st.lists(self.of(schema.get("items", {}), depth + 1), min_size=low, max_size=high)

    def _object(self, schema, depth):
        properties = schema.get("properties", {})
        if not properties:
            extra = schema.get("additionalProperties", True)
            if extra is False:
                return st.just({})
            values = JSON_VALUES if extra is True else self.of(extra, depth + 1)
            names = schema.get("propertyNames")
            keys = self._string(names, depth + 1) if names else st.text(max_size=8)
            return st.dictionaries(keys, values, max_size=min(3, schema.get("maxProperties", 3)))
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {name: self.of(sub, depth + 1) for name, sub in properties.items() if name in required},
            optional={name: self.of(sub, depth + 1) for name, sub in properties.items() if name not in required},
        )


def _bound(schema: dict, inclusive: str, exclusive: str, step: int, default: int) -> int:
    if inclusive in schema:
        return int(schema[inclusive])
    if exclusive in schema:
        return int(schema[exclusive]) + step
    return default


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # a short default output keeps generations cheap; explicit max_tokens still apply
    startup = StartupOptions(sampling=SamplingOptions(max_output_tokens=4))
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, RuntimeOptions(LoadOptions(startup), queue_capacity=4),
                          frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served)


@pytest.fixture(scope="module")
def bodies(runner, app):
    async def document():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return (await client.get("/openapi.json")).json()

    openapi = runner.run(document())
    schemas = SchemaStrategies(openapi["components"]["schemas"])
    by_path = {}
    for path in PATHS:
        schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        required = set(openapi["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]["required"])
        full = schemas.of(schema).map(_served_model_mostly)
        by_path[path] = full | full.flatmap(lambda body, required=required: _few_optional(body, required))
    return by_path


def _few_optional(body: dict, required: set) -> st.SearchStrategy:
    """The body with at most three of its optional fields, so more bodies reach generation."""
    optional = sorted(set(body) - required)
    keep = st.lists(st.sampled_from(optional), max_size=3, unique=True) if optional else st.just([])
    return keep.map(lambda names: {k: v for k, v in body.items() if k in required or k in names})


def _served_model_mostly(body: dict) -> dict:
    # most bodies name the served model so they get past the model check into preparation
    if len(body.get("model", "")) % 5 != 1:
        body = {**body, "model": SERVED_ID}
    return body


@st.composite
def mutated(draw, valid: st.SearchStrategy) -> bytes:
    body = dict(draw(valid))
    how = draw(st.sampled_from(["drop", "add", "retype", "raw"]))
    if how == "drop" and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    elif how == "add":
        body[draw(st.text(min_size=1, max_size=10))] = draw(JSON_VALUES)
    elif how == "retype" and body:
        body[draw(st.sampled_from(sorted(body)))] = draw(JSON_VALUES)
    elif how == "raw":
        return draw(st.binary(max_size=40) | JSON_VALUES.map(lambda v: json.dumps(v).encode()))
    return json.dumps(body).encode()


async def send(app, path: str, content: bytes) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
        return await client.post(path, content=content, headers={"content-type": "application/json"})


def check_response(response: httpx.Response, is_schema_valid: bool) -> None:
    status = response.status_code
    assert status in (200, 400, 404, 429, 503), (status, response.text[:500])
    if status != 200:
        error = response.json()["error"]
        assert error["code"] == status and isinstance(error["message"], str)
        if status == 404:  # a model this server does not serve, and only that
            assert error["param"] == "model" and "is not served here" in error["message"], error
        if status == 503:
            assert error["type"] == "admission_rejected"
        if status == 400 and is_schema_valid:
            assert not error["message"].startswith(SCHEMA_VIOLATION), error["message"]
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [block for block in response.text.split("\n\n") if block]
        assert events[-1] == "data: [DONE]" or (
            events[-1].startswith("event: error") and "admission_rejected" in events[-1]
        ), events[-1]
        assert sum(block.startswith("event: error") for block in events) <= 1
        return
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")


@settings(max_examples=FUZZ_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_requests_never_fail_the_server(runner, app, served, bodies, data):
    path = data.draw(st.sampled_from(PATHS))
    is_schema_valid = data.draw(st.booleans())
    if is_schema_valid:
        content = json.dumps(data.draw(bodies[path])).encode()
    else:
        content = data.draw(mutated(bodies[path]))
    check_response(runner.run(send(app, path, content)), is_schema_valid)
    assert served.is_healthy
