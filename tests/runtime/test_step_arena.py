"""The step arena: the buffers a step rewrites share one allocation, so the packer's staging uploads
a step with one copy (a run of neighbouring buffers) and never copies a buffer the step did not
write. A device model's loader builds the arena; here host tensors stand in for the device (the
staging's logic is the same), and the fixture core generates its recorded tokens through it."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType, SimpleNamespace

import torch

from helios.contract import serving_pb2 as S
from helios.runtime.execution.pack_staging import Staging
from helios.runtime.execution.step_mirrors import StepMirrors, arena_of
from helios.runtime.loading.step_arena import ALIGN, into_arena, step_buffers


def _view(buffer: str, source: int = S.VALUE_SOURCE_SLOT, indexing: int = S.INDEXING_SUBMISSION_ROW):
    return SimpleNamespace(buffer=buffer, destination=buffer, source=source, indexing=indexing,
                           offset=0, padding=0, constant=0)


GRAPHS = {
    "decode": SimpleNamespace(bindings=[_view("slots"), _view("tokens", S.VALUE_SOURCE_PROMPT_TOKENS,
                                                               S.INDEXING_PACKED_TOKEN),
                                        _view("mask", S.VALUE_SOURCE_GRAMMAR_MASK),
                                        _view("table", S.VALUE_SOURCE_PAGE_TABLE, S.INDEXING_PHYSICAL_REQUEST_ROW)]),
    "mixed": SimpleNamespace(bindings=[_view("slots"), _view("tokens", S.VALUE_SOURCE_PROMPT_TOKENS,
                                                              S.INDEXING_PACKED_TOKEN),
                                       _view("prefill_row", S.VALUE_SOURCE_MIXED_PREFILL_ROW,
                                             S.INDEXING_SCALAR)]),
}


def _buffers() -> dict[str, torch.Tensor]:
    return {"slots": torch.zeros(4, dtype=torch.int64), "tokens": torch.zeros(37, dtype=torch.int64),
            "mask": torch.zeros(4, 5, dtype=torch.int32), "table": torch.zeros(4, 8, dtype=torch.int32),
            "prefill_row": torch.zeros((), dtype=torch.int64), "submission": torch.zeros(1, dtype=torch.int64)}


def test_step_buffers_exclude_admission_rows_and_put_rewritten_then_kept_then_masks():
    # tokens, the prefill row and the submission id change every step; slots (a keyed source) stay
    # while a decode cohort's rows do, so they lie after them, and the masks last.
    names = step_buffers(GRAPHS, "submission")
    assert names == ("submission", "tokens", "prefill_row", "slots", "mask")
    assert "table" not in names and step_buffers(GRAPHS) == ("tokens", "prefill_row", "slots", "mask")


def test_into_arena_keeps_values_and_aligns_every_buffer_in_one_allocation():
    buffers = _buffers()
    buffers["tokens"].copy_(torch.arange(37))
    moved = into_arena(buffers, step_buffers(GRAPHS, "submission"))
    assert moved["table"] is buffers["table"]  # not a step buffer: left alone
    storage = moved["slots"].untyped_storage().data_ptr()
    for name in step_buffers(GRAPHS, "submission"):
        tensor = moved[name]
        assert tensor.untyped_storage().data_ptr() == storage and (tensor.data_ptr() - storage) % ALIGN == 0
        assert tensor.shape == buffers[name].shape and tensor.dtype == buffers[name].dtype
        assert torch.equal(tensor, buffers[name])
    found = arena_of([moved[name] for name in step_buffers(GRAPHS, "submission")])
    assert found is not None and found[0].numel() == 6 * ALIGN  # each rounded up to ALIGN (296 token bytes: two)


def test_separate_overlapping_or_meta_tensors_are_no_arena():
    assert arena_of([torch.zeros(3), torch.zeros(3)]) is None
    whole = torch.zeros(64)
    assert arena_of([whole[:10], whole[5:20]]) is None  # overlapping views
    assert arena_of([whole[:10], whole[16:20]]) is not None
    assert arena_of([torch.zeros(3, device="meta")]) is None


def test_a_step_uploads_one_run_of_neighbours_and_never_a_buffer_it_did_not_write():
    names = step_buffers(GRAPHS, "submission")
    device = into_arena(_buffers(), names)
    mirrors = StepMirrors(device, names, pinned=False)
    assert mirrors.arena
    assert mirrors.runs({"submission", "tokens"}) == [(0, ALIGN + 37 * 8)]  # a steady decode step: one copy
    # prefill_row is not written: submission..tokens and slots..mask are two copies, prefill_row stays.
    device["prefill_row"].fill_(9)
    frame = mirrors.sets[1]
    for name in ("slots", "tokens", "mask", "prefill_row"):
        frame[name].fill_(3)
    assert mirrors.upload(1, {"slots", "submission", "tokens", "mask"}) == 2
    assert mirrors.runs({"slots", "tokens"}) == [(ALIGN, ALIGN + 37 * 8), (4 * ALIGN, 4 * ALIGN + 8 * 4)]  # not across prefill_row
    assert int(device["prefill_row"]) == 9 and bool((device["mask"] == 3).all()) and bool((device["tokens"] == 3).all())
    assert mirrors.upload(0, set()) == 0


def test_without_an_arena_every_buffer_has_its_own_copy():
    names = step_buffers(GRAPHS, "submission")
    device = _buffers()
    mirrors = StepMirrors(device, names, pinned=False)
    assert not mirrors.arena
    mirrors.sets[0]["tokens"].fill_(5)
    assert mirrors.upload(0, {"tokens", "slots"}) == 2 and bool((device["tokens"] == 5).all())


def test_the_submission_id_is_staged_with_the_step():
    names = step_buffers(GRAPHS, "submission")
    device = into_arena(_buffers(), names)
    staging = Staging(SimpleNamespace(graphs=GRAPHS), device, True, "submission")
    staging.begin(1, 7)
    staging.target("tokens").fill_(2)
    staging.write_value("submission", 7)
    assert int(device["submission"]) == 0  # staged: nothing reaches the buffer before the upload
    staging.upload()
    assert int(device["submission"]) == 7 and staging.uploads == 1
    in_place = Staging(SimpleNamespace(graphs=GRAPHS), device, False, "submission")
    in_place.write_value("submission", 8)
    assert int(device["submission"]) == 8


def test_the_fixture_core_generates_its_tokens_through_an_arena_with_one_upload_per_step():
    from runtime.test_model_fixture import EXPECTED, _engine, open_fixture

    from helios.runtime.offline import generate
    from helios.runtime.service import build_runtime

    model = build_runtime(open_fixture()).model
    names = step_buffers(model.prepared.graphs, model.prepared.manifest.completion.submission_input)
    model = dataclasses.replace(model, buffers=MappingProxyType(into_arena(model.buffers, names)))
    engine = _engine(model, staged=True)
    staging = engine.executor.packer._staging
    uploads = []
    upload = staging.upload

    def counted() -> None:
        before = staging.uploads
        upload()
        uploads.append(staging.uploads - before)

    staging.upload = counted
    results = generate(engine, EXPECTED["prompts"], EXPECTED["max_tokens"])
    assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]
    # The first step also uploads the grammar masks (allocated zero, all-allowed from then on). A
    # decode cohort's kept values (helios.runtime.execution.kept_values) are not rewritten; they lie
    # after the buffers every step rewrites (step_buffers), so those stay one run.
    assert uploads[0] <= 2 and max(uploads[1:]) <= 2
    # A step whose rows are those of the step before writes only what changes every step: one copy.
    # The others (rows admitted or finished) write some kept buffers again: two runs at most.
    assert uploads[1:].count(1) >= 2 * len(uploads[1:]) // 3, uploads
    assert len(names) > 3 * max(uploads)  # against one copy per staged buffer
