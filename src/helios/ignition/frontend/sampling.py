"""Sampling recommendations from a checkpoint's generation_config.json, as contract defaults.

``do_sample: false`` recommends greedy decoding (temperature 0); otherwise the temperature, top_p,
min_p, top_k (0 disables it, as in transformers) and repetition_penalty the file gives are recorded
(values outside the contract's ranges are a prepare error naming the field). Without ``do_sample``
the values given are recorded too, as vLLM and SGLang read them (transformers would decode greedily
and warn). ``max_new_tokens`` is the default output limit of a request that gives no
``max_tokens`` (as vLLM reads it; capped by the prepared context extent); ``max_length`` is not read
(transformers writes its default 20 into saved configs). Fields the publisher sets explicitly in
`PrepareOptions.sampling` win; anything neither gives is left to the runtime's neutral defaults. Requests that set a value
win over all of these.
"""

from __future__ import annotations

from pathlib import Path

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.frontend.tokenizer_files import read_json

FILE = "generation_config.json"


def _read(directory: Path) -> dict:
    return read_json(directory / FILE)


def _number(config: dict, name: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = config.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{FILE}: {name} must be a number, not {value!r}")
    if not low <= value <= high or (low_open and value == low):  # NaN lies in no range
        raise CheckpointError(f"{FILE}: {name} {value} is outside the supported range")
    return float(value)


def recommended_sampling(directory: Path) -> spb.SamplingDefaults:
    """The checkpoint's recommendations (only the fields it gives)."""
    config = _read(directory)
    out = spb.SamplingDefaults()
    if config.get("do_sample") is False:
        out.temperature = 0.0
    else:
        temperature = _number(config, "temperature", 0.0, 100.0)
        if temperature is not None:
            out.temperature = temperature
        top_p = _number(config, "top_p", 0.0, 1.0, low_open=True)
        if top_p is not None:
            out.top_p = top_p
        min_p = _number(config, "min_p", 0.0, 1.0)
        if min_p is not None:
            out.min_p = min_p
        top_k = config.get("top_k")
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
                raise CheckpointError(f"{FILE}: top_k must be a non-negative integer, not {top_k!r}")
            out.top_k = min(top_k, 2**31 - 1)  # any top_k past the vocabulary keeps every token
    penalty = _number(config, "repetition_penalty", 0.0, 100.0, low_open=True)
    if penalty is not None:
        out.repetition_penalty = penalty
    limit = config.get("max_new_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise CheckpointError(f"{FILE}: max_new_tokens must be a positive integer, not {limit!r}")
        out.max_output_tokens = min(limit, 2**31 - 1)
    return out


def merged_sampling(directory: Path, explicit: spb.SamplingDefaults, context_tokens: int) -> spb.SamplingDefaults:
    """`explicit` fields over the checkpoint's recommendations; the checkpoint's output limit is
    capped at the prepared context extent (`context_tokens`), the most any request can generate."""
    merged = recommended_sampling(directory)
    if merged.HasField("max_output_tokens"):
        merged.max_output_tokens = min(merged.max_output_tokens, context_tokens)
    merged.MergeFrom(explicit)  # set fields of `explicit` overwrite
    return merged
