"""Presentation: OpenAI JSON bodies and SSE chunks from output steps, for chat and text completions.

Pure data in, plain dicts and bytes out; the server only writes them. Shapes:

- chat JSON (``chat.completion``): ``choices[0].message`` with ``content``, ``reasoning_content``
  (when there is reasoning) and ``tool_calls`` (stable ids; ``content`` is null when there are
  calls and no text); text JSON (``text_completion``): ``choices[0].text``;
- SSE (``chat.completion.chunk`` / ``text_completion``): a chat stream starts with a role chunk;
  each step's events become deltas (consecutive text of one kind in one chunk; a tool call's first
  fragment carries index, id, type and name, later ones index and argument text), and an observed
  stream sends one metadata-only chunk per generated id before that token's deltas: ``delta={}``
  (text: ``text=""``) with ``choices[0].token_ids=[id]`` and, when timed,
  ``choices[0].token_timestamps_ns=[t]``. Steps that waited together for a slow reader are
  presented as one (`helios.frontend.responses.step_run`): one metadata chunk with their ids (and
  timestamps) in order, then their deltas merged (an observed output without a token, ``max_tokens:
  0``, has its empty lists on the terminal chunk). The stream ends with a terminal choice chunk
  (``delta={}`` and the finish reason), then, with ``stream_options.include_usage``, a usage-only
  chunk with ``choices=[]`` (every earlier chunk has ``usage: null``, or with vLLM's
  ``continuous_usage_stats`` the usage so far), then ``data: [DONE]``;
- observation: ``prompt_token_ids`` at the top level of the JSON body or of the first chunk;
  ``choices[0].token_ids`` (and ``token_timestamps_ns``) in JSON; on the terminal response (the
  JSON body, or the chunk carrying usage: the usage-only chunk with include_usage, else the
  terminal choice chunk) ``usage``, ``reused_prompt_tokens`` and, when timed, the ``performance``
  object (``ingress_ns``, ``enqueue_ns``, ``reused_prompt_tokens``);
- log-probabilities (requests that ask, `helios.frontend.decoding.logprobs`): ``choices[0].logprobs`` of
  the JSON body holds every entry; in a stream, each token's entry rides on the first chunk of the
  step that hands it on (its own step, or a later one where the output waits for the space cleanup
  to decide, `helios.frontend.responses.output`; a step that shows no text yet gets a chunk of its
  own, ``delta={}`` or ``text=""``);
  text streams count ``text_offset`` across chunks; a stream that sends no entry (EOS or a stop
  came first) has an empty ``logprobs`` object on its terminal chunk, as the JSON body has;
- usage (`usage_body`): ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and, as OpenAI
  always sends them, ``prompt_tokens_details.cached_tokens`` (prompt tokens the prefix cache or a
  snapshot served: the engine's count, as ``reused_prompt_tokens``) and
  ``completion_tokens_details.reasoning_tokens`` (output tokens inside reasoning; 0 for text
  completions, which parse no reasoning); continuous-usage chunks carry the three counts, the
  terminal one the final usage whole;
- finish reasons: EOS and a user stop (string or token) -> ``stop`` (``tool_calls`` when the output
  made calls, as vLLM answers), output limit -> ``length``, cancellation -> ``cancelled``, a grammar
  dead end (no token can follow the output, which is incomplete) -> ``grammar_dead_end``, a grammar limit (llguidance
  refused to go on past the output, `helios.runtime.feedback`) -> ``grammar_limit``. Execution
  failure and admission rejection are errors, not finish reasons (`failure_error` gives their typed error):
  `error_body` for JSON (the status is the error class's), `sse_error` once the SSE headers are out: one ``event: error`` with an
  ``{"error": ...}`` body and no ``[DONE]``; the error ``type`` tells admission rejection
  (``admission_rejected``) from execution failure (``execution_error``).

A `StreamPresenter` belongs to one response (it remembers whether the first chunk is out).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from helios.errors import (AdmissionRejected, ExecutionError, HeliosError, OverloadedError, RequestError, ShuttingDown,
                           WorkerNotServing)
from helios.frontend.decoding.events import ContentDelta, Event, ReasoningDelta, ToolCallArguments, ToolCallStart
from helios.frontend.decoding.logprobs import (
    LogprobEntry, PromptRequest, TextOffsets, chat_logprobs, prompt_logprobs_body, text_logprobs,
)
from helios.frontend.decoding.observation import ObservationRecord
from helios.frontend.responses.output import OutputFinal, OutputStep, Usage
from helios.frontend.responses.sse_encoding import ChunkTemplate, encode_json, sse_data
from helios.frontend.responses.step_run import StepRun
from helios.frontend.preparation.request_options import ResponseOptions
from helios.runtime.records.events import FinishReason

SSE_DONE = b"data: [DONE]\n\n"


class ResponseKind(enum.Enum):
    CHAT = "chat"
    TEXT = "text"


_OBJECTS = {
    ResponseKind.CHAT: ("chat.completion", "chat.completion.chunk"),
    ResponseKind.TEXT: ("text_completion", "text_completion"),
}
_FINISH_REASONS = {
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.GRAMMAR_DEAD_END: "grammar_dead_end",  # the grammar allowed no token; the output is incomplete
    FinishReason.GRAMMAR_LIMIT: "grammar_limit",  # the grammar's matcher met a limit; the output is incomplete
}


@dataclass(frozen=True)
class ResponseHead:
    """What every chunk or body of one response repeats, and how the response is delivered."""

    response_id: str
    created: int
    model: str
    kind: ResponseKind
    options: ResponseOptions = ResponseOptions()
    prompt_token_ids: tuple[int, ...] = field(default=(), repr=False)
    prompt: PromptRequest = PromptRequest()  # echo, prompt scores, max_tokens 0
    echo_text: str | None = field(default=None, repr=False)  # the prompt text echo returns
    # echo with logprobs: the part of echo_text each prompt token contributes (`echoed_token_texts`)
    echo_token_texts: tuple[str, ...] | None = field(default=None, repr=False)


def finish_reason(final: OutputFinal) -> str:
    """The OpenAI finish reason; ValueError for endings that are errors. An output that ends by
    itself (EOS, or a client's stop string or stop token, as vLLM reads a stop) and made tool calls
    ends with ``tool_calls``: the calls are the answer; a cut (``length``, a grammar's end, a
    cancellation) keeps its reason."""
    reason = _FINISH_REASONS.get(final.reason)
    if reason is None:
        raise ValueError(f"{final.reason.name} ends a response with an error, not a finish reason")
    if final.reason in (FinishReason.EOS, FinishReason.STOP) and final.result.tool_calls:
        return "tool_calls"
    return reason


def usage_counts(prompt_tokens: int, completion_tokens: int) -> dict:
    """The three counts of OpenAI's usage object (a continuous-usage chunk's whole usage)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def usage_body(usage: Usage) -> dict:
    """OpenAI's usage object, with the details OpenAI always sends that Helios counts: the prompt
    tokens the prefix cache (or a snapshot) served and the output tokens that were reasoning."""
    body = usage_counts(usage.prompt_tokens, usage.completion_tokens)
    body["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    body["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return body


def _terminal_fields(final: OutputFinal) -> dict:
    """usage, and for observed responses reused_prompt_tokens and (timed) performance."""
    fields = {"usage": usage_body(final.usage)}
    record = final.observation
    if record is not None:
        fields["reused_prompt_tokens"] = record.reused_prompt_tokens
        if record.performance is not None:
            p = record.performance
            fields["performance"] = {
                "ingress_ns": p.ingress_ns,
                "enqueue_ns": p.enqueue_ns,
                "reused_prompt_tokens": p.reused_prompt_tokens,
            }
    return fields


def _token_fields(record: ObservationRecord | None) -> dict:
    if record is None:
        return {}
    fields = {"token_ids": list(record.token_ids)}
    if record.token_timestamps_ns is not None:
        fields["token_timestamps_ns"] = list(record.token_timestamps_ns)
    return fields


# -- JSON bodies ---------------------------------------------------------------------------------


def response_body(head: ResponseHead, final: OutputFinal) -> dict:
    """The complete non-streamed response."""
    result = final.result
    if head.kind is ResponseKind.CHAT:
        message: dict = {"role": "assistant", "content": result.content or (None if result.tool_calls else "")}
        if result.reasoning:
            message["reasoning_content"] = result.reasoning
        if result.tool_calls:
            message["tool_calls"] = [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in result.tool_calls
            ]
        choice: dict = {"index": 0, "message": message}
    else:
        choice = {"index": 0, "text": (head.echo_text or "") + result.content}
    logprobs = _echoed(head, final.prompt_logprobs, final.logprobs)
    choice.update(logprobs=_logprobs_body(head.kind, logprobs), finish_reason=finish_reason(final),
                  **_token_fields(final.observation))
    body = {"id": head.response_id, "object": _OBJECTS[head.kind][0], "created": head.created, "model": head.model}
    body["choices"] = [choice]
    _add_prompt_logprobs(head, final.prompt_logprobs, body, choice)
    if final.observation is not None:
        body["prompt_token_ids"] = list(final.observation.prompt_token_ids)
    body.update(_terminal_fields(final))
    return body


def _echoed(head: ResponseHead, prompt: tuple | None, output: tuple[LogprobEntry, ...] | None):
    """The entries a text choice's ``logprobs`` lists: with ``echo`` and ``logprobs``, the prompt
    tokens' (the first without a value) before the output's."""
    if head.prompt.echo_logprobs is None or prompt is None:
        return output
    top = head.prompt.echo_logprobs
    echoed = tuple(e if e is None or e.top is None else dataclasses.replace(e, top=e.top[:top]) for e in prompt)
    if head.echo_token_texts is not None:  # text_offset counts each token as the echoed text shows it
        echoed = tuple(e if e is None else dataclasses.replace(e, shown=shown, settled=True)
                       for e, shown in zip(echoed, head.echo_token_texts))
    return echoed + (output or ())


def _add_prompt_logprobs(head: ResponseHead, prompt: tuple | None, body: dict, choice: dict) -> None:
    """vLLM's ``prompt_logprobs``: on the choice (text completions) or the body (chat)."""
    if head.prompt.prompt_logprobs is None or prompt is None:
        return
    top = head.prompt.prompt_logprobs
    trimmed = [e if e is None or e.top is None else dataclasses.replace(e, top=e.top[:top]) for e in prompt]
    (body if head.kind is ResponseKind.CHAT else choice)["prompt_logprobs"] = prompt_logprobs_body(trimmed)


def _logprobs_body(kind: ResponseKind, entries: tuple[LogprobEntry, ...] | None,
                   text_offsets: TextOffsets | None = None) -> dict | None:
    if entries is None:
        return None
    return chat_logprobs(entries) if kind is ResponseKind.CHAT else text_logprobs(entries, text_offsets)


# -- errors --------------------------------------------------------------------------------------


def failure_error(reason: FinishReason, message: str) -> HeliosError:
    """The typed error of an output the engine ended in failure: admission rejection or execution
    failure (the message is the engine's; the class alone decides status and error type)."""
    if reason is FinishReason.REJECTED:
        return AdmissionRejected(message)
    if reason is FinishReason.ERROR:
        return ExecutionError(message)
    raise ValueError(f"{reason.name} is not a failure")


def error_type(error: BaseException) -> str:
    if isinstance(error, ShuttingDown):
        return "server_shutting_down"
    if isinstance(error, AdmissionRejected):
        return "admission_rejected"
    if isinstance(error, WorkerNotServing):
        return "service_unavailable"
    if isinstance(error, OverloadedError):
        return "overloaded"
    if isinstance(error, RequestError):
        return "invalid_request_error"
    return "execution_error"


def error_status(error: BaseException) -> int:
    """HTTP status of a non-streamed error response: decided by the error class."""
    return error.http_status if isinstance(error, HeliosError) else 500


def error_body(error: BaseException) -> dict:
    """OpenAI's error object; ``param`` is the request field at fault, where the error names one
    (its ``param`` attribute: `helios.frontend.preparation.request_options.ChatOptionError` and others)."""
    message = str(error) or type(error).__name__
    param = getattr(error, "param", None)
    return {"error": {"message": message, "type": error_type(error), "param": param if isinstance(param, str) else None,
                      "code": error_status(error)}}


def sse_error(error: BaseException) -> bytes:
    """The one terminal error event of a stream whose headers are out (no [DONE] follows)."""
    return b"event: error\ndata: " + encode_json(error_body(error)).encode() + b"\n\n"


# -- streaming -----------------------------------------------------------------------------------


def chat_deltas(events: tuple[Event, ...] | list[Event]) -> list[dict]:
    """Deltas of one step: consecutive text of one kind merged, tool fragments after their start."""
    deltas: list[dict] = []
    for event in events:
        last = deltas[-1] if deltas else {}
        if isinstance(event, (ReasoningDelta, ContentDelta)):
            key = "content" if isinstance(event, ContentDelta) else "reasoning_content"
            if event.text and key in last:
                last[key] += event.text
            elif event.text:
                deltas.append({key: event.text})
        elif isinstance(event, ToolCallStart):
            function = {"name": event.name, "arguments": ""}
            deltas.append({"tool_calls": [{"index": event.index, "id": event.call_id, "type": "function", "function": function}]})
        elif isinstance(event, ToolCallArguments) and event.fragment:
            calls = last.get("tool_calls")
            if calls is not None and calls[0]["index"] == event.index:
                calls[0]["function"]["arguments"] += event.fragment
            else:
                deltas.append({"tool_calls": [{"index": event.index, "function": {"arguments": event.fragment}}]})
    return deltas


def _text_of(events: tuple[Event, ...] | list[Event]) -> str:
    return "".join(event.text for event in events if isinstance(event, ContentDelta))


class StreamPresenter:
    """SSE chunks of one streamed response, as dicts (`*_chunks`) or encoded bytes (`sse_*`)."""

    def __init__(self, head: ResponseHead):
        """With `ResponseOptions.continuous_usage` (vLLM's ``stream_options.continuous_usage_stats``,
        with include_usage only) every chunk's ``usage`` is the usage so far (the prompt, and the
        output tokens usage counts up to that chunk's), not null: its three counts, as vLLM sends
        them, and on the terminal chunk the final usage, details included (the cached prompt tokens
        are known only at the end). Its chunks are encoded whole (no `ChunkTemplate`, whose tail is
        a constant)."""
        self._head = head
        self._is_chat = head.kind is ResponseKind.CHAT
        self.continuous_usage = head.options.continuous_usage and head.options.include_usage
        self._num_output_tokens = 0  # continuous usage: output tokens of the chunks made so far
        self._final_usage: Usage | None = None  # continuous usage: the final usage, once it is known
        self._has_sent_first = False
        self._text_offsets = TextOffsets()  # text streams: where the scored tokens sent so far end
        self._num_entries_sent = 0  # output log-probability entries sent so far
        self._has_sent_logprobs = False  # a chunk carried a logprobs object (echoed or output entries)
        self._has_echoed = False
        self._is_steady = False  # the first chunk is out and nothing is left to echo
        self._template = ChunkTemplate(head.response_id, _OBJECTS[head.kind][1], head.created, head.model,
                                       is_chat=self._is_chat, include_usage=head.options.include_usage)

    def start_chunks(self) -> list[dict]:
        """Chat: the role chunk (with prompt ids when observed). Text: nothing."""
        if not self._is_chat:
            return []
        return [self._chunk([self._choice({"role": "assistant", "content": ""})])]

    def _echo_chunks(self, prompt: tuple | None) -> list[dict]:
        """Once, before the first output: the echoed prompt text (and its scores) or, for chat,
        a chunk carrying ``prompt_logprobs``."""
        head = self._head
        if self._has_echoed or not (head.echo_text is not None or head.prompt.scores):
            return []
        self._has_echoed = True
        if self._is_chat:
            if prompt is None or head.prompt.prompt_logprobs is None:
                return []
            chunk = self._chunk([self._choice({})])
            _add_prompt_logprobs(head, prompt, chunk, chunk["choices"][0])
            return [chunk]
        choice = self._choice(head.echo_text or "")
        entries = _echoed(head, prompt, ())
        if entries:
            choice["logprobs"] = _logprobs_body(head.kind, entries, self._text_offsets)
            self._has_sent_logprobs = True
        elif head.echo_text:
            self._text_offsets.skip(head.echo_text)
        chunk = self._chunk([choice])
        _add_prompt_logprobs(head, prompt, chunk, choice)
        return [chunk] if head.echo_text or entries or "prompt_logprobs" in choice else []

    def step_chunks(self, step: OutputStep) -> list[dict]:
        return self.run_chunks(StepRun.of((step,)))

    def run_chunks(self, run: StepRun) -> list[dict]:
        """The chunks of consecutive steps presented as one (`helios.frontend.responses.step_run`):
        one metadata chunk with every observed id, then the run's deltas, its log-probability
        entries on the first of them."""
        self._num_output_tokens = max(self._num_output_tokens, run.num_output_tokens)
        chunks = self._echo_chunks(run.prompt_logprobs)
        if run.observations:
            choice = self._choice({}, token_ids=[o.token_id for o in run.observations])
            if run.observations[0].timestamp_ns is not None:
                choice["token_timestamps_ns"] = [o.timestamp_ns for o in run.observations]
            chunks.append(self._chunk([choice]))
        return chunks + self._with_entries(self._event_chunks(run.events), run.logprobs)

    def _with_entries(self, events: list[dict], entries: tuple[LogprobEntry, ...]) -> list[dict]:
        """`events` with `entries` on the first of them (a chunk of their own when there is none)."""
        if entries:
            if not events:
                events = [self._chunk([self._choice({} if self._is_chat else "")])]
            events[0]["choices"][0]["logprobs"] = _logprobs_body(self._head.kind, entries, self._text_offsets)
            self._num_entries_sent += len(entries)
            self._has_sent_logprobs = True
        return events

    def finish_chunks(self, final: OutputFinal) -> list[dict]:
        """Flushed deltas (with the entries of the tokens whose text the end released), the terminal
        choice chunk and, with include_usage, the usage chunk."""
        self._num_output_tokens = final.usage.completion_tokens
        chunks = self._echo_chunks(final.prompt_logprobs)
        chunks += self._with_entries(self._event_chunks(final.events), (final.logprobs or ())[self._num_entries_sent:])
        terminal = self._chunk([self._choice({}, finish_reason=finish_reason(final))])
        if final.logprobs is not None and not self._has_sent_logprobs:
            # Log-probabilities asked for and no entry to send (EOS or a stop came first): an empty
            # object, as the JSON body has, not none.
            terminal["choices"][0]["logprobs"] = _logprobs_body(self._head.kind, (), self._text_offsets)
        if final.observation is not None and not final.observation.token_ids:
            # An observed output without a token (``max_tokens: 0``): no id chunk was sent; the
            # empty lists, as the JSON body has, not none.
            terminal["choices"][0].update(_token_fields(final.observation))
        if self.continuous_usage:
            self._final_usage = final.usage
            terminal["usage"] = self._usage_so_far()
        chunks.append(terminal)
        if self._head.options.include_usage:
            usage_chunk = self._chunk([])
            usage_chunk.update(_terminal_fields(final))
            chunks.append(usage_chunk)
        elif final.observation is not None:
            terminal.update(_terminal_fields(final))
        return chunks

    def sse_start(self) -> bytes:
        return b"".join(sse_data(chunk) for chunk in self.start_chunks())

    def sse_step(self, step: OutputStep) -> bytes:
        """The bytes of `step_chunks(step)`."""
        return self.sse_run(StepRun.of((step,)))

    def sse_run(self, run: StepRun) -> bytes:
        """The bytes of `run_chunks(run)`; plain runs (no log-probabilities, nothing left to echo,
        after the first chunk) are rendered from the stream's `ChunkTemplate`."""
        if not self._has_sent_first or run.logprobs or self._is_echo_pending() or self.continuous_usage:
            return b"".join(sse_data(chunk) for chunk in self.run_chunks(run))
        template = self._template
        parts = []
        if run.observations:
            timed = run.observations[0].timestamp_ns is not None
            parts.append(template.observations([o.token_id for o in run.observations],
                                               [o.timestamp_ns for o in run.observations] if timed else None))
        if self._is_chat:
            parts.extend(template.delta(delta) for delta in chat_deltas(run.events))
        else:
            text = _text_of(run.events)
            if text:
                parts.append(template.text(text))
        return b"".join(parts)

    def sse_plain_step(self, step: OutputStep) -> bytes | None:
        """The bytes of `step_chunks(step)` for the common step (after the first chunk, nothing left
        to echo, no log-probabilities, at most one observed id, text or chat content only), from
        the stream's `ChunkTemplate` in one formatting operation; None for any other step (the
        caller takes `sse_step`)."""
        if not self._is_steady:
            if not self._has_sent_first or self._is_echo_pending() or self.continuous_usage:
                return None
            self._is_steady = True  # both conditions hold from now on
        if step.logprobs or step.prompt_logprobs is not None:
            return None
        text = ""
        for event in step.events:
            if type(event) is not ContentDelta:
                return None
            text += event.text
        observation = step.observation
        if observation is None:
            return self._template.step(None, None, text)
        return self._template.step(observation.token_id, observation.timestamp_ns, text)

    def _is_echo_pending(self) -> bool:
        head = self._head
        return not self._has_echoed and bool(head.echo_text is not None or head.prompt.scores)

    def sse_finish(self, final: OutputFinal) -> bytes:
        """The end of a successful (or cancelled) stream, ``[DONE]`` included."""
        return b"".join(sse_data(chunk) for chunk in self.finish_chunks(final)) + SSE_DONE

    def _event_chunks(self, events) -> list[dict]:
        if self._is_chat:
            return [self._chunk([self._choice(delta)]) for delta in chat_deltas(events)]
        text = _text_of(events)
        return [self._chunk([self._choice(text)])] if text else []

    def _choice(self, delta: dict | str, finish_reason: str | None = None, **extra) -> dict:
        body = {"index": 0, "delta" if self._is_chat else "text": delta if self._is_chat else (delta or "")}
        body.update(logprobs=None, finish_reason=finish_reason, **extra)
        return body

    def _chunk(self, choices: list[dict]) -> dict:
        head = self._head
        chunk = {"id": head.response_id, "object": _OBJECTS[head.kind][1], "created": head.created, "model": head.model}
        if not self._has_sent_first and head.options.observation.is_observed:
            chunk["prompt_token_ids"] = list(head.prompt_token_ids)
        self._has_sent_first = True
        chunk["choices"] = choices
        if head.options.include_usage:
            chunk["usage"] = self._usage_so_far() if self.continuous_usage else None
        return chunk

    def _usage_so_far(self) -> dict:
        if self._final_usage is not None:
            return usage_body(self._final_usage)
        return usage_counts(len(self._head.prompt_token_ids), self._num_output_tokens)
