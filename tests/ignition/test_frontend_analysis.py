"""Prepare-time frontend analysis: boundaries, reasoning, tool families and sampling recommendations
read from a checkpoint's template and files, with a specific error for each thing that is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helios.cli.prepare_cmd import _stated
from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.frontend.families import select_family
from helios.ignition.frontend.sampling import merged_sampling, recommended_sampling
from support.chat_checkpoint import write_frontend_files

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
CHATML = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def checkpoint(tmp_path: Path, template: str, **settings) -> Path:
    """The test tokenizer (ChatML, think and tool-call tokens) with `template` as its chat template."""
    write_frontend_files(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template, **settings}))
    return tmp_path


def frontend(directory: Path, **stated: str):
    return read_assets(directory, 320, stated).frontend


def test_a_tokenizer_with_think_tokens_is_not_a_reasoning_model_unless_the_template_says_so(tmp_path):
    declared = frontend(checkpoint(tmp_path, CHATML))
    assert (declared.tool_parser, declared.reasoning_parser) == (spb.TOOL_PARSER_NONE, spb.REASONING_PARSER_NONE)
    boundary = declared.assistant_boundary
    assert (boundary.message_start, boundary.assistant_header, boundary.message_end) == (
        "<|im_start|>", "assistant", "<|im_end|>")
    assert {rule.role for rule in declared.prefix_boundaries} == {
        spb.MESSAGE_ROLE_SYSTEM, spb.MESSAGE_ROLE_USER, spb.MESSAGE_ROLE_ASSISTANT}


def test_a_generation_prompt_that_opens_reasoning_declares_think_tags(tmp_path):
    template = CHATML.replace("assistant\n{%- endif", "assistant\n<think>\n{%- endif")
    declared = frontend(checkpoint(tmp_path, template))
    assert declared.reasoning_parser == spb.REASONING_PARSER_THINK_TAGS
    assert declared.reasoning_syntax.open_token_id == 2 and declared.reasoning_syntax.close_token_id == 3
    assert declared.assistant_boundary.assistant_header == "assistant\n"  # the open tag is not header


@pytest.mark.parametrize("template, missing", [
    ("{{ raise_exception('no') }}", "cannot render a single user message"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "message end"),
    ("{% for m in messages %}{% if m.role == 'user' %}[U]{{ m.content }}{% endif %}{% endfor %}",
     "does not render an assistant reply"),
    ("{% if add_generation_prompt %}<|im_start|>assistant\n{% else %}{% for m in messages %}{{ m.content }}|"
     "{% endfor %}{% endif %}", "rewrites the conversation"),
    ("{% for m in messages %}{{ m.content }}{% if m.role == 'assistant' %}<|im_end|>{% endif %}{% endfor %}",
     "assistant_header"),
    ("{% for m in messages %", "does not compile"),
])
def test_a_template_that_cannot_be_analysed_names_what_is_missing(tmp_path, template, missing):
    with pytest.raises(CheckpointError, match=missing):
        frontend(checkpoint(tmp_path, template))


def test_stated_boundaries_win_over_the_probes(tmp_path):
    template = "{% for m in messages %}{% if m.role == 'user' %}[U]{{ m.content }}[A]{% else %}{{ m.content }}{% endif %}{% endfor %}"
    boundary = frontend(checkpoint(tmp_path, template)).assistant_boundary  # ended by the next message
    assert (boundary.message_start, boundary.assistant_header, boundary.message_end) == ("", "[A]", "[U]")
    boundary = frontend(checkpoint(tmp_path, template), message_end="</s>").assistant_boundary
    assert (boundary.message_start, boundary.assistant_header, boundary.message_end) == ("", "[A]", "</s>")
    with pytest.raises(CheckpointError, match="not in the rendered generation prompt"):
        frontend(checkpoint(tmp_path, template), message_end="[U]", assistant_header="<nowhere>")
    with pytest.raises(CheckpointError, match="unknown frontend keys"):
        frontend(checkpoint(tmp_path, CHATML), envelope="x")


def test_family_and_reasoning_can_be_stated(tmp_path):
    template = (TEMPLATES / "qwen3.jinja").read_text()
    directory = checkpoint(tmp_path, template)
    derived = frontend(directory)
    assert (derived.family, derived.reasoning_parser) == ("hermes", spb.REASONING_PARSER_THINK_TAGS)
    stated = frontend(directory, family="none", reasoning="none")
    assert (stated.tool_parser, stated.reasoning_parser) == (spb.TOOL_PARSER_NONE, spb.REASONING_PARSER_NONE)
    assert frontend(directory, family="qwen3-coder").tool_parser == spb.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS
    with pytest.raises(CheckpointError, match="unknown frontend family 'qwen9'"):
        frontend(directory, family="qwen9")


def test_unreadable_tool_markup_is_a_prepare_error_naming_the_syntax():
    harmony = "<|start|>assistant to=functions.probe_lookup<|channel|>commentary json<|message|>{}<|call|>"
    family = select_family(harmony, "gpt_oss", None)
    assert (family.name, family.tool_parser) == ("harmony", spb.TOOL_PARSER_HARMONY_CHANNELS)
    assert family.channel_syntax.reasoning_channels == ["analysis"]
    builtin = "<|start|>assistant<|channel|>analysis to=browser.search<|message|>{}<|call|>"
    with pytest.raises(CheckpointError, match="harmony channels without function recipients"):
        select_family(builtin, "gpt_oss", None)
    with pytest.raises(CheckpointError, match="no tool parser reads"):
        select_family("CALL probe_lookup(probe_key=1)", "llama", None)
    assert select_family("", "llama", None) is None


def test_harmony_frames_need_single_control_tokens_and_keep_their_reasoning(tmp_path):
    directory = checkpoint(tmp_path, (TEMPLATES / "gpt_oss.jinja").read_text())
    with pytest.raises(CheckpointError, match="no single token for the start control '<\\|start\\|>'"):
        frontend(directory)
    with pytest.raises(CheckpointError, match="reasoning=none does not apply"):
        frontend(directory, reasoning="none")


def test_model_type_breaks_a_tie_between_families():
    both = '<tool_call>\n{"name": "probe_lookup", "parameters": {}}</tool_call>'
    assert select_family(both, "llama", None).name == "llama3"
    assert select_family(both, "qwen2", None).name == "hermes"


def write_generation(tmp_path: Path, **values) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(values))
    return tmp_path


def test_generation_config_recommendations(tmp_path):
    assert recommended_sampling(write_generation(tmp_path, do_sample=False, temperature=0.7)) == \
        spb.SamplingDefaults(temperature=0.0)
    given = recommended_sampling(write_generation(tmp_path, temperature=0.6, top_p=0.95, top_k=20,
                                                  repetition_penalty=1.05))
    assert given == spb.SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05)
    explicit = spb.SamplingDefaults(temperature=1.0, seed_policy=spb.SEED_POLICY_RANDOM)
    merged = merged_sampling(tmp_path, explicit, 2048)
    assert (merged.temperature, merged.top_k, merged.seed_policy) == (1.0, 20, spb.SEED_POLICY_RANDOM)


@pytest.mark.parametrize("values, field", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": 1.5}, "top_k"),
    ({"repetition_penalty": "high"}, "repetition_penalty"),
])
def test_bad_recommendations_name_their_field(tmp_path, values, field):
    with pytest.raises(CheckpointError, match=field):
        recommended_sampling(write_generation(tmp_path, **values))


def test_frontend_flag_values():
    assert _stated("message_end=<|im_end|>") == ("message_end", "<|im_end|>")
    assert _stated("assistant_header=assistant\\n") == ("assistant_header", "assistant\n")
    with pytest.raises(Exception, match="KEY=VALUE"):
        _stated("family")
