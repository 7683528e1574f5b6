"""The SSE stream of a response with several choices (``n`` > 1, batched prompts; see
`helios.server.fanout` for what the stream contains).

`ChoicesSSEResponse` is a plain ASGI response like `helios.server.responses.SSEResponse`, with the
same guarantees: the start and the last message pass through the middlewares and the writes in
between go to the server's own send (`step_writer`; straight to uvicorn's transport when it can
take them at once: `helios.server.chunk_writer`), every write is under the send deadline, a
client that disconnects ends the response at once, a response dropped at shutdown ends quietly,
and every choice's bridge is closed on every path (so a choice still running is cancelled and its
permit released once the engine confirmed the end). Every bridge forwards its deliveries
(`ResponseBridge.forward_to`) into one `ChoiceMailbox` on the event loop: one task wakeup per
arrival of items, whichever choices they belong to, and no task per choice.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Sequence

from starlette.types import Receive, Scope, Send

from helios.errors import ExecutionError, HeliosError
from helios.frontend.responses.output import OutputFinal, Usage
from helios.frontend.responses.presentation import (
    _OBJECTS, SSE_DONE, StreamPresenter, _terminal_fields, sse_data, sse_error, usage_body, usage_counts,
)
from helios.frontend.responses.step_run import StepRun, runs_of
from helios.server.bridge import Item
from helios.server.responses import Lease, LeasedSSE


_TERMINAL_FIELDS = ("usage", "reused_prompt_tokens", "performance")  # `presentation._terminal_fields`
CHOICE_SUFFIX = "-0"  # the first choice's suffix on the request's id (`response_id`)


def is_batch(choices: Sequence) -> bool:
    """Whether the choices answer several prompts (a batch of text completions)."""
    return any(choice.prompt_index for choice in choices)


def response_id(choices: Sequence) -> str:
    """The id of the whole response: one id for every choice, as OpenAI and vLLM give (the
    choices carry their ``index``). Each choice is an engine request of its own, named
    ``{base}-{k}`` for choice ``k`` (`helios.server.service`), whose head carries an id of that
    name; the response's is the first choice's without its ``-0``: the request's own id."""
    head = choices[0].prepared.head
    request_id = choices[0].prepared.request_id
    if request_id.endswith(CHOICE_SUFFIX) and head.response_id.endswith(request_id):
        return head.response_id[: -len(CHOICE_SUFFIX)]
    return head.response_id


def merged_usage(choices: Sequence, finals: Sequence[OutputFinal]) -> dict:
    """The usage of several choices: each prompt counted once, with its cached tokens as its first
    choice found them (the one that computes the prompt the others share; the JSON body's
    ``reused_prompt_tokens`` is the first prompt's), and every choice's output and reasoning."""
    prompts: dict[int, Usage] = {}
    for choice, final in zip(choices, finals):
        prompts.setdefault(choice.prompt_index, final.usage)
    return usage_body(Usage(sum(usage.prompt_tokens for usage in prompts.values()),
                            sum(final.usage.completion_tokens for final in finals),
                            sum(usage.cached_tokens for usage in prompts.values()),
                            sum(final.usage.reasoning_tokens for final in finals)))


class ChoiceMailbox:
    """Items of several bridges, in arrival order per choice, for one reading task."""

    def __init__(self):
        self._arrived: dict[int, list[Item]] = {}
        self._waiter: asyncio.Future | None = None

    def put(self, index: int, items: list[Item]) -> None:
        self._arrived.setdefault(index, []).extend(items)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> dict[int, list[Item]]:
        """Every choice's items that arrived (choice index -> items), waiting for at least one."""
        while not self._arrived:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        arrived, self._arrived = self._arrived, {}
        return arrived


class ChoicesPresenter:
    """SSE bytes of several choices' items: each chunk with its choice's ``index``, the response's
    ``id`` (`response_id`, as in the JSON body) and ``created`` (the first choice's), observed choices'
    ``prompt_token_ids`` as in the JSON body (the first choice's at the top level; with a batch of
    prompts each choice's on the choice too), a chat prompt's ``prompt_logprobs`` once (the first
    choice's); the per-choice
    usage chunks dropped for one merged usage chunk at the end, with the first choice's observation
    fields as the JSON body has them (without include_usage, an observed response's terminal fields
    ride on the terminal chunk of the last choice to finish, as a single choice's ride on its own)."""

    def __init__(self, choices: Sequence, presenters: Sequence[StreamPresenter]):
        self._choices = choices
        self._presenters = presenters
        head = choices[0].prepared.head
        self._head = head
        self._response_id = response_id(choices)
        self._is_batch = is_batch(choices)
        self.finals: list[OutputFinal | None] = [None] * len(choices)
        # Continuous usage (`StreamPresenter.continuous_usage`): every chunk carries the response's
        # usage so far, each prompt once and every choice's output tokens so far (the chunks of the
        # last choice's end carry the merged usage of the end, details included).
        self._is_continuous = bool(presenters) and presenters[0].continuous_usage
        self._prompt_lens = {choice.prompt_index: len(choice.prepared.prompt_token_ids) for choice in choices}
        self._num_outputs = [0] * len(choices)

    def _render(self, index: int, chunks: list[dict]) -> bytes:
        out = []
        for chunk in chunks:
            if not chunk["choices"] and chunk.get("usage") is not None:
                continue  # a choice's usage-only chunk: one merged chunk at the end instead
            if self._is_continuous:  # the choice's usage so far becomes the response's
                self._num_outputs[index] = chunk["usage"]["completion_tokens"]
                chunk["usage"] = self._usage_so_far()
            elif chunk["choices"] and chunk.get("usage") is not None:
                # An observed choice's terminal chunk (no include_usage) carries the terminal
                # fields: the response's (as in the JSON body) on the last choice to finish, none
                # on the others.
                for name in _TERMINAL_FIELDS:
                    chunk.pop(name, None)
                if self._is_over():
                    chunk.update(self._terminal_fields())
            chunk["id"], chunk["created"] = self._response_id, self._head.created  # each choice has its own
            for entry in chunk["choices"]:
                entry["index"] = index
            prompt_ids = chunk.pop("prompt_token_ids", None)  # on each observed choice's first chunk
            if prompt_ids is not None:
                if index == 0:
                    chunk["prompt_token_ids"] = prompt_ids
                if self._is_batch:
                    chunk["choices"][0]["prompt_token_ids"] = prompt_ids
            if index != 0 and chunk.pop("prompt_logprobs", None) is not None:
                # A chat prompt's scores: once, the first choice's, as the JSON body has them; the
                # other choices' chunk of them (`StreamPresenter._echo_chunks`) carries nothing else.
                continue
            out.append(sse_data(chunk))
        return b"".join(out)

    def start(self) -> bytes:
        return b"".join(self._render(i, p.start_chunks()) for i, p in enumerate(self._presenters))

    def present(self, arrived: dict[int, list[Item]]) -> tuple[bytes, bool]:
        """The bytes of what arrived and whether the stream is over (every choice finished, or one
        failed: its error event ends the stream). A presentation failure ends it with an
        execution error event."""
        parts = []
        try:
            for index, items in arrived.items():
                presenter = self._presenters[index]
                for item in runs_of(items):
                    if isinstance(item, StepRun):
                        parts.append(self._render(index, presenter.run_chunks(item)))
                    elif isinstance(item, OutputFinal):
                        self.finals[index] = item
                        parts.append(self._render(index, presenter.finish_chunks(item)))
                    else:
                        parts.append(sse_error(item.error))
                        return b"".join(parts), True
            if not self._is_over():
                return b"".join(parts), False
            parts.append(self._end())
        except Exception as error:  # noqa: BLE001 - the stream still ends with one terminal event
            failure = error if isinstance(error, HeliosError) else ExecutionError(f"presentation failed: {error}")
            parts.append(sse_error(failure))
        return b"".join(parts), True

    def _usage_so_far(self) -> dict:
        if self._is_over():  # the last choice's end: the final usage, details included
            return merged_usage(self._choices, self.finals)
        return usage_counts(sum(self._prompt_lens.values()), sum(self._num_outputs))

    def _is_over(self) -> bool:
        return all(final is not None for final in self.finals)

    def _terminal_fields(self) -> dict:
        """The terminal fields of the JSON body: the merged usage and the first choice's observation
        fields (`helios.server.fanout.fanout_json`)."""
        fields = _terminal_fields(self.finals[0])
        fields["usage"] = merged_usage(self._choices, self.finals)
        return fields

    def _end(self) -> bytes:
        head = self._head
        if not head.options.include_usage:
            return SSE_DONE
        usage = {"id": self._response_id, "object": _OBJECTS[head.kind][1], "created": head.created,
                 "model": head.model, "choices": [], **self._terminal_fields()}
        return sse_data(usage) + SSE_DONE


class ChoicesSSEResponse(LeasedSSE):
    """The stream of several choices (see the module docstring)."""

    def __init__(self, choices: Sequence, lease: Lease):
        """`lease`: the first choice's bridge, the others' in `others`."""
        super().__init__(lease)
        self._choices = choices

    async def _stream(self, scope: Scope, _receive: Receive, send: Send) -> None:
        write, _transport, raw = await self._open(scope, send)
        presenter = ChoicesPresenter(self._choices, [choice.prepared.new_stream() for choice in self._choices])
        mailbox = ChoiceMailbox()
        bridges = [choice.bridge for choice in self._choices]
        start = presenter.start()
        if start and not (raw is not None and raw(start)):
            await write({"type": "http.response.body", "body": start, "more_body": True})
        for index, bridge in enumerate(bridges):
            bridge.forward_to(functools.partial(mailbox.put, index))
        try:
            while True:
                chunk, is_done = presenter.present(await mailbox.take())
                if is_done:
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return
                if chunk and not (raw is not None and raw(chunk)):
                    await write({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            for bridge in bridges:
                bridge.forward_to(None)
