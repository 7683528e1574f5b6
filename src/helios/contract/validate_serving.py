"""ServingContract rules: served names, extents, capacities and serving defaults.

Runs after the model checks, so vocabulary ranges and page geometry are known to be sound.
"""

from __future__ import annotations

import math

from helios.contract import serving_pb2 as spb
from helios.contract.rules import CONTRACT, fail, require
from helios.contract.validate_model import input_range

DEFAULTS = f"{CONTRACT}.defaults"
SAMPLING = f"{DEFAULTS}.sampling"


def check_serving(contract: spb.ServingContract) -> None:
    require(contract.served_id != "", f"{CONTRACT}.served_id", "served identifier is empty")
    _check_aliases(contract)
    require(contract.cache_identity != "", f"{CONTRACT}.cache_identity", "cache identity is empty")
    require(contract.context_tokens > 0, f"{CONTRACT}.context_tokens", "must be nonzero")
    require(contract.prefill_tokens > 0, f"{CONTRACT}.prefill_tokens", "must be nonzero")
    require(
        contract.prefill_tokens <= contract.context_tokens,
        f"{CONTRACT}.prefill_tokens",
        f"exceeds context_tokens ({contract.context_tokens})",
    )
    require(contract.max_concurrency > 0, f"{CONTRACT}.max_concurrency", "must be nonzero")
    _check_pages(contract)
    previous = 0
    for i, width in enumerate(contract.speculative_widths):
        require(
            width > previous,
            f"{CONTRACT}.speculative_widths[{i}]",
            "speculative widths must be nonzero and strictly ascending",
        )
        previous = width
    require(contract.HasField("defaults"), DEFAULTS, "serving defaults are required")
    _check_sampling(contract)
    _check_tokens(contract)


def _check_aliases(contract: spb.ServingContract) -> None:
    seen = {contract.served_id}
    for i, alias in enumerate(contract.aliases):
        path = f"{CONTRACT}.aliases[{i}]"
        require(alias != "", path, "alias is empty")
        if alias in seen:
            fail(path, f"alias {alias!r} repeats the served identifier or another alias")
        seen.add(alias)


def _check_pages(contract: spb.ServingContract) -> None:
    page_tokens = contract.model.cache.page_tokens
    needed = math.ceil(contract.context_tokens / page_tokens)
    require(
        contract.page_capacity >= needed,
        f"{CONTRACT}.page_capacity",
        f"{contract.page_capacity} pages cannot hold one full-context request ({needed} pages)",
    )


def _check_sampling(contract: spb.ServingContract) -> None:
    require(contract.defaults.HasField("sampling"), SAMPLING, "sampling defaults are required")
    sampling = contract.defaults.sampling
    checks = (
        ("temperature", lambda v: v >= 0.0, "must be >= 0"),
        ("top_p", lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
        ("min_p", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
        ("repetition_penalty", lambda v: v > 0.0 and math.isfinite(v), "must be finite and > 0"),
        ("presence_penalty", lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
        ("frequency_penalty", lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    )
    for name, valid, message in checks:
        if sampling.HasField(name):
            # NaN fails every comparison, so it is rejected here as well.
            require(valid(getattr(sampling, name)), f"{SAMPLING}.{name}", message)
    if sampling.HasField("temperature"):
        require(math.isfinite(sampling.temperature), f"{SAMPLING}.temperature", "must be finite")
    if sampling.HasField("max_output_tokens"):
        limit = sampling.max_output_tokens
        require(
            0 < limit <= contract.context_tokens,
            f"{SAMPLING}.max_output_tokens",
            f"must be in [1, context_tokens={contract.context_tokens}]",
        )
    if sampling.seed_policy == spb.SEED_POLICY_FIXED:
        require(sampling.HasField("seed"), f"{SAMPLING}.seed", "SEED_POLICY_FIXED requires a seed")
    else:
        require(not sampling.HasField("seed"), f"{SAMPLING}.seed", "only SEED_POLICY_FIXED declares a seed")


def _check_tokens(contract: spb.ServingContract) -> None:
    defaults = contract.defaults
    sampled = contract.model.vocabulary.sampled
    require(len(defaults.eos_token_ids) > 0, f"{DEFAULTS}.eos_token_ids", "at least one EOS id is required")
    seen_ids: set[int] = set()
    for i, token in enumerate(defaults.eos_token_ids):
        path = f"{DEFAULTS}.eos_token_ids[{i}]"
        require(sampled.begin <= token < sampled.end, path, f"EOS id {token} is outside the sampled vocabulary")
        require(token not in contract.model.vocabulary.excluded_ids, path, f"EOS id {token} is never sampled (excluded)")
        require(token not in seen_ids, path, f"duplicate EOS id {token}")
        seen_ids.add(token)
    begin, end = input_range(contract.model)
    names: set[str] = set()
    for i, token in enumerate(defaults.template_tokens):
        path = f"{DEFAULTS}.template_tokens[{i}]"
        require(token.name != "", f"{path}.name", "template token name is empty")
        require(token.name not in names, f"{path}.name", f"duplicate template token {token.name!r}")
        names.add(token.name)
        require(token.text != "", f"{path}.text", "template token text is empty")
        require(begin <= token.token_id < end, f"{path}.token_id", "outside the input vocabulary")
