"""Schemathesis against the app's own ``/openapi.json``, in-process (ASGI) over a real tiny core.

Schemathesis' engine runs every operation of the document through its examples, coverage
(boundary values of every field, wrong types, missing and unexpected fields, unexpected methods)
and fuzzing phases, schema-valid and schema-violating data, seeded and deterministic, and checks
each response for:

- no 5xx (`not_a_server_error`);
- no undocumented acceptance: a body that violates the document is rejected
  (`negative_data_rejection`), and a body the document allows is never refused as a schema
  violation (`documented_data_accepted`, below) nor answered with an undocumented status
  (`positive_data_acceptance`);
- documented statuses, content types and response bodies (`status_code_conformance`,
  `content_type_conformance`, `response_schema_conformance`).

One thing the document cannot express: a schema-valid body can still be refused with 400 by rules
that combine fields or depend on the served model (the model name must be one this server serves,
`logit_bias` and stop ids must be in the vocabulary, the prompt plus `max_tokens` must fit the
context, stops and structured output cannot be combined, the core must have the programs a field
needs). So `positive_data_acceptance` expects 400 among its statuses, and `documented_data_accepted`
narrows it: those rules' 400s carry their own messages, while a 400 saying ``invalid request body:``
is the schema validator refusing the body, which for a body the document allows is a mismatch
between the document and the server.

Run: ``PYTHONPATH=src python -m pytest -q tests/server/test_openapi_schemathesis.py``.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from schemathesis import Case
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import Failure
from schemathesis.engine import events, from_schema
from schemathesis.generation import GenerationMode

from helios.contract.settings import SamplingOptions, StartupOptions
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, tiny_core
from support.sweeps import swept

SCHEMA_VIOLATION = "invalid request body:"
# the checks of the module text (any other schemathesis check stays off)
CHECKS = ("not_a_server_error", "negative_data_rejection", "positive_data_acceptance", "documented_data_accepted",
          "status_code_conformance", "content_type_conformance", "response_schema_conformance")
# 400: the cross-field and model-dependent rules of the module text; 429/503: admission limits
POSITIVE_STATUSES = ["2xx", "400", "404", "429", "503"]
# Fuzzing examples per operation: 15 by default (every operation, generation and rejections are reached, as
# test_schemathesis_finds_the_document_and_the_server_agree asserts: 5 chat and 8 text completions generate, the
# coverage phase's boundary values and wrong types bring the 400s), 50 with HELIOS_OPENAPI_FUZZ_SWEEP=1 (more drawn
# bodies through the same validation and generation paths).
MAX_EXAMPLES = 50 if swept("HELIOS_OPENAPI_FUZZ_SWEEP") else 15


def engine_config(checks=CHECKS, max_examples: int = MAX_EXAMPLES) -> SchemathesisConfig:
    """Seeded and deterministic (a run is reproducible); few fuzzing examples per operation, so
    the run takes seconds; no stateful phase (the API has no resources to link)."""
    enabled = {name: {"enabled": True} for name in checks}
    if "positive_data_acceptance" in enabled:
        enabled["positive_data_acceptance"]["expected-statuses"] = POSITIVE_STATUSES
    return SchemathesisConfig.from_dict({
        "seed": 20,
        "generation": {"deterministic": True, "database": "none", "max-examples": max_examples},
        "phases": {"stateful": {"enabled": False}},
        "checks": {"enabled": False, **enabled},
    })


@schemathesis.check
def documented_data_accepted(ctx, response, case: Case) -> bool | None:
    """A body the document allows is never refused by the schema validator (see the module text)."""
    if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
        return None
    if response.status_code == 400 and _error_message(response).startswith(SCHEMA_VIOLATION):
        raise Failure(operation=case.operation.label, title="Documented data rejected",
                      message=f"a schema-valid body got a schema violation: {_error_message(response)}")
    return None


def _error_message(response) -> str:
    try:
        return str(json.loads(response.content)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""


def run_schemathesis(app, config: SchemathesisConfig) -> tuple[list[str], dict[tuple[str, int], int]]:
    """Schemathesis' engine over `app`'s document: each distinct failure as one line, and how
    many responses each (operation, status) got."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    schema.hook("map_body")(_served_model_mostly)
    failures, statuses = {}, {}
    for event in from_schema(schema).execute():
        if isinstance(event, (events.NonFatalError, events.FatalError)):
            failures[repr(event)] = f"engine error: {event!r}"
        if not isinstance(event, events.ScenarioFinished):
            continue
        recorder = event.recorder
        for interaction in recorder.interactions.values():
            if interaction.response is not None:
                key = (recorder.label, interaction.response.status_code)
                statuses[key] = statuses.get(key, 0) + 1
        for case_id, nodes in recorder.checks.items():
            for node in nodes:
                if node.failure_info is not None:
                    failure = node.failure_info.failure
                    body = json.dumps(getattr(recorder.cases[case_id].value, "body", None), default=str)[:400]
                    failures.setdefault((recorder.label, node.name, failure.title),
                                        f"{recorder.label} {node.name}: {failure.title}: {failure.message} BODY {body}")
    return list(failures.values()), statuses


def _served_model_mostly(_ctx, body):
    # most bodies name the served model so they get past the model check into generation
    if isinstance(body, dict) and "model" in body and len(str(body["model"])) % 3 != 1:
        body["model"] = SERVED_ID
    return body


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    # a short default output keeps generations cheap; explicit max_tokens still apply
    startup = StartupOptions(sampling=SamplingOptions(max_output_tokens=4))
    runtime = build_runtime(opened, RuntimeOptions(LoadOptions(startup), queue_capacity=4))
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=2)
    yield served
    served.shutdown()


def test_schemathesis_finds_the_document_and_the_server_agree(served):
    failures, statuses = run_schemathesis(create_app(served), engine_config())
    assert not failures, "\n\n".join(failures)
    # the run reached every operation, and generation (not only rejections)
    labels = {label for label, _ in statuses}
    assert labels == {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses", "GET /v1/models",
                      "GET /v1/models/{model_id}", "GET /health", "GET /metrics", "POST /tokenize",
                      "POST /detokenize", "GET /version"}, labels
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize"):
        assert statuses.get((f"POST {path}", 200), 0) >= 3, statuses
        assert statuses.get((f"POST {path}", 400), 0) >= 50, statuses


def test_the_document_states_integer_bounds_exactly(served):
    # pydantic writes 2**63 as a float (9.223372036854776e18), which is not the bound the server keeps
    document = create_app(served).openapi()
    seed = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["seed"]["anyOf"][0]
    assert seed == {"type": "integer", "minimum": -(2**63), "exclusiveMaximum": 2**63}
    assert all(type(seed[key]) is int for key in ("minimum", "exclusiveMaximum"))


class _Documented(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: int


def _toy_app(answer) -> FastAPI:
    """An app whose document is `_Documented` but whose handler answers whatever `answer` says."""
    toy = FastAPI()
    document = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": _Documented.model_json_schema()}}}}

    @toy.post("/echo", openapi_extra=document)
    async def echo(request: Request) -> JSONResponse:
        return answer(await request.body())

    return toy


# the toy app documents no statuses: the checks about statuses, types and bodies stay off
TOY_CHECKS = ("not_a_server_error", "negative_data_rejection", "documented_data_accepted")


def _toy_failures(answer) -> str:
    failures, statuses = run_schemathesis(_toy_app(answer), engine_config(TOY_CHECKS, max_examples=10))
    assert statuses  # the run sent requests
    return "\n".join(failures)


def test_the_run_catches_an_undocumented_acceptance():
    failures = _toy_failures(lambda body: JSONResponse({"ok": True}))  # takes any body
    assert "negative_data_rejection" in failures and "Schema-violating request accepted" in failures


def test_the_run_catches_a_server_error():
    failures = _toy_failures(lambda body: JSONResponse({"error": "boom"}, status_code=500))
    assert "not_a_server_error" in failures and "Server error" in failures


def test_the_run_catches_documented_data_refused_as_a_schema_violation():
    refuse = {"error": {"message": SCHEMA_VIOLATION + " x: no", "type": "invalid_request_error", "code": 400}}
    failures = _toy_failures(lambda body: JSONResponse(refuse, status_code=400))
    assert "documented_data_accepted: Documented data rejected" in failures


def test_the_toy_app_that_keeps_its_document_passes():
    def strict(body: bytes) -> JSONResponse:
        try:
            _Documented.model_validate_json(body, strict=True)
        except ValueError:
            return JSONResponse({"error": {"message": "invalid"}}, status_code=400)
        return JSONResponse({"ok": True})

    assert _toy_failures(strict) == ""
