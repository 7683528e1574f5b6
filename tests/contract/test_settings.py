"""resolve_settings: core defaults fill missing settings; explicit startup options win; options
outside the prepared capacities are rejected with a `startup.<option>` path."""

from __future__ import annotations

import dataclasses

import pytest

from contract.documents import decode_doc, drop_graphs, example_doc, example_text, graph, version_2_doc
from helios.contract import (
    PreparedContract,
    ResolvedSettings,
    SamplingOptions,
    StartupOptionError,
    StartupOptions,
    resolve_settings,
)
from helios.contract import serving_pb2 as spb
from helios.errors import ContractError


@pytest.fixture(scope="module")
def prepared() -> PreparedContract:
    return PreparedContract.from_json(example_text())


def test_core_defaults_fill_every_missing_setting(prepared):
    settings = resolve_settings(prepared)
    assert settings == prepared.defaults
    assert (settings.max_concurrency, settings.context_tokens, settings.prefill_tokens) == (64, 32768, 8192)
    assert (settings.page_capacity, settings.snapshot_capacity) == (16384, 256)
    assert settings.speculative_widths == (1, 4) and settings.learned_speculation
    assert settings.history_drafting is False  # export records no history preference
    sampling = settings.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (0.6, 0.9, 50, 0.0)
    assert (sampling.repetition_penalty, sampling.presence_penalty, sampling.frequency_penalty) == (1.05, 0.0, 0.1)
    assert sampling.max_output_tokens == 4096
    assert (sampling.seed_policy, sampling.seed) == (spb.SEED_POLICY_RANDOM, None)
    assert settings.eos_token_ids == (128001, 128008, 128009)


def test_explicit_options_win(prepared):
    options = StartupOptions(
        max_concurrency=8,
        context_tokens=8192,
        prefill_tokens=2048,
        page_capacity=4096,
        snapshot_capacity=0,
        speculative_width=1,
        sampling=SamplingOptions(temperature=0.0, top_k=0, max_output_tokens=100, seed=42),
    )
    settings = resolve_settings(prepared, options)
    assert (settings.max_concurrency, settings.context_tokens, settings.prefill_tokens) == (8, 8192, 2048)
    assert (settings.page_capacity, settings.snapshot_capacity, settings.speculative_widths) == (4096, 0, (1,))
    assert (settings.sampling.temperature, settings.sampling.top_k, settings.sampling.max_output_tokens) == (0.0, 0, 100)
    assert (settings.sampling.seed_policy, settings.sampling.seed) == (spb.SEED_POLICY_FIXED, 42)
    assert settings.sampling.top_p == 0.9  # not given: the core's value


def test_neutral_values_fill_what_the_core_does_not_record():
    doc = example_doc()
    doc["contract"]["defaults"]["sampling"] = {"seed_policy": "SEED_POLICY_RANDOM"}
    settings = resolve_settings(decode_doc(doc))
    sampling = settings.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (1.0, 1.0, 0, 0.0)
    assert (sampling.repetition_penalty, sampling.presence_penalty, sampling.frequency_penalty) == (1.0, 0.0, 0.0)
    assert sampling.max_output_tokens == settings.context_tokens


def test_output_limit_follows_a_reduced_context(prepared):
    settings = resolve_settings(prepared, StartupOptions(context_tokens=1024))
    assert settings.sampling.max_output_tokens == 1024 and settings.prefill_tokens == 1024


def test_result_is_frozen(prepared):
    settings = resolve_settings(prepared)
    assert isinstance(settings, ResolvedSettings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_concurrency = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.sampling.temperature = 2.0


def test_disabling_learned_speculation_keeps_width_one(prepared):
    settings = resolve_settings(prepared, StartupOptions(learned_speculation=False))
    assert settings.speculative_widths == (1,) and not settings.learned_speculation


def test_history_drafting_with_copied_inputs(prepared):
    settings = resolve_settings(prepared, StartupOptions(history_drafting=True))
    assert settings.history_drafting and settings.learned_speculation


def test_history_drafting_needs_copied_inputs_in_each_selected_wider_graph():
    doc = example_doc()
    entry = graph(doc, "speculate_w4")[0]
    entry["bindings"] = [b for b in entry["bindings"] if b["source"] != "VALUE_SOURCE_COPIED_CANDIDATE_IDS"]
    prepared = decode_doc(doc)
    with pytest.raises(StartupOptionError) as caught:
        resolve_settings(prepared, StartupOptions(history_drafting=True))
    assert caught.value.path == "startup.history_drafting" and "speculate_w4" in caught.value.reason
    # Selecting only width one leaves nothing to draft into: refused rather than accepted and unused.
    with pytest.raises(StartupOptionError) as caught:
        resolve_settings(prepared, StartupOptions(history_drafting=True, speculative_width=1))
    assert caught.value.path == "startup.history_drafting" and "width above 1" in caught.value.reason


@pytest.mark.parametrize(
    ("options", "path"),
    [
        (StartupOptions(max_concurrency=65), "startup.max_concurrency"),
        (StartupOptions(max_concurrency=0), "startup.max_concurrency"),
        (StartupOptions(context_tokens=40000), "startup.context_tokens"),
        (StartupOptions(prefill_tokens=9000), "startup.prefill_tokens"),
        (StartupOptions(context_tokens=1024, prefill_tokens=2048), "startup.prefill_tokens"),
        (StartupOptions(page_capacity=100), "startup.page_capacity"),
        (StartupOptions(snapshot_capacity=-1), "startup.snapshot_capacity"),
        (StartupOptions(speculative_width=2), "startup.speculative_width"),
        (StartupOptions(history_drafting=True, learned_speculation=False), "startup.history_drafting"),
        (StartupOptions(sampling=SamplingOptions(temperature=-1.0)), "startup.sampling.temperature"),
        (StartupOptions(sampling=SamplingOptions(top_p=0.0)), "startup.sampling.top_p"),
        (StartupOptions(sampling=SamplingOptions(top_k=-1)), "startup.sampling.top_k"),
        (StartupOptions(sampling=SamplingOptions(max_output_tokens=40000)), "startup.sampling.max_output_tokens"),
        (StartupOptions(sampling=SamplingOptions(seed=-5)), "startup.sampling.seed"),
        (StartupOptions(max_concurrency=True), "startup.max_concurrency"),
    ],
)
def test_options_outside_prepared_capacities(prepared, options, path):
    with pytest.raises(StartupOptionError) as caught:
        resolve_settings(prepared, options)
    assert caught.value.path == path
    assert isinstance(caught.value, ContractError) and caught.value.exit_code == 2


def test_snapshot_rows_are_runtime_storage_needing_no_snapshot_programs():
    """Snapshots are runtime copies into continuation rows: a core without SNAPSHOT/RESTORATION
    graphs may declare them, and a startup option may size them."""
    doc = version_2_doc()
    drop_graphs(doc, {"GRAPH_OPERATION_SNAPSHOT", "GRAPH_OPERATION_RESTORATION"})
    prepared = decode_doc(doc)
    assert resolve_settings(prepared, StartupOptions()).snapshot_capacity == 256
    assert resolve_settings(prepared, StartupOptions(snapshot_capacity=4)).snapshot_capacity == 4
    with pytest.raises(StartupOptionError) as caught:
        resolve_settings(prepared, StartupOptions(snapshot_capacity=-1))
    assert caught.value.path == "startup.snapshot_capacity"


def test_learned_speculation_needs_a_wider_width():
    prepared = decode_doc(version_2_doc())
    assert resolve_settings(prepared).speculative_widths == () and not resolve_settings(prepared).learned_speculation
    # --speculative-width 1 turns speculation off: on a core with no speculative width too (it was refused)
    off = resolve_settings(prepared, StartupOptions(speculative_width=1))
    assert off.speculative_widths == () and not off.learned_speculation
    with pytest.raises(StartupOptionError) as caught:
        resolve_settings(prepared, StartupOptions(learned_speculation=True))
    assert caught.value.path == "startup.learned_speculation"
