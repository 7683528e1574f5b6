"""Admission against prepared capacities: typed rejections, checked before a request is queued.

Every rejection is an `AdmissionRejected` (HTTP 503 for non-stream responses); the subclass names
the capacity, never the message text. Rejecting one request never touches any other.
"""

from __future__ import annotations

import math

from helios.errors import AdmissionRejected
from helios.runtime.records.capacities import Capacities, Operation
from helios.runtime.records.request import RequestSpec


class QueueFull(AdmissionRejected):
    """The pending admission deque already holds `queue_capacity` requests."""


class DuplicateRequest(AdmissionRejected):
    """A request with this id is still queued or running."""


class InvalidShape(AdmissionRejected):
    """An empty prompt or an output limit below one token."""


class TokenOutOfRange(AdmissionRejected):
    """A prompt token id outside the prepared input vocabulary, or a stop or EOS token id outside the
    sampled one."""


class InvalidLogitBias(AdmissionRejected):
    """A logit-bias token id repeated or outside the vocabulary (a row's ids must be distinct ids), a
    bias that is not a finite number, or more entries than the programs' logit-bias inputs hold."""


class ContextExceeded(AdmissionRejected):
    """Prompt plus output limit exceed the prepared context extent (`context_positions`)."""


class CacheExceeded(AdmissionRejected):
    """The request could never hold its pages: more than a page table or the whole cache."""


class StopLimitExceeded(AdmissionRejected):
    """More, or longer, stop strings or stop token sequences than prepared, or more EOS ids than the
    programs that match them on the device hold."""


class UnsupportedRequest(AdmissionRejected):
    """The request needs a program the loaded model does not have (e.g. scored prefill)."""


def check_admission(spec: RequestSpec, caps: Capacities) -> None:
    """Raise the `AdmissionRejected` subclass for the first capacity `spec` exceeds."""
    num_prompt = len(spec.prompt_ids)
    if num_prompt == 0 or spec.max_output_tokens < 1:
        raise InvalidShape(f"request {spec.request_id}: empty prompt or output limit below 1")
    limit = caps.input_limit
    if min(spec.prompt_ids) < 0 or max(spec.prompt_ids) >= limit:  # (builtins: a 2,048-token prompt in 0.1 ms)
        raise TokenOutOfRange(f"request {spec.request_id}: prompt token outside [0, {limit})")
    _check_logit_bias(spec, caps)
    total = context_positions(spec)
    if total > caps.context_tokens:
        raise ContextExceeded(
            f"request {spec.request_id}: {num_prompt} prompt + {spec.max_output_tokens} output tokens "
            f"exceed the context extent {caps.context_tokens}")
    pages = caps.cache.layout.pages_for(total)
    if pages > caps.cache.max_pages_per_request:
        raise CacheExceeded(
            f"request {spec.request_id}: needs {pages} pages, a page table holds "
            f"{caps.cache.max_pages_per_request}")
    _check_stops(spec, caps)
    if spec.score_prompt and not caps.has(Operation.SCORED_PREFILL):
        raise UnsupportedRequest(f"request {spec.request_id}: no scored prefill program is loaded")
    if spec.top_logprobs is not None and not 0 <= spec.top_logprobs <= caps.token_logprobs:
        if not caps.token_logprobs:
            raise UnsupportedRequest(f"request {spec.request_id}: no token-logprobs program is loaded")
        raise UnsupportedRequest(
            f"request {spec.request_id}: {spec.top_logprobs} alternatives per token; the programs return "
            f"{caps.token_logprobs}")


def context_positions(spec: RequestSpec) -> int:
    """The context a request takes: its prompt and its output limit, except that a request of one
    output token takes its prompt alone. That token is sampled from the prompt's last row and the
    request ends with it: it is never fed back, so no program computes or stores its position (a
    prompt of the whole context can be scored; the frontend's ``max_tokens: 0``). A longer output
    keeps a position for its last token too, as the OpenAI limit (prompt + max_tokens) counts it."""
    num_prompt = len(spec.prompt_ids)
    return num_prompt if spec.max_output_tokens == 1 else num_prompt + spec.max_output_tokens


def _check_logit_bias(spec: RequestSpec, caps: Capacities) -> None:
    """The sampling kernels add one bias per id (`helios.abi.sampling_rows.greedy_rows_biased`), and a
    row of the programs' logit-bias inputs holds `Capacities.logit_bias_width` of them."""
    ids = [token for token, _ in spec.logit_bias]
    if not ids:
        return
    if not caps.logit_bias_width:
        raise UnsupportedRequest(f"request {spec.request_id}: the loaded programs take no logit bias")
    if len(ids) > caps.logit_bias_width:
        raise InvalidLogitBias(f"request {spec.request_id}: {len(ids)} logit-bias entries; the programs take at "
                               f"most {caps.logit_bias_width}")
    if len(set(ids)) != len(ids) or any(not 0 <= token < caps.vocab_size for token in ids):
        raise InvalidLogitBias(f"request {spec.request_id}: logit-bias ids must be distinct ids in [0, "
                               f"{caps.vocab_size})")
    if not all(math.isfinite(bias) for _, bias in spec.logit_bias):  # inf - inf in a softmax is NaN
        raise InvalidLogitBias(f"request {spec.request_id}: a logit bias must be a finite number")


def _check_stops(spec: RequestSpec, caps: Capacities) -> None:
    stops = caps.stops
    if len(spec.stop_strings) > stops.max_stop_strings or any(not s for s in spec.stop_strings):
        raise StopLimitExceeded(f"request {spec.request_id}: at most {stops.max_stop_strings} nonempty stop strings")
    try:
        num_stop_bytes = sum(len(s.encode("utf-8")) for s in spec.stop_strings)
    except UnicodeEncodeError:
        raise StopLimitExceeded(f"request {spec.request_id}: a stop string is not valid Unicode text") from None
    if num_stop_bytes > stops.max_stop_bytes:
        raise StopLimitExceeded(f"request {spec.request_id}: stop strings exceed {stops.max_stop_bytes} bytes")
    sequences = spec.stop_token_sequences
    if len(sequences) > stops.max_stop_sequences or any(
            not 0 < len(seq) <= stops.max_stop_sequence_tokens for seq in sequences):
        raise StopLimitExceeded(
            f"request {spec.request_id}: at most {stops.max_stop_sequences} stop sequences of "
            f"1..{stops.max_stop_sequence_tokens} tokens")
    if any(not 0 <= token < caps.vocab_size for seq in sequences for token in seq):
        raise TokenOutOfRange(f"request {spec.request_id}: stop token outside the vocabulary")
    if any(not 0 <= token < caps.vocab_size for token in spec.eos_ids):
        raise TokenOutOfRange(f"request {spec.request_id}: EOS token outside the vocabulary")
    if caps.eos_width and len(spec.eos_ids) > caps.eos_width:
        raise StopLimitExceeded(f"request {spec.request_id}: {len(spec.eos_ids)} EOS ids; the programs take at "
                                f"most {caps.eos_width}")
