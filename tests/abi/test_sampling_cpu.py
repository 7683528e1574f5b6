"""The CPU greedy fast path of ``helios::sample`` (`helios.abi.sampling_cpu`): the reference
pipeline's tokens bit for bit, taken only where it applies."""

from __future__ import annotations

import pytest
import torch

from helios.abi import sampling
from helios.abi.grammar import mask_words
from helios.abi.sampling_cpu import greedy_tokens_cpu, row_argmax

NEG_INF, POS_INF, NAN = float("-inf"), float("inf"), float("nan")


def _inputs(logits: torch.Tensor, seed: int = 0):
    rows, vocab = logits.shape
    generator = torch.Generator().manual_seed(seed)
    return dict(
        logits=logits, seeds=torch.arange(rows, dtype=torch.int64), counters=torch.zeros(rows, dtype=torch.int64),
        temperature=torch.zeros(rows), top_k=torch.zeros(rows, dtype=torch.int32), top_p=torch.ones(rows),
        min_p=torch.zeros(rows), penalties=torch.tensor([[1.0, 0.0, 0.0]]).repeat(rows, 1),
        prompt_counts=torch.randint(0, 3, (rows, vocab), dtype=torch.int32, generator=generator),
        output_counts=torch.randint(0, 3, (rows, vocab), dtype=torch.int32, generator=generator),
        grammar_mask=torch.full((rows, mask_words(vocab)), -1, dtype=torch.int32),
        mask_rows=torch.ones(rows, dtype=torch.bool))


def _reference(args) -> torch.Tensor:
    params = sampling.DrawParams(*(args[name] for name in sampling.DrawParams._fields))
    return sampling.sample_reference(args["logits"], params, args["penalties"],
                                     (args["prompt_counts"], args["output_counts"]), args["grammar_mask"],
                                     args["mask_rows"])


def _fast(args):
    return greedy_tokens_cpu(args["logits"], args["temperature"], args["penalties"], args["grammar_mask"],
                             args["mask_rows"])


def _awkward_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Random logits with ties at the maximum, NaN, +inf, -inf and a row entirely -inf or NaN."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (rows, vocab), generator=generator).float()  # many ties
    logits[1, 5] = NAN
    logits[2, 7] = POS_INF
    logits[2, 9] = torch.finfo(torch.float32).max  # ties with +inf once clamped: the lower id wins
    logits[3] = NEG_INF
    logits[4] = NAN
    logits[5, :] = -1.0
    return logits


@pytest.mark.parametrize("vocab", [64, 70, 1000])
def test_greedy_tokens_are_the_reference_tokens_with_awkward_logits(vocab):
    args = _inputs(_awkward_logits(8, vocab, seed=vocab), seed=1)
    fast = _fast(args)
    assert fast is not None and fast.dtype == torch.int64
    assert torch.equal(fast, _reference(args))
    assert fast[3] == sampling.NO_TOKEN and fast[4] == sampling.NO_TOKEN and fast[5] == 0 and fast[2] == 7
    assert torch.equal(torch.ops.helios.sample(**args), fast)


@pytest.mark.parametrize("vocab", [64, 70])
def test_restricting_masks_are_applied_and_bits_past_the_vocabulary_ignored(vocab):
    args = _inputs(_awkward_logits(8, vocab, seed=3))
    mask = args["grammar_mask"]
    mask[0, :] = 0
    mask[0, 0] = 0b1000  # row 0: only token 3
    mask[1, :] = 0  # row 1 allows nothing
    mask[6, :] = 0  # allows nothing, but row 6 is not masked
    args["mask_rows"][6] = False
    mask[7, -1] = (1 << (vocab % 32)) - 1 if vocab % 32 else -1  # bits past V cleared: still all allowed
    fast = _fast(args)
    assert torch.equal(fast, _reference(args))
    assert fast[0] == 3
    assert fast[1] == sampling.NO_TOKEN


def test_rows_that_draw_or_are_penalised_take_the_reference_pipeline():
    logits = torch.randn(3, 40)
    for name, column, value in (("temperature", None, 0.7), ("penalties", 0, 1.2), ("penalties", 1, 0.5),
                                ("penalties", 2, -0.5)):
        args = _inputs(logits)
        if column is None:
            args[name][1] = value
        else:
            args[name][1, column] = value
        assert _fast(args) is None
        assert torch.ops.helios.sample(**args).tolist() == _reference(args).tolist()


def test_greedy_rows_with_nan_or_negative_temperature_take_the_fast_path():
    args = _inputs(torch.randn(3, 40))
    args["temperature"] = torch.tensor([0.0, -1.0, NAN])
    assert torch.equal(_fast(args), _reference(args))


def test_only_the_chosen_rows_decide_and_strided_arguments_are_read_as_they_are():
    """With `rows`, an unchosen row that draws, is penalised (a NaN penalty is not neutral) or has
    a restricting mask does not send the call down the reference; a chosen one does. Penalties
    come as the program passes them: a strided column slice of the sampling parameters."""
    logits = _awkward_logits(6, 70, seed=7)
    params = torch.zeros(6, 7)
    params[:, 4] = 1.0
    args = _inputs(logits)
    args["penalties"] = params[:, 4:7]
    args["temperature"][0] = 0.8
    params[1, 5] = NAN
    args["grammar_mask"][2, :] = 0
    rows = torch.tensor([False, False, False, True, True, True])
    fast = greedy_tokens_cpu(logits, args["temperature"], args["penalties"], args["grammar_mask"],
                             args["mask_rows"], rows)
    assert fast is not None
    assert torch.equal(fast[3:], _reference(args)[3:])
    for chosen in range(3):  # each of the special rows, once chosen, decides for the reference
        picked = rows.clone()
        picked[chosen] = True
        decided = greedy_tokens_cpu(logits, args["temperature"], args["penalties"], args["grammar_mask"],
                                    args["mask_rows"], picked)
        if chosen == 2:  # a restricting mask keeps the fast path, with the mask applied
            assert decided is not None and decided[2] == sampling.NO_TOKEN
        else:
            assert decided is None


def test_finite_maxima_keep_the_raw_argmax_and_nan_or_inf_take_the_replacement(monkeypatch):
    """Rows whose maxima are all finite hold no NaN or inf: their argmax is taken over the logits
    as they are (no [R, V] replacement pass); a NaN or +inf anywhere sends the call through the
    replacement, with the reference's tokens either way (ties at the maximum: the lowest id)."""
    replaced = []
    original = torch.nan_to_num
    monkeypatch.setattr(torch, "nan_to_num", lambda *a, **k: replaced.append(1) or original(*a, **k))
    logits = torch.randint(-3, 4, (6, 70), generator=torch.Generator().manual_seed(5)).float()
    logits[2, 10] = NEG_INF
    args = _inputs(logits)
    fast = _fast(args)
    assert not replaced and torch.equal(fast, _reference(args))
    for row, value in ((1, NAN), (4, POS_INF), (5, NEG_INF)):
        bad = logits.clone()
        bad[row] = value if value == NEG_INF else bad[row]
        bad[row, 3] = value
        args = _inputs(bad)
        replaced.clear()
        fast = _fast(args)
        assert replaced and torch.equal(fast, _reference(args))


@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
def test_row_argmax_is_torch_max_on_any_layout(layout):
    """`row_argmax` (numpy's argmax) gives torch's ``max(dim=-1)``: the first maximal index on ties,
    the first NaN in a row that holds one (its maximum NaN), on contiguous and strided logits."""
    generator = torch.Generator().manual_seed(7)
    base = torch.randint(-2, 3, (6, 40), generator=generator).float()
    base[1, 5], base[1, 30] = NAN, NAN
    base[2, 7] = POS_INF
    base[3] = NEG_INF
    logits = {"contiguous": base, "strided": base[:, ::2], "transposed": base.t().contiguous().t()}[layout]
    best, tokens = row_argmax(logits)
    expected_best, expected = logits.max(dim=-1)
    assert tokens.dtype == torch.int64 and torch.equal(tokens, expected)
    torch.testing.assert_close(torch.from_numpy(best), expected_best, equal_nan=True)
