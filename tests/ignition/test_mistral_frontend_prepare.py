"""Prepare-time facts of Mistral templates: the tool-call id form the template renders back, and which
tool-call spelling it renders.

- `tool_call_id_len`: Mistral's v0.3 template refuses any call id but nine characters ("Tool call IDs
  should be alphanumeric strings with length 9!"), so the ids the server gives calls by default
  (`call_<request id>_<index>`) fail the next turn; the probe finds the length the core must record.
- The newer templates write `[TOOL_CALLS]NAME[ARGS]{...}` per call: that is the `mistral-args` family
  (its data parses it), not the JSON-array `mistral` family that matched any `[TOOL_CALLS]` before; the
  variant carrying ids (`[CALL_ID]`), which no parser reads, is refused naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.frontend.families import select_family
from helios.ignition.frontend import probes
from helios.ignition.frontend.render import ProbeTemplate
from helios.ignition.preparation import contract as preparation
from support.chat_checkpoint import write_frontend_files
from support.family_checkpoints import MISTRAL_ARGS_TEMPLATE

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

# Mistral's newer template shape (Mistral Small 3.2, Magistral); CALL_ID_FORM renders `[CALL_ID]ID` between
# the name and `[ARGS]` (tokenizer v11).
ARGS_FORM = MISTRAL_ARGS_TEMPLATE
CALL_ID_FORM = ARGS_FORM.replace("+ '[ARGS]' +", "+ '[CALL_ID]' + tool_call['id'] + '[ARGS]' +")
# The JSON-array spelling written without spaces.
COMPACT_ARRAY_FORM = ARGS_FORM.replace(
    "'[TOOL_CALLS]' + tool_call['function']['name'] + '[ARGS]' + arguments",
    "'[TOOL_CALLS][{\"name\":\"' + tool_call['function']['name'] + '\",\"arguments\":' + arguments + '}]'")


def probe(source: str) -> ProbeTemplate:
    return ProbeTemplate(source, TOKENS)


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATES.glob("*.jinja")))
def test_only_a_template_that_refuses_default_ids_records_an_id_length(name):
    expected = 9 if name == "mistral_v0_3.jinja" else 0
    assert probes.tool_call_id_len(probe((TEMPLATES / name).read_text())) == expected


def test_a_template_that_renders_no_call_under_either_id_records_none():
    refusing = "{% for m in messages %}{% if m.tool_calls %}{{ raise_exception('no tools') }}{% endif %}" \
               "{{ m.content }}{% endfor %}"
    assert probes.tool_call_id_len(probe(refusing)) == 0


def test_the_declared_id_length_is_written_into_the_contract():
    for length in (0, 9):
        target = spb.FrontendContract()
        preparation._frontend(target, preparation.FrontendDeclaration(tool_call_id_len=length))
        assert target.tool_call_id_len == length


@pytest.mark.parametrize("source, family", [
    ((TEMPLATES / "mistral_v0_3.jinja").read_text(), "mistral"),
    (COMPACT_ARRAY_FORM, "mistral"),
    (ARGS_FORM, "mistral-args"),
])
def test_each_mistral_spelling_selects_its_family(source, family):
    assert select_family(probes.tool_call_text(probe(source)), "mistral", None).name == family


def test_calls_carrying_ids_are_refused_naming_the_syntax():
    rendered = probes.tool_call_text(probe(CALL_ID_FORM))
    with pytest.raises(CheckpointError, match=r"no tool parser reads \(Mistral calls carrying their id"):
        select_family(rendered, "mistral", None)


def test_prepare_declares_the_args_spelling(tmp_path):
    write_frontend_files(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": ARGS_FORM, **TOKENS}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    declared = read_assets(tmp_path, 320).frontend
    assert declared.family == "mistral-args"
    assert declared.tool_parser == spb.TOOL_PARSER_JSON_CALLS
    syntax = declared.tool_syntax
    assert (syntax.opener, syntax.invoke_open, syntax.name_end, syntax.name_key) == (
        "[TOOL_CALLS]", "[TOOL_CALLS]", "[ARGS]", "")
