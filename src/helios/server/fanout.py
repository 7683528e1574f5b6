"""Several choices in one response: ``n`` > 1 and batched prompts in ``/v1/completions``.

A request with ``n`` choices per prompt (and, for text completions, a list of prompts) runs as one
engine request per choice, with its own grammar matcher, tool-call ids and output path (a prompt is
prepared once: its other choices share its template render, tokens, images and grammar check, and
compile only a matcher of their own, `FrontendModel.prepare_choice`), and holding its own admission
permit (all taken at once, or the request gets 429; more choices than the server has permits is a
400, `helios.server.admission`).
Choice ``j`` of a prompt samples with seed ``s + j`` (mod 2**64), ``s`` being the seed that prompt's
first choice resolved (the request's ``seed``, the core's fixed seed, or fresh random bits), so a
seeded request is reproducible choice by choice and greedy choices are identical. The prompt is
computed once: the scheduler admits the first choice, holds the others until its prefill commits,
then admits them onto its pages (all but the page of the last prompt token shared by reference,
that one copied) so each computes only the last prompt token and samples with its own seed
(`helios.runtime.cache.prompt_sharing`; ``reused_prompt_tokens`` is the prompt length minus one).
``best_of`` equal to ``n`` is the same thing.

Every choice is prepared before any is submitted: a batch with a prompt that cannot be served
(longer than the context, empty, ids outside the input vocabulary, no room for ``max_tokens``) is
that prompt's 400, naming ``prompt[i]`` (`named_batch_prompt`), never a partial answer.
Choices are numbered prompt by prompt: choice ``j`` of prompt ``i`` has ``index = i * n + j``.
An observed response (``return_token_ids``) has the first prompt's ``prompt_token_ids`` at the top
level and, for a batch of several prompts, each choice its own prompt's on the choice.
Usage counts each prompt once (its ``cached_tokens`` as its first choice found the cache) and
every choice's output (and reasoning tokens). JSON: one body with every choice (the first
failure instead, as its status, with the other choices cancelled as soon as it arrives). SSE: the choices' chunks
interleaved as they come, each with its ``index`` and the response's ``id`` (the request's: one id
for the whole response, as OpenAI and vLLM give, never a choice's), then one usage chunk
(with ``stream_options.include_usage``) and one ``[DONE]``; a failure ends the stream with one
``event: error`` and cancels the other choices (`helios.server.choice_stream`, which keeps the
single stream's send deadline, disconnect and shutdown behaviour).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable, Sequence

from starlette.responses import Response

from helios.errors import RequestError
from helios.frontend.preparation.generation import ContextLimitExceeded
from helios.frontend.responses.presentation import error_body
from helios.frontend.session import PreparedRequest
from helios.server.bridge import Failure, ResponseBridge
from helios.server.choice_stream import ChoicesSSEResponse, is_batch, merged_usage, response_id
from helios.server.responses import Lease, LeasedJSONResponse
from helios.server.schemas import MAX_CHOICES

class TooManyChoices(RequestError):
    """More choices (``n`` times the prompts) than one request may ask for."""


def with_choice_seed(prepared: PreparedRequest, first_seed: int, choice: int) -> PreparedRequest:
    """`prepared` sampling with seed ``first_seed + choice`` (wrapped to a signed 64-bit seed)."""
    sampling = prepared.params.sampling.with_seed(first_seed + choice)
    return dataclasses.replace(prepared, params=dataclasses.replace(prepared.params, sampling=sampling))


@dataclasses.dataclass(frozen=True)
class Choice:
    prepared: PreparedRequest
    bridge: ResponseBridge
    prompt_index: int


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def fanout_json(choices: Sequence[Choice], receive, send_timeout_s: float | None,
                      is_dropping: Callable[[], bool]) -> Response:
    """One JSON body of every choice (see the module docstring). The response closes every bridge
    once it is written (`LeasedJSONResponse`), as a single choice's does: the choices' permits bound
    the body a reader has not taken yet, and its write is under the send deadline."""
    waiters = [asyncio.ensure_future(choice.bridge.terminal()) for choice in choices]
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    lease = Lease(choices[0].bridge, send_timeout_s, is_dropping, tuple(choice.bridge for choice in choices[1:]))
    try:
        gathered = asyncio.gather(*waiters)
        remaining = set(waiters)
        while remaining:  # until every choice ended, the client left, or one choice failed
            done, _ = await asyncio.wait((*remaining, watcher), return_when=asyncio.FIRST_COMPLETED)
            remaining -= done
            if watcher in done or any(isinstance(waiter.result(), Failure) for waiter in done - {watcher}):
                for choice in choices:  # the answer is settled: the others stop generating
                    choice.bridge.cancel()
                break
        terminals = await gathered
        failure = next((t for t in terminals if isinstance(t, Failure)), None)
        if failure is not None:
            return LeasedJSONResponse(error_body(failure.error), failure.error.http_status, lease)
        return LeasedJSONResponse(_merged_body(choices, terminals), 200, lease)
    except BaseException:
        lease.close()
        raise
    finally:
        watcher.cancel()


def _merged_body(choices: Sequence[Choice], terminals: Sequence) -> dict:
    """The JSON body of every choice's final record (see the module docstring)."""
    bodies = [choice.prepared.response_body(final) for choice, final in zip(choices, terminals)]
    entries = [body["choices"][0] for body in bodies]
    batch = is_batch(choices)
    for index, (entry, body) in enumerate(zip(entries, bodies)):
        entry["index"] = index
        if batch and "prompt_token_ids" in body:  # the top level has the first prompt's only
            entry["prompt_token_ids"] = body["prompt_token_ids"]
    merged = bodies[0]
    merged["id"] = response_id(choices)
    merged["choices"] = entries
    merged["usage"] = merged_usage(choices, terminals)
    return merged


def fanout_stream(choices: Sequence[Choice], send_timeout_s: float | None,
                  is_dropping: Callable[[], bool]) -> Response:
    """The SSE stream of every choice (`helios.server.choice_stream`); it closes every bridge."""
    lease = Lease(choices[0].bridge, send_timeout_s, is_dropping, tuple(choice.bridge for choice in choices[1:]))
    return ChoicesSSEResponse(choices, lease)


def choice_bodies(body, is_chat: bool) -> list[tuple[int, int, object]] | None:
    """(prompt index, choice, body of one choice) of a request with several choices or a batch of
    prompts (a batch of one included); None for ``n`` 1 and one unbatched prompt."""
    n = body.n or 1
    prompts = [None]
    is_batch = is_prompt_batch(body, is_chat)
    if is_batch:
        prompts = list(body.prompt)
    elif n == 1:
        return None
    if n * len(prompts) > MAX_CHOICES:
        raise TooManyChoices(f"n ({n}) times the number of prompts ({len(prompts)}) may be at most {MAX_CHOICES}")
    out = []
    for i, prompt in enumerate(prompts):
        update = {"n": None} if is_chat else {"n": None, "best_of": None}
        if prompt is not None:
            update["prompt"] = prompt
        one = body.model_copy(update=update)
        out.extend((i, j, one) for j in range(n))
    return out


def is_prompt_batch(body, is_chat: bool) -> bool:
    """Whether `body` is a text completion with a batch of prompts (a batch of one included)."""
    return not is_chat and _is_batch(body.prompt)


def named_batch_prompt(error: RequestError, prompt_index: int) -> RequestError:
    """`error`, raised preparing prompt `prompt_index` of a batch, naming that prompt as a schema
    violation names it: a prompt error's ``param`` becomes ``prompt[i]``, and its message (or that
    of an output limit the prompt leaves no room for) starts with ``prompt[i]: ``. Other errors
    (the same for every prompt) are returned as they are. Changes `error` in place."""
    where = f"prompt[{prompt_index}]"
    if error.param == "prompt":
        error.param = where
    elif not isinstance(error, ContextLimitExceeded):
        return error
    error.args = (f"{where}: {error}",)
    return error


def _is_batch(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
