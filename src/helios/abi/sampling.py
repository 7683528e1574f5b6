"""Token sampling: ``helios::sample``, batch-invariant, with counter-based random numbers.

Signature (the ABI seam; R rows, V vocabulary columns)::

    helios::sample(Tensor logits,        float32 [R, V]
                   Tensor seeds,         int64 [R]
                   Tensor counters,      int64 [R]   draw counter, e.g. tokens sampled before
                   Tensor temperature,   float32 [R]
                   Tensor top_k,         int32 [R]
                   Tensor top_p,         float32 [R]
                   Tensor min_p,         float32 [R]
                   Tensor penalties,     float32 [R, 3]  (repetition, presence, frequency)
                   Tensor prompt_counts, int32 [R, V]
                   Tensor output_counts, int32 [R, V]
                   Tensor grammar_mask,  int32 [R, ceil(V / 32)]
                   Tensor mask_rows)     bool [R]
        -> Tensor                        int64 [R]: token ids, or NO_TOKEN (-1)

Each row is computed independently, in float64 after reading its float32 logits:

1. Read: NaN -> -inf, +inf -> float32 max.
2. Penalties. Repetition r (1 = off, HF/vLLM): a token whose prompt or output count is > 0 gets
   logit / r when logit > 0, else logit * r. Then presence a and frequency f (0 = off, OpenAI): a
   token with output count c > 0 gets logit - f * c - a. Tokens never seen are never changed. The
   host validates penalty ranges; a NaN produced here is treated as -inf.
3. Grammar mask (``helios.abi.grammar`` layout): in rows with mask_rows true, disallowed -> -inf.
4. NaN -> -inf, +inf -> float64 max. A row with no token above -inf returns NO_TOKEN (-1).
5. Temperature T. Unless T > 0 (0, negative or NaN): greedy, the argmax, lowest id on ties.
6. Otherwise z = logit / T (overflow -> float64 max), p = softmax(z).
7. Canonical order: p descending, token id ascending on ties (a stable descending sort). Each
   filter keeps a prefix of that order, and the first position is always kept:
   - top-k (k <= 0 or k >= V = off): positions < k (exactly k tokens; ties broken by id);
   - top-p (p >= 1 = off): over the top-k survivors, the positions whose preceding probability mass
     is < top_p * (mass of the top-k survivors), i.e. the shortest prefix reaching top_p;
   - min-p (<= 0 = off): positions with p >= min_p * p_max.
8. Draw by inverse CDF: w = p on kept positions, 0 elsewhere; C = cumsum(w) (sequential, in
   canonical order); u = `uniform53` of Philox4x32-10 at (seed, counter, offset SAMPLE_OFFSET = 0);
   the token is at the first position i with C[i] > u * C[V - 1], clamped to the last position
   with w > 0 (a zero-probability token is never drawn).

All masses are sequential float64 sums in canonical order (zero where a position is not counted).
Nothing depends on other rows, the row position or any generator state, so a row's token is the same
alone or in any batch. The reference is pure tensor code registered for every device. Cost per
drawing row: one stable sort of V float64 values plus about twenty elementwise passes (tens of ms at
V = 128k on one CPU core).

Capture: where `selective(device)` is false (every device but the CPU) the body never reads device
data on the host (no ``.item()``, ``nonzero``, boolean indexing or data-dependent shapes) and creates
no host tensor, so it runs inside a CUDA graph and replays there: it draws for every row and selects
the drawn or greedy token with ``torch.where``. On the CPU it sorts only the rows that draw (a
data-dependent selection); both paths give the same tokens bit for bit. On CUDA the softmax and the
prefix sums are CUDA's (parallel, rounded differently in the last bits): greedy tokens and the
uniforms are identical to the CPU's, and a sampled token differs only in the case described next.

CPU greedy fast path: a call in which no row draws and none is penalised takes
`helios.abi.sampling_cpu.greedy_tokens_cpu` (the float32 argmax; the same tokens bit for bit).

Fused pass on CUDA: steps 1-5 run as `helios.abi.triton_sampling.greedy_tokens`, one pass per row
over the float32 logits that applies penalties and the grammar mask only in the rows that need them
(decided on the device) and takes the float64 argmax: the reference's values and greedy tokens bit
for bit, without its [R, V] float64 intermediates. In the greedy variant (below) that is all;
otherwise the pass also stores the float64 values and the draws (steps 6-8) run as
`helios.abi.triton_draws.draw_rows`: the same rules by selection instead of a sort of the whole
row (its tokens differ from the reference's only where summation rounding moves a boundary
comparison, the case described last).

Variants. The registered op is the full pipeline. `SampleVariant` names explicit variants of it
with the same signature, which a runtime binds into a program's graph in place of the op
(`bind_sample_variant`, at load or capture time; the op set a program declares does not change):
`SampleVariant.GREEDY` leaves the random draws out (every row gets its greedy token, which is the
full pipeline's token in every row that does not draw: a runtime captures a second CUDA graph of
each program with it and replays that graph only for steps in which no row has temperature > 0),
and the `REFERENCE` variants run the reference pipeline on CUDA instead of the fused pass
(benchmarks A/B the two). Nothing is chosen by thread or global state.

Another implementation (a Triton kernel such as `draw_rows`) reproduces the random numbers bit for
bit and greedy tokens exactly; its sampled tokens differ from this reference only where a different
softmax or summation rounding moves a boundary comparison (u * C, top-p's mass, min-p's threshold)
across (order 1e-15 per draw), so the distribution is the same.
"""

from __future__ import annotations

import enum
from typing import Callable, NamedTuple

import torch

from helios.abi.grammar import check_mask_args, disallowed
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor
from helios.abi.rng import SAMPLE_OFFSET, philox_words, uniform53
from helios.abi.sampling_cpu import greedy_tokens_cpu

NO_TOKEN = -1
NUM_PENALTIES = 3
# Packed per-row sampling parameters (one FP32 row per request, the SAMPLING_PARAMETERS source):
# temperature, top_k, top_p, min_p, repetition, presence, frequency penalty.
SAMPLING_PARAMETER_COLUMNS = ("temperature", "top_k", "top_p", "min_p", "repetition", "presence", "frequency")
NUM_SAMPLING_PARAMETERS = len(SAMPLING_PARAMETER_COLUMNS)
NEUTRAL_SAMPLING_PARAMETERS = (0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0)  # greedy, no filter, no penalty


def split_sampling_parameters(params: torch.Tensor):
    """(temperature, top_k, top_p, min_p, penalties) of packed FP32 rows [R, 7], in `sample` order."""
    return params[:, 0], params[:, 1].to(torch.int32), params[:, 2], params[:, 3], params[:, 4:7]

REPETITION, PRESENCE, FREQUENCY = range(NUM_PENALTIES)
SAMPLE_SCHEMA = (
    "(Tensor logits, Tensor seeds, Tensor counters, Tensor temperature, Tensor top_k, "
    "Tensor top_p, Tensor min_p, Tensor penalties, Tensor prompt_counts, Tensor output_counts, "
    "Tensor grammar_mask, Tensor mask_rows) -> Tensor"
)
_OP = "helios::sample"
_NEG_INF = float("-inf")
_F32_MAX = torch.finfo(torch.float32).max
_F64_MAX = torch.finfo(torch.float64).max


class DrawParams(NamedTuple):
    """Per-row inputs of the random draw, each [R]; indexing every field selects rows."""

    seeds: torch.Tensor
    counters: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor

    def rows(self, index: torch.Tensor) -> DrawParams:
        return DrawParams(*(field[index] for field in self))


def check_sample_args(logits: torch.Tensor, params: DrawParams, penalties: torch.Tensor,
                      counts: tuple[torch.Tensor, torch.Tensor], grammar_mask: torch.Tensor,
                      mask_rows: torch.Tensor) -> tuple[int, int]:
    """Validate every input of ``helios::sample`` (dtype, shape, device); return (R, V)."""
    num_rows, vocab_size = check_mask_args(_OP, logits, grammar_mask, mask_rows)
    if logits.dtype != torch.float32:
        raise AbiArgumentError(f"{_OP}: logits must be float32 [R, V], got {logits.dtype}")
    dtypes = (torch.int64, torch.int64, torch.float32, torch.int32, torch.float32, torch.float32)
    for name, tensor, dtype in zip(DrawParams._fields, params, dtypes):
        check_tensor(_OP, name, tensor, dtype, (num_rows,))
    check_tensor(_OP, "penalties", penalties, torch.float32, (num_rows, NUM_PENALTIES))
    check_tensor(_OP, "prompt_counts", counts[0], torch.int32, (num_rows, vocab_size))
    check_tensor(_OP, "output_counts", counts[1], torch.int32, (num_rows, vocab_size))
    named = dict(zip(DrawParams._fields, params))
    named.update(logits=logits, penalties=penalties, prompt_counts=counts[0],
                 output_counts=counts[1])
    check_same_device(_OP, named)
    return num_rows, vocab_size


def _finite_or_neg_inf(values: torch.Tensor, posinf: float) -> torch.Tensor:
    return torch.nan_to_num(values, nan=_NEG_INF, posinf=posinf, neginf=_NEG_INF)


def apply_penalties(logits: torch.Tensor, penalties: torch.Tensor, prompt_counts: torch.Tensor,
                    output_counts: torch.Tensor) -> torch.Tensor:
    """Repetition, then frequency and presence penalties on float64 logits [R, V] (step 2)."""
    repetition, presence, frequency = (
        penalties[:, index:index + 1].to(torch.float64) for index in range(NUM_PENALTIES))
    generated = output_counts > 0
    seen = generated | (prompt_counts > 0)
    repeated = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, repeated, logits)
    penalised = logits - frequency * output_counts.to(torch.float64) - presence
    return torch.where(generated, penalised, logits)


def keep_prefix(sorted_probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                min_p: torch.Tensor) -> torch.Tensor:
    """bool [R, V]: canonical-order positions kept by top-k, top-p and min-p (step 7)."""
    position = torch.arange(sorted_probs.shape[1], device=sorted_probs.device)
    keep_k = (top_k <= 0).unsqueeze(-1) | (position < top_k.unsqueeze(-1))
    cumulative = torch.where(keep_k, sorted_probs, 0.0).cumsum(dim=-1)
    top_p = top_p.to(torch.float64).unsqueeze(-1)
    below = cumulative < top_p * cumulative[:, -1:]  # mass up to and including each position
    keep_p = (top_p >= 1) | torch.cat([torch.ones_like(below[:, :1]), below[:, :-1]], dim=-1)
    keep_m = sorted_probs >= min_p.to(torch.float64).unsqueeze(-1) * sorted_probs[:, :1]
    return (keep_k & keep_p & keep_m) | (position == 0)


def draw_tokens(logits: torch.Tensor, params: DrawParams) -> torch.Tensor:
    """Steps 6-8 for rows with temperature > 0 and at least one finite logit: int64 [R]."""
    scaled = logits / params.temperature.to(torch.float64).unsqueeze(-1)
    probs = torch.softmax(_finite_or_neg_inf(scaled, _F64_MAX), dim=-1)
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep = keep_prefix(sorted_probs, params.top_k, params.top_p, params.min_p)
    weights = torch.where(keep, sorted_probs, 0.0)
    cumulative = weights.cumsum(dim=-1)
    uniform = uniform53(philox_words(params.seeds, params.counters, SAMPLE_OFFSET))
    target = uniform * cumulative[:, -1]
    position = (cumulative <= target.unsqueeze(-1)).sum(dim=-1)
    last_drawable = ((weights > 0).sum(dim=-1) - 1).clamp(min=0)
    position = torch.minimum(position, last_drawable)
    return sorted_ids.gather(1, position.unsqueeze(-1)).squeeze(-1)


def selective(device: torch.device) -> bool:
    """Whether op bodies on `device` may select rows on the host (a data-dependent, synchronising
    step that a CUDA graph cannot hold): the CPU only. `helios.abi.speculative` asks this too; tests
    patch it to run the device path on CPU tensors."""
    return device.type == "cpu"


def with_draws(tokens: torch.Tensor, logits: torch.Tensor, drawing: torch.Tensor,
               params: DrawParams, select_rows: bool) -> torch.Tensor:
    """Replace `tokens` by random draws on `drawing` rows; other rows keep their greedy token.

    With `select_rows` only the drawing rows are computed (a data-dependent, synchronising branch:
    host code only); without it every row is computed and the results are selected, which is what
    a device may do inside a captured graph. Both give the same tokens.
    """
    if select_rows:
        rows = drawing.nonzero().squeeze(-1)
        if rows.numel() == 0:
            return tokens
        return tokens.index_put((rows,), draw_tokens(logits[rows], params.rows(rows)))
    safe = params._replace(temperature=torch.where(drawing, params.temperature, 1.0))
    drawn = [draw_tokens(torch.where(drawing[rows].unsqueeze(-1), logits[rows], 0.0), safe.rows(rows))
             for rows in row_blocks(*logits.shape)]
    return torch.where(drawing, torch.cat(drawn), tokens) if drawn else tokens


ROW_BLOCK_ELEMENTS = 1 << 26  # float64 values per row block of the device path's draws (512 MiB)


def row_blocks(num_rows: int, vocab_size: int) -> list[slice]:
    """Row slices of at most ``ROW_BLOCK_ELEMENTS // vocab_size`` rows (at least one each).

    The device path's full-vocabulary float64 work (the draws here, `helios.abi.token_logprobs`,
    the speculative weights and draws) runs block by block, so that its temporaries (a dozen
    [rows, V] float64 tensors) stay bounded however many rows a program samples. Blocks are large:
    the row-wise scans run slower the fewer rows a launch holds (256 rows of a 128k vocabulary in
    a CUDA graph took 1.66x as long in blocks of 32 rows, 1.19x in blocks of 64 or 128, on an
    H100; bench/results/h100_session53_call4/row_blocks.md), so up to ~440 rows of a 152k
    vocabulary run as one block. Every row's values are its own: blocking changes no result."""
    step = max(1, ROW_BLOCK_ELEMENTS // max(vocab_size, 1))
    return [slice(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def sample_reference(logits: torch.Tensor, params: DrawParams, penalties: torch.Tensor,
                     counts: tuple[torch.Tensor, torch.Tensor], grammar_mask: torch.Tensor,
                     mask_rows: torch.Tensor, draws: bool = True) -> torch.Tensor:
    """The whole pipeline of the module docstring on validated inputs: int64 [R]. Without
    `draws` steps 6-8 are left out: every row gets its greedy token."""
    values = _finite_or_neg_inf(logits.to(torch.float64), _F32_MAX)
    values = apply_penalties(values, penalties, counts[0], counts[1])
    values = values.masked_fill(disallowed(grammar_mask, mask_rows, logits.shape[1]), _NEG_INF)
    values = _finite_or_neg_inf(values, _F64_MAX)
    has_candidate = values.amax(dim=-1) > _NEG_INF
    tokens = values.argmax(dim=-1)
    if draws:
        drawing = (params.temperature > 0) & has_candidate
        tokens = with_draws(tokens, values, drawing, params, select_rows=selective(logits.device))
    return torch.where(has_candidate, tokens, NO_TOKEN)


@abi_op(_OP, mutates_args=(), schema=SAMPLE_SCHEMA)
def sample(logits: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor,
           temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           min_p: torch.Tensor, penalties: torch.Tensor, prompt_counts: torch.Tensor,
           output_counts: torch.Tensor, grammar_mask: torch.Tensor,
           mask_rows: torch.Tensor) -> torch.Tensor:
    """Sampled token id per row (int64 [R]); see the module docstring for the exact semantics."""
    return _host_sample(logits, DrawParams(seeds, counters, temperature, top_k, top_p, min_p), penalties,
                        (prompt_counts, output_counts), grammar_mask, mask_rows, True)


def _host_sample(logits, params: DrawParams, penalties, counts, grammar_mask, mask_rows, draws: bool):
    check_sample_args(logits, params, penalties, counts, grammar_mask, mask_rows)
    return host_sample(logits, params, penalties, counts, grammar_mask, mask_rows, draws)


def host_sample(logits: torch.Tensor, params: DrawParams, penalties: torch.Tensor,
                counts: tuple[torch.Tensor, torch.Tensor], grammar_mask: torch.Tensor, mask_rows: torch.Tensor,
                draws: bool = True) -> torch.Tensor:
    """The op's tokens on checked host (CPU) arguments: the greedy fast path when it applies,
    else the reference pipeline (`draws` False: every row greedy)."""
    # CPU only: a call with no drawing or penalised row takes the float32 argmax (the same tokens).
    temperature = params.temperature if draws else torch.zeros_like(params.temperature)
    greedy = greedy_tokens_cpu(logits, temperature, penalties, grammar_mask, mask_rows)
    if greedy is not None:
        return greedy
    return sample_reference(logits, params, penalties, counts, grammar_mask, mask_rows, draws)


@sample.register_kernel("cuda")
def _sample_cuda(logits: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor,
                 temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor, penalties: torch.Tensor, prompt_counts: torch.Tensor,
                 output_counts: torch.Tensor, grammar_mask: torch.Tensor,
                 mask_rows: torch.Tensor) -> torch.Tensor:
    """`sample_with_kernel` (the reference's tokens; its uniforms and draw arithmetic)."""
    params = DrawParams(seeds, counters, temperature, top_k, top_p, min_p)
    counts = (prompt_counts, output_counts)
    check_sample_args(logits, params, penalties, counts, grammar_mask, mask_rows)
    return sample_with_kernel(logits, params, penalties, counts, grammar_mask, mask_rows)


def sample_with_kernel(logits: torch.Tensor, params: DrawParams, penalties: torch.Tensor,
                       counts: tuple[torch.Tensor, torch.Tensor], grammar_mask: torch.Tensor,
                       mask_rows: torch.Tensor, draws: bool = True) -> torch.Tensor:
    """`sample_reference` with steps 1-5 in the fused Triton pass (the same values and greedy
    tokens bit for bit); without `draws` nothing else runs, otherwise steps 6-8 run as
    `helios.abi.triton_draws.draw_rows` (selection instead of the reference's sort) on the values
    the pass stored."""
    from helios.abi.triton_sampling import greedy_tokens

    from helios.abi.triton_draws import draw_rows

    arguments = (logits, penalties, counts[0], counts[1], grammar_mask, mask_rows)
    if not draws:
        return greedy_tokens(*arguments)
    values = torch.empty(logits.shape, dtype=torch.float64, device=logits.device)
    tokens = greedy_tokens(*arguments, values_out=values)
    has_candidate = tokens >= 0
    drawing = (params.temperature > 0) & has_candidate
    uniforms = uniform53(philox_words(params.seeds, params.counters, SAMPLE_OFFSET))
    controls = (params.temperature, params.top_k, params.top_p, params.min_p, uniforms)
    blocks = [draw_rows(values[rows], tokens[rows], drawing[rows], *(control[rows] for control in controls))
              for rows in row_blocks(*logits.shape)]  # the kernels' candidate lists: 12 bytes per value
    tokens = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    return torch.where(has_candidate, tokens, NO_TOKEN)


@sample.register_fake
def _sample_fake(logits: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor,
                 temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor, penalties: torch.Tensor, prompt_counts: torch.Tensor,
                 output_counts: torch.Tensor, grammar_mask: torch.Tensor,
                 mask_rows: torch.Tensor) -> torch.Tensor:
    params = DrawParams(seeds, counters, temperature, top_k, top_p, min_p)
    num_rows, _ = check_sample_args(logits, params, penalties, (prompt_counts, output_counts),
                                    grammar_mask, mask_rows)
    return logits.new_empty((num_rows,), dtype=torch.int64)


class SampleVariant(enum.Enum):
    """Explicit variants of ``helios::sample`` (see the module docstring): (draws, fused pass on CUDA)."""

    FULL = (True, True)  # what the registered op computes
    GREEDY = (False, True)
    REFERENCE = (True, False)
    REFERENCE_GREEDY = (False, False)

    @property
    def draws(self) -> bool:
        return self.value[0]

    @property
    def fused(self) -> bool:
        return self.value[1]

    def __call__(self, logits: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor,
                 temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                 penalties: torch.Tensor, prompt_counts: torch.Tensor, output_counts: torch.Tensor,
                 grammar_mask: torch.Tensor, mask_rows: torch.Tensor) -> torch.Tensor:
        """The variant's tokens: the op's signature and checks, on any device."""
        return _VARIANTS[self](logits, seeds, counters, temperature, top_k, top_p, min_p, penalties, prompt_counts,
                               output_counts, grammar_mask, mask_rows)


def _variant(variant: SampleVariant) -> Callable[..., torch.Tensor]:
    def call(logits, seeds, counters, temperature, top_k, top_p, min_p, penalties, prompt_counts, output_counts,
             grammar_mask, mask_rows):
        params = DrawParams(seeds, counters, temperature, top_k, top_p, min_p)
        counts = (prompt_counts, output_counts)
        if logits.device.type != "cuda":
            return _host_sample(logits, params, penalties, counts, grammar_mask, mask_rows, variant.draws)
        check_sample_args(logits, params, penalties, counts, grammar_mask, mask_rows)
        if variant.fused:
            return sample_with_kernel(logits, params, penalties, counts, grammar_mask, mask_rows, variant.draws)
        return sample_reference(logits, params, penalties, counts, grammar_mask, mask_rows, variant.draws)

    call.__name__ = call.__qualname__ = f"sample_{variant.name.lower()}"
    return call


_VARIANTS = {variant: _variant(variant) for variant in SampleVariant}


def sampling_call_targets(variant: SampleVariant) -> frozenset:
    """The call targets `bind_sample_variant` gives ``helios::sample`` calls bound to `variant`."""
    return frozenset({_VARIANTS[variant]})


def bind_sample_variant(graph: torch.fx.Graph, variant: SampleVariant) -> int:
    """Points every ``helios::sample`` call in `graph` (the registered op, or its Python body where
    a CPU program calls bodies directly) at `variant`, and rebinds every group-bound sampler
    (``helios::sample_vocab_shard`` after `helios.abi.collectives.bind_collectives`) to `variant`;
    returns how many calls were bound. The caller recompiles the graph's module."""
    targets = {torch.ops.helios.sample.default, sample.body, *_VARIANTS.values()}
    count = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in targets:
            node.target = _VARIANTS[variant]
            count += 1
        elif _binds_variants(node.target):  # a group-bound sampler (`helios.abi.vocab_shards`)
            node.target = getattr(node.target.__self__.with_sample_variant(variant), node.target.__name__)
            count += 1
    return count


def _binds_variants(target) -> bool:
    """Whether `target` is a sampling method of an object that rebinds itself to a `SampleVariant`
    (``with_sample_variant``), such as a vocabulary-sharded sampler bound to a rank group."""
    return getattr(target, "__name__", None) == "sample" and hasattr(getattr(target, "__self__", None),
                                                                     "with_sample_variant")
