"""Schemathesis against the app's own ``/openapi.json``, in-process (ASGI) over a real tiny core.

Every operation of the document is exercised with schemathesis' examples, coverage and fuzzing
phases in both generation modes (schema-valid and schema-violating data), seeded and
deterministic, and each response is checked for:

- no 5xx (`not_a_server_error`);
- undocumented acceptance: a body that violates the document must not be accepted
  (`negative_data_rejection`), and a body the document allows must not be refused as a schema
  violation (`documented_data_accepted`, below);
- documented statuses, content types and response bodies (`status_code_conformance`,
  `content_type_conformance`, `response_schema_conformance`).

schemathesis' own `positive_data_acceptance` is replaced by `documented_data_accepted` for one
reason the document cannot express: a schema-valid body can still be refused with 400 by rules
that combine fields or depend on the served model (the model name must be one this server serves,
`logit_bias` ids must be in the vocabulary, the prompt plus `max_tokens` must fit the context,
stops that cannot be combined). Those 400s carry the rule's own message; a 400 that says
``invalid request body:`` is the schema validator refusing the body, which for a body the document
allows is a mismatch between the document and the server, and fails the check.
"""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from hypothesis import HealthCheck, Phase, given, settings
import schemathesis
from schemathesis import Case
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.generation import GenerationMode

from helios.contract.settings import SamplingOptions, StartupOptions
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, tiny_core

SCHEMA_VIOLATION = "invalid request body:"
# schemathesis' configuration (its TOML keys): seeded and deterministic so a run is reproducible,
# few examples per operation so the whole run stays well under a minute on two cores.
CONFIG = {"seed": 20, "generation": {"deterministic": True, "database": "none"}}
MAX_EXAMPLES = 60


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


CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.negative_data_rejection,
    documented_data_accepted,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]


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


@pytest.fixture(scope="module")
def api(served):
    config = SchemathesisConfig.from_dict(CONFIG)
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(served), config=config)


def _served_model_mostly(case: Case) -> None:
    # most valid bodies name the served model so they get past the model check into generation
    if case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE:
        if isinstance(case.body, dict) and "model" in case.body and len(str(case.body["model"])) % 3 != 1:
            case.body["model"] = SERVED_ID


def run_operation(operation, mode: GenerationMode, checks=CHECKS, max_examples: int = MAX_EXAMPLES) -> None:
    """Schemathesis-generated cases of one operation in one mode, each called and validated."""

    @settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(mode))
    def exercise(case: Case) -> None:
        _served_model_mostly(case)
        case.call_and_validate(checks=checks)

    exercise()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_every_operation_matches_its_document(api, mode):
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/chat/completions", "POST /v1/completions"}
    for operation in operations:
        # the GET operations take no body and at most a free-form path string: nothing to negate
        if mode is GenerationMode.POSITIVE or len(operation.body) > 0:
            run_operation(operation, mode)


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


def _toy_operation(answer):
    schema = schemathesis.openapi.from_asgi("/openapi.json", _toy_app(answer),
                                            config=SchemathesisConfig.from_dict(CONFIG))
    return next(result.ok() for result in schema.get_all_operations())


def test_the_run_catches_an_undocumented_acceptance():
    operation = _toy_operation(lambda body: JSONResponse({"ok": True}))  # takes any body
    with pytest.raises(FailureGroup, match="should have been rejected"):
        run_operation(operation, GenerationMode.NEGATIVE)


def test_the_run_catches_a_server_error():
    operation = _toy_operation(lambda body: JSONResponse({"error": "boom"}, status_code=500))
    with pytest.raises(FailureGroup, match="Server error"):
        run_operation(operation, GenerationMode.POSITIVE)


def test_the_run_catches_documented_data_refused_as_a_schema_violation():
    refuse = {"error": {"message": SCHEMA_VIOLATION + " x: no", "type": "invalid_request_error", "code": 400}}
    operation = _toy_operation(lambda body: JSONResponse(refuse, status_code=400))
    with pytest.raises(FailureGroup, match="Documented data rejected"):
        run_operation(operation, GenerationMode.POSITIVE, checks=[documented_data_accepted])


def test_the_toy_app_that_keeps_its_document_passes():
    def strict(body: bytes) -> JSONResponse:
        try:
            _Documented.model_validate_json(body, strict=True)
        except ValueError:
            return JSONResponse({"error": "invalid"}, status_code=400)
        return JSONResponse({"ok": True})

    operation = _toy_operation(strict)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        run_operation(operation, mode, checks=[schemathesis.checks.not_a_server_error,
                                               schemathesis.checks.negative_data_rejection])
