"""The draw kernels on the per-row arguments a runtime's program passes: strided views.

A program splits the packed [R, 7] sampling parameters into columns
(`helios.abi.sampling.split_sampling_parameters`), so ``helios::sample`` receives temperature,
top_p and min_p with stride 7. The Triton kernels index per-row vectors as ``pointer + row``; read so,
row r took the entries r places past row 0's column (row 1's temperature was row 0's top_k, 0, and
on CUDA a seeded choice drew 1, 0, 1, 0, ...). Without CUDA the kernels run under Triton's
interpreter on CPU tensors, which reads raw pointers as the compiled kernels do.
"""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi.sampling import DrawParams, host_sample, sample_with_kernel, split_sampling_parameters  # noqa: E402
from helios.abi.triton_draws import draw_rows, kept_weights  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
ROWS, VOCAB = 5, 320


def packed_rows():
    """Logits and packed parameters whose rows differ, so that reading a neighbour's entry shows."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(ROWS, VOCAB, generator=generator) * 2
    packed = torch.tensor([[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0],  # temperature 1, no filter, no penalty
                           [0.7, 0.0, 0.9, 0.0, 1.0, 0.0, 0.0],
                           [1.3, 40.0, 1.0, 0.02, 1.0, 0.0, 0.0],
                           [0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0],  # greedy
                           [2.0, 0.0, 0.8, 0.05, 1.0, 0.0, 0.0]])
    return logits, packed


def op_arguments(logits, packed, device):
    temperature, top_k, top_p, min_p, penalties = split_sampling_parameters(packed.to(device))
    params = DrawParams(torch.arange(ROWS, device=device) + 1000, torch.arange(ROWS, device=device) * 3,
                        temperature, top_k, top_p, min_p)
    rest = (penalties, (torch.zeros(ROWS, VOCAB, dtype=torch.int32, device=device),) * 2,
            torch.zeros(ROWS, (VOCAB + 31) // 32, dtype=torch.int32, device=device),
            torch.zeros(ROWS, dtype=torch.bool, device=device))
    return logits.to(device), params, rest


def test_sampling_with_the_kernel_reads_strided_parameter_columns():
    logits, packed = packed_rows()
    cpu_logits, cpu_params, cpu_rest = op_arguments(logits, packed, "cpu")
    assert cpu_params.temperature.stride() == (7,)  # what a program passes the op
    expected = host_sample(cpu_logits, cpu_params, *cpu_rest)
    assert expected.tolist() != cpu_logits.argmax(-1).tolist()  # the rows really draw
    device_logits, device_params, device_rest = op_arguments(logits, packed, DEVICE)
    assert sample_with_kernel(device_logits, device_params, *device_rest).cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("keep", [False, True], ids=["draw_rows", "kept_weights"])
def test_strided_controls_give_the_contiguous_result(keep):
    logits, packed = packed_rows()
    values = logits.to(torch.float64).to(DEVICE)
    greedy = values.argmax(-1)
    temperature, top_k, top_p, min_p, _ = split_sampling_parameters(packed.to(DEVICE))
    drawing = temperature > 0
    uniforms = torch.linspace(0.1, 0.9, ROWS, dtype=torch.float64, device=DEVICE)
    strided = (greedy, drawing, temperature, top_k, top_p, min_p, torch.stack([uniforms, uniforms], 1)[:, 0])
    assert all(t.stride() == (7,) for t in strided[2:6:2]) and strided[-1].stride() == (2,)
    contiguous = tuple(t.contiguous() for t in strided)
    run = (lambda *a: kept_weights(values.clone(), *a[:-1])) if keep else (lambda *a: draw_rows(values.clone(), *a))
    expected = run(*contiguous).cpu()
    if not keep:
        assert expected.tolist() != greedy.tolist()  # the rows really draw
    assert torch.equal(run(*strided).cpu(), expected)


def test_values_with_strided_ids_are_refused():
    values = torch.zeros(VOCAB, 2, dtype=torch.float64, device=DEVICE).t()
    vector = torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match="contiguous rows"):
        draw_rows(values, torch.zeros(2, dtype=torch.int64, device=DEVICE), vector > 0, vector,
                  vector.to(torch.int32), vector, vector * 0, vector.to(torch.float64))


def test_seeded_choices_with_the_kernel_draw_the_reference_tokens(monkeypatch):
    """The runtime's seeded choices (`runtime.test_prompt_sharing_runtime`, a batch of four rows) with
    one): the CPU's tokens. The program's parameter columns reach the kernels as strided views. Three
    tokens a choice (the prompt's step and two decode steps; the runtime test generates ten): each step
    samples the four rows through the same kernels, and the interpreter takes about a second a step."""
    import helios.abi.cpu_bodies as cpu_bodies
    import helios.abi.sampling as sampling
    import runtime.test_prompt_sharing_runtime as sharing
    from runtime.test_prompt_sharing_runtime import SAMPLED, run_choices

    monkeypatch.setattr(sharing, "MAX_TOKENS", 3)

    expected = run_choices(4, SAMPLED)[0]
    assert [len(tokens) for tokens in expected] == [3] * 4 and len(set(map(tuple, expected))) > 1  # rows draw

    def kernel_sample(logits, params, penalties, counts, grammar_mask, mask_rows, draws=True):
        on_device = [t.to(DEVICE) for t in (logits, *params, penalties, *counts, grammar_mask, mask_rows)]
        tokens = sample_with_kernel(on_device[0], DrawParams(*on_device[1:7]), on_device[7], tuple(on_device[8:10]),
                                    on_device[10], on_device[11], draws)
        return tokens.cpu()

    monkeypatch.setattr(cpu_bodies, "host_sample", kernel_sample)
    monkeypatch.setattr(sampling, "host_sample", kernel_sample)
    assert run_choices(4, SAMPLED)[0] == expected
