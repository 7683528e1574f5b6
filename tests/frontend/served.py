"""Test models: the example contract re-fitted to a real tokenizer, with a chosen frontend section.

`served_contract` keeps the example's graphs and manifest and rescales its vocabulary geometry to
the tokenizer's size (sampled range, histogram bins, mask words and the buffers sized by them),
then installs the given frontend selectors and syntax data, EOS ids, template tokens and sampling
defaults. The chat templates below are written for these tests in the styles of real templates.
"""

from __future__ import annotations

import json
import re

from contract.documents import example_text
from helios.contract import PreparedContract

EXAMPLE_VOCAB = 128256
EXAMPLE_MASK_WORDS = 4008
EXAMPLE_INPUT_END = 128264

# ChatML turns, tools in the system turn, reasoning opened by the generation prompt unless
# enable_thinking=false closes it (Qwen style).
CHATML_THINK = """
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}
# Tools
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}
<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}

<tool_call>
<function={{ call.function.name }}>
{% for key, value in call.function.arguments.items() %}
<parameter={{ key }}>
{{ value }}
</parameter>
{% endfor %}
</function>
</tool_call>
{%- endfor %}
<|im_end|>
{% elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}
<think>

</think>

{% else %}
<think>
{% endif %}
{%- endif %}
"""

# BOS, role tokens, reasoning closed unless `thinking` is set (DeepSeek style).
DEEPSEEK_THINK = """
{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'system' %}{{ message.content }}
{%- elif message.role == 'user' %}<｜User｜>{{ message.content }}
{%- elif message.role == 'assistant' %}<｜Assistant｜></think>{{ message.content or '' }}<｜end▁of▁sentence｜>
{%- elif message.role == 'tool' %}<｜tool▁outputs▁begin｜>{{ message.content }}<｜tool▁outputs▁end｜>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}
"""

# Recipient-header frames; the generation prompt opens an assistant header.
RECIPIENT_FRAMES = """
{%- for message in messages %}
{%- if message.role == 'assistant' %}<|start|>assistant to=user<|message|>{{ message.content }}<|end|>
{%- else %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}
"""

STABLE_ROLES = [
    {"role": "MESSAGE_ROLE_SYSTEM", "constraint": "PREFIX_CONSTRAINT_STABLE"},
    {"role": "MESSAGE_ROLE_USER", "constraint": "PREFIX_CONSTRAINT_STABLE"},
    {"role": "MESSAGE_ROLE_ASSISTANT", "constraint": "PREFIX_CONSTRAINT_CHANGES_AFTER_USER_TURN"},
    {"role": "MESSAGE_ROLE_TOOL", "constraint": "PREFIX_CONSTRAINT_STABLE"},
]


def qwen_frontend(qwen_tokenizer) -> dict:
    think = qwen_tokenizer.token_to_id
    return {
        "tool_parser": "TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS",
        "reasoning_parser": "REASONING_PARSER_THINK_TAGS",
        "tool_syntax": {
            "opener": "<tool_call>", "closer": "</tool_call>", "tag_separator": "\n", "wrapping_newlines": 1,
            "invoke_open": "<function=", "invoke_close": "</function>", "parameter_open": "<parameter=",
            "parameter_close": "</parameter>", "name_end": ">", "block_lead": "\n\n",
        },
        "reasoning_syntax": {
            "open": "<think>", "close": "</think>", "open_token_id": think("<think>"),
            "close_token_id": think("</think>"), "terminal_markers": ["<tool_call>"], "wrapping_newlines": 1,
            "after_close": "\n\n",
        },
        "assistant_boundary": {"message_start": "<|im_start|>", "message_end": "<|im_end|>", "assistant_header": "assistant\n"},
        "prefix_boundaries": STABLE_ROLES,
    }


def dsml_frontend(deepseek_tokenizer) -> dict:
    think = deepseek_tokenizer.token_to_id
    marker = "｜DSML｜"
    return {
        "tool_parser": "TOOL_PARSER_DSML",
        "reasoning_parser": "REASONING_PARSER_THINK_TAGS",
        "tool_syntax": {
            "opener": f"<{marker}function_calls>", "closer": f"</{marker}function_calls>",
            "invoke_open": f'<{marker}invoke name="', "invoke_close": f"</{marker}invoke>",
            "parameter_open": f'<{marker}parameter name="', "parameter_close": f"</{marker}parameter>",
            "name_end": '">', "string_attribute": '" string="', "string_true": "true", "string_false": "false",
            "block_lead": "\n\n",
        },
        "reasoning_syntax": {
            "open": "<think>", "close": "</think>", "open_token_id": think("<think>"),
            "close_token_id": think("</think>"),
        },
        "assistant_boundary": {
            "message_start": "", "message_end": "<｜end▁of▁sentence｜>", "assistant_header": "<｜Assistant｜>",
            "embedded_message_ends": ["<｜tool▁outputs▁end｜>"],
        },
        "prefix_boundaries": STABLE_ROLES,
    }


def recipient_frontend() -> dict:
    return {
        "tool_parser": "TOOL_PARSER_ATEM_RECIPIENT",
        "reasoning_parser": "REASONING_PARSER_RECIPIENT_HEADER",
        "tool_syntax": {
            "opener": "<atem:function_calls>", "closer": "</atem:function_calls>",
            "invoke_open": '<atem:invoke name="', "invoke_close": "</atem:invoke>",
            "parameter_open": '<atem:parameter name="', "parameter_close": "</atem:parameter>", "name_end": '">',
        },
        "assistant_boundary": {
            "message_start": "<|start|>", "message_end": "<|end|>", "assistant_header": "assistant",
            "recipient_prefix": " to=", "header_end": "<|message|>", "internal_message_end": "<|eom|>",
            "self_recipient": "self", "visible_recipients": ["commentary", "user"],
            "generic_tool_recipient": "functions", "named_tool_prefix": "functions.",
        },
    }


def harmony_frontend() -> dict:
    """The harmony channel parsers (gpt-oss style): channels for reasoning and tool calls."""
    from contract.cases_contract import HARMONY

    return {"tool_parser": "TOOL_PARSER_HARMONY_CHANNELS", "reasoning_parser": "REASONING_PARSER_HARMONY_CHANNELS",
            "channel_syntax": dict(HARMONY),
            "assistant_boundary": {"message_start": "<|start|>", "message_end": "<|end|>",
                                   "assistant_header": "assistant"}}


def served_contract(
    vocab_size: int,
    frontend: dict,
    eos_token_ids: list[int],
    template_tokens: list[dict] = (),
    sampling: dict | None = None,
    context_tokens: int | None = None,
) -> PreparedContract:
    """The example contract with vocabulary `vocab_size` and the given frontend and defaults."""
    words = -(-vocab_size // 32)
    text = example_text()
    for old, new in (
        (EXAMPLE_VOCAB * 4, vocab_size * 4),
        (EXAMPLE_VOCAB, vocab_size),
        (EXAMPLE_MASK_WORDS * 4, words * 4),
        (EXAMPLE_MASK_WORDS, words),
        (EXAMPLE_INPUT_END, vocab_size + 8),
    ):
        text = re.sub(rf"\b{old}\b", str(new), text)
    document = json.loads(text)
    contract = document["contract"]
    section = contract["model"]["frontend"]
    for key in ("tool_syntax", "reasoning_syntax", "assistant_boundary", "prefix_boundaries"):
        section.pop(key, None)
    section.update(frontend)
    section["image_layout_data"]["atomic_spans"] = [{"token_ids": [vocab_size + 1]}, {"token_ids": [vocab_size + 2]}]
    contract["defaults"]["eos_token_ids"] = list(eos_token_ids)
    contract["defaults"]["template_tokens"] = list(template_tokens)
    if sampling is not None:
        contract["defaults"]["sampling"] = sampling
    if context_tokens is not None:
        contract["context_tokens"] = context_tokens
    return PreparedContract.from_json(json.dumps(document))


JSON_DEFAULTS = {"whitespace_pattern": r"[ \n]{0,2}"}
_MODELS: dict[tuple, object] = {}


def cached_model(key: str, tokenizer, build):
    """One FrontendModel per (kind, tokenizer) for the whole session (grammar compilers are slow)."""
    cache_key = (key, id(tokenizer))
    if cache_key not in _MODELS:
        _MODELS[cache_key] = build()
    return _MODELS[cache_key]


def qwen_model(qwen_tokenizer):
    from helios.frontend.session import FrontendModel

    def build():
        eos = [qwen_tokenizer.token_to_id("<|im_end|>"), qwen_tokenizer.token_to_id("<|endoftext|>")]
        contract = served_contract(qwen_tokenizer.get_vocab_size(), qwen_frontend(qwen_tokenizer), eos)
        return FrontendModel.from_contract(contract, qwen_tokenizer, CHATML_THINK, json_defaults=JSON_DEFAULTS)

    return cached_model("qwen", qwen_tokenizer, build)


def deepseek_model(deepseek_tokenizer):
    from helios.frontend.session import FrontendModel

    def build():
        bos = {"name": "bos_token", "text": "<｜begin▁of▁sentence｜>", "token_id": 0}
        contract = served_contract(deepseek_tokenizer.get_vocab_size(), dsml_frontend(deepseek_tokenizer), [1], [bos])
        return FrontendModel.from_contract(contract, deepseek_tokenizer, DEEPSEEK_THINK, json_defaults=JSON_DEFAULTS)

    return cached_model("deepseek", deepseek_tokenizer, build)


def ids_of(tokenizer, *pieces: str) -> list[int]:
    """Token ids of text pieces encoded separately (special-token spellings become their tokens)."""
    return [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False).ids]


def run_output(prepared, token_ids, reason=None, *, timestamps=None, reused_prompt_tokens=0, clock=None):
    """Drives one request's output path like the engine would: (steps, final)."""
    from helios.runtime.records.events import FinishReason

    output = prepared.new_output()
    if clock is not None:
        output.mark_enqueue(clock)
    steps = []
    for i, token_id in enumerate(token_ids):
        steps.append(output.feed(token_id, None if timestamps is None else timestamps[i]))
    final = output.finish(reason or FinishReason.EOS, reused_prompt_tokens)
    return steps, final
