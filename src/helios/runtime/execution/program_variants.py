"""Names and tables of a loaded model's step programs: each program's variant name (the scheduler's
`ProgramVariant.name`), the table of programs by that name, their token-logprobs twins, the
scheduler `Operation` of each contract graph operation, and which steps a program's fresh-chunk
graphs may serve (`is_fresh_chunk`).
"""

from __future__ import annotations

from helios.contract import serving_pb2 as spb
from helios.runtime.loading.model import LoadedModel, LoadedProgram
from helios.runtime.records.capacities import Operation


def logprob_twins(programs) -> dict[str, LoadedProgram]:
    """Plain variant name -> its token-logprobs twin (same operation, capacities and inputs, a
    SPECULATIVE program's whole shape included), over the loaded programs that have one. Two plain
    programs alike in all of these (a core's own graphs of one capacity that differ in what they
    compute) get no twin: which twin computes which could not be told, so they run plainly."""
    plain: dict[tuple, list[str]] = {}
    for program in programs:
        if not program.token_logprobs:
            plain.setdefault(_pairing(program), []).append(variant_name(program))
    twins = {}
    for program in programs:
        names = plain.get(_pairing(program), ())
        if program.token_logprobs and len(names) == 1:
            twins[names[0]] = program
    return twins


def speculates_with_logprobs(programs, width: int) -> bool:
    """Whether every loaded SPECULATIVE program has a token-logprobs twin returning at least `width`
    alternatives (the plain programs' twins', `geometry.logprob_width`), and some is loaded: a lane
    that asks for log-probabilities may then speculate (the executor runs the twins)."""
    twins = logprob_twins(programs)
    speculative = [p for p in programs if not p.token_logprobs and p.speculative is not None]
    return width > 0 and bool(speculative) and all(
        variant_name(p) in twins and twins[variant_name(p)].token_logprobs >= width for p in speculative)


def _pairing(program: LoadedProgram) -> tuple:
    return (program.operation, program.batch_capacity, program.packed_token_capacity, program.speculative,
            program.inputs)


def program_table(model: LoadedModel) -> dict[str, LoadedProgram]:
    """Variant name (as the scheduler's `ProgramVariant.name`) -> program."""
    return {variant_name(p): p for p in model.programs}


def is_fresh_chunk(plan) -> bool:
    """Whether the step `plan` (StepPlan) packs one prompt chunk that starts at position 0 and
    nothing else: one row, its tokens host-fed from position 0 (no cached prefix). Its packed tokens
    are then tokens [0, n) at positions 0..n-1, the precondition of ``helios::rotary_fresh_attention``
    (`helios.abi.fresh_attention`), so a program's fresh-chunk graphs compute its result. A fact of
    the plan alone: every tensor-parallel rank decides the same."""
    if len(plan.rows) != 1:
        return False
    row = plan.rows[0]
    return row.start_pos == 0 and not row.pending_on_device and 0 < row.query_len == len(row.token_ids)


def variant_name(program: LoadedProgram) -> str:
    shape = program.speculative
    width = f"w{shape.verify_tokens}" if shape is not None else ""
    return f"{program.graph}.r{program.batch_capacity}{width}t{program.packed_token_capacity}"


OPERATIONS = {  # contract GraphOperation -> scheduler Operation
    spb.GRAPH_OPERATION_PREFILL: Operation.PREFILL,
    spb.GRAPH_OPERATION_DECODE: Operation.DECODE,
    spb.GRAPH_OPERATION_MIXED: Operation.MIXED,
    spb.GRAPH_OPERATION_SCORED_PREFILL: Operation.SCORED_PREFILL,
    spb.GRAPH_OPERATION_SPECULATIVE: Operation.SPECULATIVE,
    spb.GRAPH_OPERATION_RESUME: Operation.RESUME,
}
