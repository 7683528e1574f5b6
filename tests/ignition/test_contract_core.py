"""The example contract prepared into a core (`helios.ignition.contract_core` on
examples/contract-tiny.json) loads and serves through the generic runtime: greedy tokens equal the
plain reference alone and batched, through the speculative programs (exact lengths and prefix-limit
allocation, history candidates accepted), the decode programs (device-owned and host-fed pending
tokens), scored prefill, an image request through the VISION program, and the Engram host table
(the rows the runtime stages per prompt token reach the programs, checked against the hash);
initialization and startup tuning run. What the runtime does not serve is refused with its path."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from helios.contract import PreparedContract, StartupOptions
from helios.contract.servable import OPERATIONS, SOURCES, NotServableError, Refused
from helios.contract import serving_pb2 as spb
from helios.ignition.contract_core import ContractCoreError, reference_model, write_contract_core
from helios.runtime.engine import EngineRequest
from helios.runtime.execution.images import RequestImages
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.records.events import FinishEvent, PromptScoresEvent, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.service import RuntimeOptions, build_runtime
from support.example_core import TINY_CONTRACT, example_core, open_example

PROMPTS = [[10, 20, 30, 40, 50], [7, 8, 9, 100, 101, 102], [3, 4, 5], [9, 9, 9, 9], [1, 2, 3], [200, 201, 202],
           [33, 34, 35, 36]]
MASK64 = (1 << 64) - 1


class Recorder:
    """Counts the graphs a runtime's executor launches and the drafts it accepts."""

    def __init__(self, runtime):
        self.graphs: Counter[str] = Counter()
        self.accepted = 0
        executor = runtime.engine.executor
        launch, finish = executor.launch, executor.finish

        def launching(plan, **kwargs):
            if plan.variant is not None:
                self.graphs[plan.variant.name.split(".")[0]] += 1
            return launch(plan, **kwargs)

        def finishing(launched):
            output = finish(launched)
            self.accepted += sum(r.accepted_drafts for r in output.results)
            return output

        executor.launch, executor.finish = launching, finishing


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return example_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def runtime(core):
    runtime = build_runtime(open_example(core))
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def reference(runtime):
    return reference_model(dict(runtime.model.weights))


def _run(runtime, specs: list[RequestSpec]) -> dict[str, list]:
    """Every event of `specs`, by request id (submitted together, run to completion)."""
    events: dict[str, list] = {spec.request_id: [] for spec in specs}
    for spec in specs:
        runtime.engine.submit(EngineRequest(spec, events[spec.request_id].append))
    runtime.engine.run_until_idle()
    return events


def _tokens(events: list) -> list[int]:
    assert isinstance(events[-1], FinishEvent) and not events[-1].message, events[-1]
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]


def test_greedy_tokens_equal_the_reference_alone_and_batched_through_speculative_programs(runtime, reference):
    recorder = Recorder(runtime)
    alone = generate(runtime.engine, PROMPTS[:1], 16)
    assert list(alone[0].token_ids) == reference.greedy(PROMPTS[0], 16)
    assert set(recorder.graphs) == {"prefill", "speculate_w4"}  # one lane: the exact-length program
    batched = generate(runtime.engine, PROMPTS, 16)
    assert [list(r.token_ids) for r in batched] == [reference.greedy(p, 16) for p in PROMPTS]
    assert recorder.graphs["speculate_confident"] > 0  # 7 lanes: the prefix-limit program allocates
    # Startup tuning ran its producer (it writes the LAYER_COUNT constant into the tuned buffer).
    assert runtime.model.buffers["tuning.attention_splits"].eq(2).all()


def test_history_candidates_are_accepted_and_change_no_token(core):
    runtime = build_runtime(open_example(core), RuntimeOptions(load=LoadOptions(
        startup=StartupOptions(history_drafting=True))))
    try:
        reference = reference_model(dict(runtime.model.weights))
        chain = reference.greedy([11], 12)
        prompt = [11, *chain, 11]  # its own continuation is in its history: copied candidates match
        recorder = Recorder(runtime)
        result = generate(runtime.engine, [prompt], 12)
        assert list(result[0].token_ids) == reference.greedy(prompt, 12) == chain
        assert recorder.accepted >= 6
    finally:
        runtime.close()


def test_biased_requests_run_the_decode_programs_device_and_host_fed(runtime, reference):
    recorder = Recorder(runtime)
    bias = {5: 4.0, 17: 3.0}
    for count, graph in ((1, "decode"), (3, "decode_host_fed")):
        specs = [RequestSpec(f"bias-{count}-{i}", tuple(PROMPTS[i]), 10, logit_bias=tuple(bias.items()))
                 for i in range(count)]
        events = _run(runtime, specs)
        assert [_tokens(events[s.request_id]) for s in specs] == [reference.greedy(PROMPTS[i], 10, bias=bias)
                                                                   for i in range(count)]
        assert recorder.graphs[graph] > 0
    assert "speculate_w4" not in recorder.graphs and "speculate_confident" not in recorder.graphs


def test_a_one_token_prompt_never_runs_a_decode_program_that_reads_only_device_state(runtime, reference):
    """`decode` takes its pending token from device state only: an admitted lane's one prompt token
    is not there, so the lane runs a prompt program (`ProgramVariant.admits_slots`)."""
    recorder = Recorder(runtime)
    result = generate(runtime.engine, [[77]], 4)
    assert list(result[0].token_ids) == reference.greedy([77], 4)
    assert recorder.graphs["prefill"] == 1 and "decode" not in recorder.graphs


def test_scored_prefill_returns_the_reference_prompt_logprobs(runtime, reference):
    prompt = PROMPTS[1]
    events = _run(runtime, [RequestSpec("scored", tuple(prompt), 4, score_prompt=True)])["scored"]
    scores = [s for e in events if isinstance(e, PromptScoresEvent) for s in e.scores]
    assert len(scores) == len(prompt) - 1
    assert [s.logprob for s in scores] == pytest.approx(reference.prompt_logprobs(prompt), abs=1e-4)
    assert _tokens(events) == reference.greedy(prompt, 4)


def _engram_rows(prepared: PreparedContract, table: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The specification's hash, written out: every head's row of the n-gram ending at each token."""
    spec = prepared.contract.model.host_tables[0]
    n, multipliers = spec.ngram_tokens, list(spec.multipliers)
    rows = []
    for position in range(len(tokens)):
        for head in range(spec.heads):
            key = 0
            for i in range(n):
                p = position - i
                key ^= (((tokens[p] + 1) if p >= 0 else 0) * multipliers[head * n + i]) & MASK64
            rows.append(table[key % table.shape[0]].to(torch.float32))
    return torch.stack(rows).reshape(len(tokens), -1)


def test_the_engram_rows_of_every_prompt_token_reach_the_programs(runtime):
    model = runtime.model
    sink = model.buffers["state.draft_hidden"]
    slots: dict[str, int] = {}
    executor = runtime.engine.executor
    launch = executor.launch

    def launching(plan, **kwargs):
        slots.update((row.request_id, row.slot) for row in plan.rows)
        return launch(plan, **kwargs)

    executor.launch = launching
    filled, cleared = set(), 0  # state rows this test's requests summed into; rows found holding earlier sums
    try:
        for prompt in [PROMPTS[1], PROMPTS[6]] * 8:  # until a slot comes round again (slots are taken in turn)
            before = sink.clone()
            generate(runtime.engine, [prompt], 2)
            row = slots["offline-0"] * model.state_rows_per_request
            expected = _engram_rows(model.prepared, model.weights["w.engram"], prompt).sum(0)
            # Every staged row of the prompt's tokens, summed by the prefill program into its state row.
            torch.testing.assert_close(sink[row, :expected.shape[0]].to(torch.float32), expected, rtol=2e-2, atol=5e-2)
            if row in filled:  # the slot held an earlier request's sums: the INITIALIZATION program cleared them
                assert before[row].abs().sum() > 0
                cleared += 1
            filled.add(row)
            if cleared == 2:
                break
    finally:
        executor.launch = launch
    assert cleared == 2, f"slots {sorted(filled)} never came round twice: the clearing was not checked"


def test_an_image_request_runs_the_vision_program_and_its_features(runtime, reference):
    prepared = runtime.model.prepared
    feature = prepared.contract.model.frontend.image_layout_data.feature_ids[0]
    pixels = np.random.default_rng(3).standard_normal((16, 12)).astype(np.float32)
    grid = np.zeros((4, 3), dtype=np.int16)
    grid[0] = (1, 4, 4)
    prompt = (10, 20, feature, feature, feature, feature)  # ends on the last of the image's 4 features
    images = RequestImages(("ab" * 32,), (16,), ({"pixel_patches": pixels, "grid_thw": grid},),
                           (np.arange(2, 6),))
    embed = runtime.model.weights["w.embed"].to(torch.float32)
    merged = torch.from_numpy(pixels).to(torch.bfloat16).to(torch.float32).reshape(4, 48)
    features = (merged @ embed[:48]).to(torch.bfloat16).to(torch.float32)
    first = int(torch.argmax(features[-1] @ runtime.model.weights["w.lm_head"].to(torch.float32).T))
    expected = [first, *reference.greedy([first], 5)]
    feeder = runtime.engine.executor.images
    before = feeder.stats.encoded_images
    for name in ("img-1", "img-2"):
        spec = RequestSpec(name, prompt, 6, images=images, token_keys=images.token_keys())
        assert _tokens(_run(runtime, [spec])[name]) == expected
    assert feeder.stats.encoded_images == before + 1  # the second request reused the cached features


def test_sampled_requests_follow_their_seeds(runtime):
    sampling = SamplingParams(temperature=1.0, seed=5)
    first, again = (generate(runtime.engine, PROMPTS[:2], 12, sampling=sampling) for _ in range(2))
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    other = generate(runtime.engine, PROMPTS[:2], 12, sampling=SamplingParams(temperature=1.0, seed=6))
    assert [r.token_ids for r in other] != [r.token_ids for r in first]


def _refusal(edit) -> NotServableError:
    doc = json.loads(TINY_CONTRACT.read_text())
    edit(doc)
    with pytest.raises(NotServableError) as refused:
        PreparedContract.from_json(json.dumps(doc))
    return refused.value


def test_what_the_runtime_does_not_serve_is_refused_with_its_path():
    """Indexings shared packing does not supply (per-submission page tables and prompt histograms,
    per-token grammar masks), and any graph operation or value source `servable` refuses."""
    for index, indexing in ((15, "INDEXING_SUBMISSION_ROW"), (24, "INDEXING_SUBMISSION_ROW"),
                            (10, "INDEXING_PACKED_TOKEN")):
        def edit(doc, index=index, indexing=indexing):
            doc["contract"]["model"]["graphs"][1]["bindings"][index]["indexing"] = indexing
        refused = _refusal(edit)
        assert refused.path == f"contract.model.graphs[1].bindings[{index}].indexing"
        assert "not supplied" in str(refused)
    for operation in (op for op, decision in OPERATIONS.items() if isinstance(decision, Refused)):
        def edit(doc, name=spb.GraphOperation.Name(operation)):
            doc["contract"]["model"]["graphs"][0]["operation"] = name
            doc["manifest"]["execution_catalog"][0]["operation"] = name
        assert _refusal(edit).path == "contract.model.graphs[0].operation"
    for source in (s for s, decision in SOURCES.items() if isinstance(decision, Refused)):
        def edit(doc, name=spb.ValueSource.Name(source)):
            doc["contract"]["model"]["graphs"][1]["bindings"][3]["source"] = name
        assert _refusal(edit).path == "contract.model.graphs[1].bindings[3].source"


def test_a_contract_without_the_state_the_programs_keep_is_refused_by_the_generator(tmp_path):
    doc = json.loads(TINY_CONTRACT.read_text())
    model = doc["contract"]["model"]
    model["state_views"] = [v for v in model["state_views"] if v["name"] != "rng_counter"]
    for graph in model["graphs"]:
        graph["state_accesses"] = [a for a in graph.get("state_accesses", []) if a["view"] != "rng_counter"]
    prepared = PreparedContract.from_json(json.dumps(doc))
    from helios.core.keys import SigningKey
    with pytest.raises(ContractCoreError) as refused:
        write_contract_core(prepared, tmp_path / "x.core", SigningKey.generate(), "test.helios/x")
    assert refused.value.path == "contract.model.state_views" and "rng_counter" in str(refused.value)
    assert not (tmp_path / "x.core").exists()


def test_the_command_refuses_a_full_size_contract_before_drawing_weights(tmp_path, capsys):
    from helios.cli.main import main
    from helios.core.keys import SigningKey, write_key_pair

    write_key_pair(tmp_path / "k.key", SigningKey.generate(), ["test.helios/x"])
    full = TINY_CONTRACT.parent / "contract.json"
    code = main(["contract", "example-core", str(full), "-o", str(tmp_path / "x.core"), "--key",
                 str(tmp_path / "k.key"), "--namespace", "test.helios/x"])
    assert code == 3 and not (tmp_path / "x.core").exists()
    assert "manifest.buffers" in capsys.readouterr().err


def test_a_dtype_this_torch_cannot_serialize_is_refused_with_its_buffer(tmp_path, monkeypatch):
    """torch 2.11's program serializer has no unsigned 32-bit tensors: the generator names the buffer."""
    import torch
    from torch._export.serde import serialize

    from helios.core.keys import SigningKey

    without = {k: v for k, v in serialize._TORCH_TO_SERIALIZE_DTYPE.items() if k != torch.uint32}
    monkeypatch.setattr(serialize, "_TORCH_TO_SERIALIZE_DTYPE", without)
    prepared = PreparedContract.from_json(TINY_CONTRACT.read_text())
    with pytest.raises(ContractCoreError) as refused:
        write_contract_core(prepared, tmp_path / "x.core", SigningKey.generate(), "test.helios/x")
    assert refused.value.path.startswith("manifest.buffers[") and refused.value.path.endswith("].dtype")
    assert "uint32" in str(refused.value) and not (tmp_path / "x.core").exists()


def test_unsigned_rows_reads_the_unsigned_values_through_the_signed_view():
    import torch

    from helios.ignition.contract_core.programs import unsigned_rows

    for dtype, top in ((torch.uint16, 65535), (torch.uint32, 4294967295)):
        table = torch.tensor([[1, top], [40000, 7]], dtype=torch.int64).to(dtype)
        rows = unsigned_rows(table, torch.tensor([1, 0, 1]))
        assert rows.dtype == torch.int64
        assert rows.tolist() == [[40000, 7], [1, top], [40000, 7]]
