"""Request preparation and the output path, on real tokenizers and test templates.

Generated outputs are token ids the real tokenizers produce for a chosen text; they are fed to the
`OutputProcessor` one id at a time, as the engine delivers them.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helios.contract import serving_pb2 as spb
from helios.contract.settings import ResolvedSampling
from helios.errors import ContractError, RequestError
from helios.frontend.decoding.events import ResultBuilder
from helios.frontend.preparation.generation import ContextLimitExceeded, SamplingParams, resolve_output_limit, resolve_sampling
from helios.frontend.structured.grammar import GrammarError
from helios.frontend.preparation.messages import MessageError
from helios.frontend.decoding.observation import ObservationClock, ObservationOptionError
from helios.frontend.preparation.prompt import ReasoningState
from helios.frontend.preparation.request_options import ChatOptionError
from helios.frontend.session import FrontendModel, PromptError, UnknownModel, check_template_tokens
from helios.frontend.decoding.stops import StopOptionError
from helios.runtime.records.events import FinishReason
from helios.server.schemas import ChatCompletionRequest, CompletionRequest

from .parsers.conftest import small_bpe
from .served import (
    RECIPIENT_FRAMES,
    deepseek_model,
    ids_of,
    qwen_model,
    recipient_frontend,
    run_output,
    served_contract,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },
}
TOOL_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    return qwen_model(qwen_tokenizer)


@pytest.fixture(scope="module")
def eos(qwen_tokenizer):
    return qwen_tokenizer.token_to_id("<|im_end|>")


def chat(served, **fields):
    body = {"model": served.served_id, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    body.update(fields)
    return ChatCompletionRequest.model_validate(body)


def completion(model, **fields):
    return CompletionRequest.model_validate({"model": model.served_id, **fields})


class StepClock:
    """An ObservationClock source that counts reads (origin read included)."""

    def __init__(self):
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return 1000 * self.reads


# -- preparation ---------------------------------------------------------------------------------


def test_prompt_is_rendered_tokenized_and_opens_reasoning(qwen, qwen_tokenizer):
    prepared = qwen.prepare_chat(chat(qwen), request_id="r1", created=7)
    prompt = prepared.prompt
    assert prompt.text.endswith("<|im_start|>assistant\n<think>\n")
    assert prepared.prompt_token_ids == tuple(qwen_tokenizer.encode(prompt.text, add_special_tokens=False).ids)
    assert prompt.reasoning_state is ReasoningState.OPEN
    assert 0 < prepared.stable_prefix_len < len(prepared.prompt_token_ids)
    assert (prepared.request_id, prepared.head.response_id, prepared.head.created) == ("r1", "chatcmpl-r1", 7)
    closed = qwen.prepare_chat(chat(qwen, chat_template_kwargs={"enable_thinking": False}))
    assert closed.prompt.reasoning_state is ReasoningState.CLOSED


def test_explicit_sampling_values_win_over_prepared_defaults(qwen, eos):
    defaults = qwen.prepare_chat(chat(qwen)).params
    assert (defaults.sampling.temperature, defaults.sampling.top_k, defaults.sampling.top_p) == (0.6, 50, 0.9)
    assert defaults.max_output_tokens == 4096 and defaults.eos_token_ids[0] == eos
    explicit = qwen.prepare_chat(chat(qwen, temperature=0, top_k=0, min_p=0.2, seed=-1, max_completion_tokens=5)).params
    assert explicit.sampling == SamplingParams(0.0, 0.9, 0, 0.2, 1.05, 0.0, 0.1, -1)  # the signed seed as given
    assert explicit.max_output_tokens == 5
    assert not (explicit.is_constrained or explicit.is_timed or explicit.has_host_stops)


def resolved(policy, seed=None) -> ResolvedSampling:
    return ResolvedSampling(1.0, 1.0, 0, 0.0, 1.0, 0.0, 0.0, 64, policy, seed)


class NoSampling:
    temperature = top_p = top_k = min_p = repetition_penalty = presence_penalty = frequency_penalty = seed = None


def test_seed_policies():
    def never():
        raise AssertionError("drew a seed")

    assert resolve_sampling(NoSampling(), resolved(spb.SEED_POLICY_FIXED, 7), never).seed == 7
    assert resolve_sampling(NoSampling(), resolved(spb.SEED_POLICY_RANDOM), lambda: 2**70 + 5).seed == 5
    body = NoSampling()
    body.seed = 3
    assert resolve_sampling(body, resolved(spb.SEED_POLICY_RANDOM), never).seed == 3


def test_default_output_limit_leaves_room_for_the_prompt():
    assert resolve_output_limit(None, 4096, 32768, 100) == 4096
    assert resolve_output_limit(None, 4096, 4100, 100) == 4000
    assert resolve_output_limit(4000, 4096, 4100, 100) == 4000
    with pytest.raises(ContextLimitExceeded, match="leaves no room"):
        resolve_output_limit(None, 4096, 100, 100)
    with pytest.raises(ContextLimitExceeded, match="at most 4000 output tokens") as caught:
        resolve_output_limit(9000, 4096, 4100, 100)
    assert caught.value.http_status == 400 and "4100" in str(caught.value)


def test_stops_structured_output_and_observation_reach_the_engine_record(qwen):
    params = qwen.prepare_chat(chat(qwen, stop=["x", "yz"])).params
    assert params.stop_strings == ("x", "yz") and params.has_host_stops
    params = qwen.prepare_chat(chat(qwen, stop_token_ids=[5], stop_token_sequences=[[1, 2]])).params
    assert params.stop_token_sequences == ((5,), (1, 2))
    prepared = qwen.prepare_chat(chat(qwen, response_format={"type": "json_object"}, return_token_ids=True,
                                      return_token_timestamps=True), ingress_ns=10)
    assert prepared.params.is_constrained and prepared.params.is_timed and prepared.grammar is not None
    spec = prepared.request_spec(priority=2)
    assert spec.prompt_ids == prepared.prompt_token_ids and spec.constrained and spec.observe and spec.priority == 2
    assert spec.max_output_tokens == prepared.params.max_output_tokens
    assert spec.eos_ids == frozenset(prepared.params.eos_token_ids)


@pytest.mark.parametrize(
    "fields, error",
    [
        ({"model": "other"}, UnknownModel),
        ({"stop": "x", "response_format": {"type": "json_object"}}, StopOptionError),
        ({"stop_token_ids": [10**7]}, StopOptionError),
        ({"return_token_timestamps": True}, ObservationOptionError),
        ({"stream_options": {"include_usage": True}}, ChatOptionError),
        ({"max_tokens": 1, "max_completion_tokens": 2}, ChatOptionError),
        ({"tool_choice": "required"}, ChatOptionError),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, ChatOptionError),
        ({"tools": [WEATHER], "tool_choice": "required", "stop": "x"}, ChatOptionError),
        ({"response_format": {"type": "regex", "regex": "(unclosed"}}, GrammarError),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]}, MessageError),
    ],
)
def test_invalid_requests_raise_typed_400_errors(qwen, fields, error):
    with pytest.raises(error) as caught:
        qwen.prepare_chat(chat(qwen, **fields))
    assert caught.value.http_status == 400


def test_tool_choice_none_renders_the_tools_and_registers_none(qwen):
    """Under ``none`` the declared tools stay in the prompt (vLLM's default; the model is told what
    exists) and none is registered for parsing (a call it writes is answer text)."""
    auto = qwen.prepare_chat(chat(qwen, tools=[WEATHER]))
    none = qwen.prepare_chat(chat(qwen, tools=[WEATHER], tool_choice="none"))
    assert "get_weather" in auto.prompt.text and auto.output.request.tools.has("get_weather")
    assert "get_weather" in none.prompt.text and not none.output.request.tools.has("get_weather")


def test_timed_requests_need_their_ingress_stamp(qwen):
    with pytest.raises(ValueError):
        qwen.prepare_chat(chat(qwen, return_token_ids=True, return_token_timestamps=True))


# -- output path ---------------------------------------------------------------------------------

ANSWER = ["let me check\n", "</think>", "\n\nSure.\n\n", TOOL_CALL]


def answer_ids(tokenizer, eos):
    return ids_of(tokenizer, *ANSWER) + [eos]


def test_reasoning_content_and_tool_call_from_token_ids(qwen, qwen_tokenizer, eos):
    prepared = qwen.prepare_chat(chat(qwen, tools=[WEATHER]), request_id="r1")
    ids = answer_ids(qwen_tokenizer, eos)
    steps, final = run_output(prepared, ids)
    result = final.result
    assert (result.reasoning, result.content) == ("let me check", "Sure.")
    assert [(c.call_id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_r1_0", "get_weather", '{"city": "Paris", "days": 3}')
    ]
    assert final.reason is FinishReason.EOS and final.usage.completion_tokens == len(ids)
    assert final.usage.prompt_tokens == len(prepared.prompt_token_ids)
    folded = ResultBuilder()
    for step in steps:
        folded.apply(step.events)
    folded.apply(final.events)
    assert folded.result() == result
    assert all(step.observation is None for step in steps) and final.observation is None


def test_string_stop_ends_the_output_and_never_leaks(qwen, qwen_tokenizer, eos):
    prepared = qwen.prepare_chat(chat(qwen, stop=["ure."], return_token_ids=True))
    ids = answer_ids(qwen_tokenizer, eos)
    output = prepared.new_output()
    steps = [output.feed(token_id) for token_id in ids]
    stop_at = next(i for i, step in enumerate(steps) if step.is_stopped)
    crossing = next(k for k in range(len(ids)) if "ure." in qwen_tokenizer.decode(ids[: k + 1], skip_special_tokens=False))
    assert stop_at == crossing and not any(step.is_stopped for step in steps[:stop_at])
    assert all(not step.events and step.observation is None for step in steps[stop_at + 1:])  # ignored
    final = output.finish(FinishReason.CANCELLED)
    assert final.reason is FinishReason.STOP
    assert (final.result.reasoning, final.result.content, final.result.tool_calls) == ("let me check", "S", ())
    assert final.usage.completion_tokens == stop_at + 1  # the token crossing the stop counts
    assert final.observation.token_ids == tuple(ids[: stop_at + 1])


def test_string_stops_match_inside_reasoning_and_envelope_markup(qwen, qwen_tokenizer, eos):
    ids = answer_ids(qwen_tokenizer, eos)
    _, final = run_output(qwen.prepare_chat(chat(qwen, stop=[" check"])), ids)
    assert (final.result.reasoning, final.result.content, final.reason) == ("let me", "", FinishReason.STOP)
    _, final = run_output(qwen.prepare_chat(chat(qwen, stop=["</think>"])), ids)
    assert (final.result.reasoning, final.result.content) == ("let me check", "")


def test_text_held_by_a_stop_prefix_keeps_delimiter_tokens_whole(qwen, qwen_tokenizer, eos):
    ids = answer_ids(qwen_tokenizer, eos)
    _, plain = run_output(qwen.prepare_chat(chat(qwen, tools=[WEATHER]), request_id="a"), ids)
    _, held = run_output(qwen.prepare_chat(chat(qwen, tools=[WEATHER], stop=["</think>!", "<tool_call>?"]),
                                           request_id="a"), ids)
    assert held.result == plain.result and held.reason is FinishReason.EOS


def test_a_stop_cutting_a_delimiter_token_leaves_its_visible_part_as_text(qwen, qwen_tokenizer, eos):
    _, final = run_output(qwen.prepare_chat(chat(qwen, stop=["k>\n\nSure"])), answer_ids(qwen_tokenizer, eos))
    assert (final.result.reasoning, final.result.content) == ("let me check\n</thin", "")


def test_token_stops_are_omitted_and_counted(qwen, qwen_tokenizer, eos):
    ids = answer_ids(qwen_tokenizer, eos)
    sure = qwen_tokenizer.token_to_id("Sure")
    _, final = run_output(qwen.prepare_chat(chat(qwen, stop_token_ids=[sure], return_token_ids=True)), ids)
    assert (final.result.content, final.reason) == ("", FinishReason.STOP)
    assert final.observation.token_ids[-1] == sure
    dot = ids_of(qwen_tokenizer, ".")[0]
    prefix_only = ids_of(qwen_tokenizer, "Sure.") + [eos]
    _, final = run_output(qwen.prepare_chat(chat(qwen, stop_token_sequences=[[dot, 999]],
                                                 chat_template_kwargs={"enable_thinking": False})), prefix_only)
    assert (final.result.content, final.reason) == ("Sure.", FinishReason.EOS)  # held prefix flushed


def test_output_limit_flushes_an_unmatched_stop_prefix(qwen, qwen_tokenizer):
    ids = ids_of(qwen_tokenizer, "Sure.")
    prepared = qwen.prepare_chat(chat(qwen, stop=["Sure.!"], chat_template_kwargs={"enable_thinking": False}))
    _, final = run_output(prepared, ids, FinishReason.LENGTH)
    assert (final.result.content, final.reason) == ("Sure.", FinishReason.LENGTH)


def test_timed_observation_records_ids_timestamps_and_performance(qwen, qwen_tokenizer, eos):
    clock = ObservationClock(StepClock())
    prepared = qwen.prepare_chat(chat(qwen, return_token_ids=True, return_token_timestamps=True, stop=["ure."]),
                                 ingress_ns=5)
    ids = answer_ids(qwen_tokenizer, eos)
    steps, final = run_output(prepared, ids, timestamps=[100 + i for i in range(len(ids))], reused_prompt_tokens=4,
                              clock=clock)
    record = final.observation
    assert record.token_timestamps_ns == tuple(100 + i for i in range(len(record.token_ids)))
    assert record.prompt_token_ids == prepared.prompt_token_ids
    assert (record.performance.ingress_ns, record.performance.enqueue_ns) == (5, 1000)
    assert record.reused_prompt_tokens == record.performance.reused_prompt_tokens == 4
    assert steps[0].observation.timestamp_ns == 100


def test_untimed_requests_read_no_clock(qwen, qwen_tokenizer, eos):
    source = StepClock()
    clock = ObservationClock(source)
    for fields in ({}, {"return_token_ids": True}):
        run_output(qwen.prepare_chat(chat(qwen, **fields)), answer_ids(qwen_tokenizer, eos), clock=clock)
    assert source.reads == 1  # the origin only


def test_structured_answer_inside_the_reasoning_envelope(qwen, qwen_tokenizer, eos):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    prepared = qwen.prepare_chat(chat(qwen, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}))
    ids = ids_of(qwen_tokenizer, "plan", "</think>", "\n\n", '{"a": 1}') + [eos]
    assert all(prepared.grammar.consume_token(token_id) for token_id in ids)
    assert prepared.grammar.is_stopped
    _, final = run_output(prepared, ids)
    assert (final.result.reasoning, final.result.content) == ("plan", '{"a": 1}')


def test_dsml_tool_call_after_a_closed_reasoning_prompt(deepseek_tokenizer):
    model = deepseek_model(deepseek_tokenizer)
    prepared = model.prepare_chat(chat(model, tools=[WEATHER]), request_id="d")
    assert prepared.prompt.text.startswith("<｜begin▁of▁sentence｜>") and prepared.prompt_token_ids[0] == 0
    assert prepared.prompt.reasoning_state is ReasoningState.CLOSED
    call = ('<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')
    _, final = run_output(prepared, ids_of(deepseek_tokenizer, "Checking.\n\n", call) + [1])
    assert final.result.content == "Checking."
    assert [(c.call_id, c.arguments) for c in final.result.tool_calls] == [("call_d_0", '{"city": "Paris", "days": 3}')]


def test_template_tokens_must_match_the_tokenizer(deepseek_tokenizer):
    wrong = [spb.TemplateToken(name="bos_token", text="<｜begin▁of▁sentence｜>", token_id=5)]
    with pytest.raises(ContractError) as caught:
        check_template_tokens(wrong, lambda text: deepseek_tokenizer.encode(text, add_special_tokens=False).ids)
    assert caught.value.path == "contract.defaults.template_tokens[0].token_id"


@pytest.fixture(scope="module")
def frames_model():
    tokenizer = small_bpe(["<|endoftext|>", "<|start|>", "<|message|>", "<|eom|>", "<|end|>"])
    eos = tokenizer.token_to_id("<|endoftext|>")
    contract = served_contract(tokenizer.get_vocab_size(), recipient_frontend(), [eos])
    return FrontendModel.from_contract(contract, tokenizer, RECIPIENT_FRAMES), tokenizer


def test_recipient_frames_start_in_the_open_header(frames_model):
    model, tokenizer = frames_model
    prepared = model.prepare_chat(chat(model))
    generated = " to=self<|message|>Thinking.<|eom|><|start|>assistant to=user<|message|>Hello!"
    _, final = run_output(prepared, ids_of(tokenizer, generated) + [tokenizer.token_to_id("<|endoftext|>")])
    assert (final.result.reasoning, final.result.content, final.result.errors) == ("Thinking.", "Hello!", ())
    structured = model.prepare_chat(chat(model, response_format={"type": "json_object"}))
    assert structured.grammar is not None and structured.params.is_constrained


# -- text completions ----------------------------------------------------------------------------


def test_text_completion_prompts(qwen, qwen_tokenizer):
    prepared = qwen.prepare_completion(completion(qwen, prompt="Once upon", max_tokens=3), request_id="t")
    assert prepared.prompt_token_ids == tuple(qwen_tokenizer.encode("Once upon").ids)
    assert prepared.params.max_output_tokens == 3 and prepared.head.response_id == "cmpl-t"
    assert qwen.prepare_completion(completion(qwen, prompt=[1, 2, 3])).prompt_token_ids == (1, 2, 3)
    for prompt in ([], [qwen_tokenizer.get_vocab_size() + 8], ""):
        with pytest.raises(PromptError):
            qwen.prepare_completion(completion(qwen, prompt=prompt))


def test_text_completion_output_is_raw_text(qwen, qwen_tokenizer, eos):
    prepared = qwen.prepare_completion(completion(qwen, prompt="x"))
    _, final = run_output(prepared, ids_of(qwen_tokenizer, "a ", "<think>", " b") + [eos])
    assert (final.result.content, final.result.reasoning) == ("a <think> b", "")


TEXT = st.text(alphabet=st.sampled_from(list("ab c\n.é東🧪")), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, data=st.data())
def test_property_string_stops_never_leak(qwen, qwen_tokenizer, text, data):
    start = data.draw(st.integers(0, len(text) - 1))
    stop = text[start: data.draw(st.integers(start + 1, len(text)))]
    prepared = qwen.prepare_completion(completion(qwen, prompt="x", stop=[stop]))
    _, final = run_output(prepared, ids_of(qwen_tokenizer, text), FinishReason.LENGTH)
    assert final.result.content == text[: text.find(stop)]
    assert final.reason is FinishReason.STOP and "\ufffd" not in final.result.content


def test_reasoning_effort_sets_the_thinking_switch_of_the_template(qwen):
    assert qwen.prepare_chat(chat(qwen, reasoning_effort="none")).prompt.reasoning_state is ReasoningState.CLOSED
    for effort in ("minimal", "low", "medium", "high"):
        opened = qwen.prepare_chat(chat(qwen, reasoning_effort=effort)).prompt
        assert opened.reasoning_state is ReasoningState.OPEN and opened.text.endswith("<think>\n")
    agreeing = chat(qwen, reasoning_effort="none", chat_template_kwargs={"enable_thinking": False})
    assert qwen.prepare_chat(agreeing).prompt.reasoning_state is ReasoningState.CLOSED
    with pytest.raises(RequestError, match="contradicts chat_template_kwargs.enable_thinking"):
        qwen.prepare_chat(chat(qwen, reasoning_effort="high", chat_template_kwargs={"enable_thinking": False}))


def test_a_template_without_a_thinking_switch_renders_unchanged():
    from helios.frontend.preparation.client_fields import effective_template_kwargs, thinking_switch_of

    assert thinking_switch_of("{{ messages }}") is None
    assert effective_template_kwargs("none", {"x": 1}, None) == {"x": 1}
    assert effective_template_kwargs("low", None, "enable_thinking") == {"enable_thinking": True}
    assert effective_template_kwargs(None, None, "enable_thinking") is None


def test_a_continued_final_message_decodes_its_output_in_the_prompts_context(qwen):
    """The output continuing a final assistant message is decoded after the prompt's ids, as a text
    completion's is: on a SentencePiece-style tokenizer the first word's ``▁`` is then the space the
    message's text runs into ("The answer is" + ``▁42`` reads " 42"), where decoded as the first
    token of a sequence it lost it (vLLM keeps it)."""
    import dataclasses

    from .test_logprob_offsets_spm import DECODERS, sentencepiece_like

    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is"}]
    continued = qwen.prepare_chat(chat(qwen, messages=messages, continue_final_message=True))
    plain = qwen.prepare_chat(chat(qwen, messages=messages[:1]))
    assert continued.output.continues_prompt and not plain.output.continues_prompt
    spm = sentencepiece_like(DECODERS["llama-2"])
    ids = spm.encode("The answer is the fox", add_special_tokens=False).ids
    cut = len(spm.encode("The answer is", add_special_tokens=False).ids)
    assert spm.decode(ids[cut:]) == "the fox"  # alone, the first word loses its space
    for factory, expected in ((continued.output, " the fox"), (plain.output, "the fox")):
        output = dataclasses.replace(factory, tokenizer=spm, prompt_token_ids=tuple(ids[:cut])).create()
        steps = [output.feed(token_id, None) for token_id in ids[cut:]]
        final = output.finish(FinishReason.LENGTH, 0)
        text = "".join(getattr(event, "text", "") for step in steps for event in step.events)
        text += "".join(getattr(event, "text", "") for event in final.events)
        assert text == expected
