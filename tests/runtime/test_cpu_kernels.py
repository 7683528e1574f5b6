"""C++ kernels bound into CPU programs at load (`helios.runtime.loading.cpu_kernels`): a program with
them gives the Python bodies' tokens, counts and cache rows, its logits within float rounding; every
layer's calls take the kernels; the binding survives a recompile; the load binds them by default
where a compiler builds them, never with `compile_programs` or `cpu_kernels=False`, and a required
build that cannot happen is a typed `LoadError`."""

from __future__ import annotations

import argparse
import logging

import pytest
import torch

from helios.cli.runtime_flags import add_runtime_flags, runtime_flags
from helios.contract import StartupOptions
from helios.errors import LoadError
from helios.runtime.loading import cpu_kernels, decode_attention_kernel
from helios.runtime.loading.cpu_kernels import CpuKernelError, build_cpu_kernels, check_ahead, use_cpu_kernels
from helios.runtime.loading.cpu_programs import cpu_program
from runtime.test_cpu_fast import _inputs, _program, _steps, _weights

STEPS = [_inputs(step) for step in range(4)]


class _Loaded:
    """What `use_cpu_kernels` and `check_ahead` read of a `LoadedProgram`."""

    def __init__(self, module, graph: str = "decode", rows: int = 3, tokens: int = 3):
        self.module, self.graph, self.batch_capacity, self.packed_token_capacity = module, graph, rows, tokens


def _names(program) -> list[str]:
    return [getattr(n.target, "__name__", "") for n in program.fast.graph.nodes if n.op == "call_function"]


def test_a_program_with_the_kernels_gives_the_bodies_tokens_and_its_logits_within_rounding(monkeypatch):
    expected = _steps(cpu_program(_program()), _weights(), _inputs(0), STEPS)
    program = cpu_program(_program())
    assert use_cpu_kernels([_Loaded(program)], True) == 2 + 2 + 1 + 1 + 2 * 2 + 2  # attn, rotary, sample, norms, mlp
    names = _names(program)
    assert names.count("decode_attention_kernel") == 2 and names.count("rotary_cache_write_kernel") == 2
    assert names.count("add_rms_norm_kernel") == 4 and names.count("silu_mul_kernel") == 2
    assert names.count("rms_norm_kernel") == 1 and names.count("greedy_sample_kernel") == 1

    def reference(*args, **kwargs):
        raise AssertionError("a full decode step's attention left the kernel")

    weights, inputs = _weights(), _inputs(0)
    got = _steps(program, weights, inputs, STEPS[:1])  # the first call runs the checked bodies
    monkeypatch.setattr(decode_attention_kernel, "attend", reference)
    got += _steps(program, weights, inputs, STEPS[1:])
    for got_step, expected_step in zip(got, expected):
        record, logits, k_cache, v_cache, counts = got_step
        assert torch.equal(record, expected_step[0]) and torch.equal(counts, expected_step[4])
        torch.testing.assert_close(logits, expected_step[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k_cache, expected_step[2], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v_cache, expected_step[3], rtol=1e-5, atol=1e-6)


def test_the_binding_survives_a_recompile():
    program = cpu_program(_program())
    use_cpu_kernels([_Loaded(program)], True)
    program.recompile()  # as a load-time binding of collectives does
    assert _names(program).count("decode_attention_kernel") == 2 and "add_rms_norm" not in _names(program)


def test_without_a_compiler_the_default_serves_the_bodies_and_required_fails(monkeypatch, caplog):
    monkeypatch.setattr(cpu_kernels, "compiler_available", lambda: None)
    program = cpu_program(_program())
    with caplog.at_level(logging.INFO, logger=cpu_kernels.__name__):
        assert use_cpu_kernels([_Loaded(program)], None) == 0
    assert "no C++ compiler" in caplog.text and "attention_planned" in _names(program)
    with pytest.raises(CpuKernelError, match="need a C\\+\\+ compiler") as error:
        use_cpu_kernels([_Loaded(program)], True)
    assert isinstance(error.value, LoadError)
    assert use_cpu_kernels([_Loaded(program)], False) == 0


def test_a_failing_build_is_logged_by_default_and_a_typed_error_when_required(monkeypatch, caplog):
    def fails():
        raise RuntimeError("the toolchain broke")

    monkeypatch.setattr(cpu_kernels, "build_cpu_kernels", fails)
    program = cpu_program(_program())
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        assert use_cpu_kernels([_Loaded(program)], None) == 0
    assert "the toolchain broke" in caplog.text and "attention_planned" in _names(program)
    with pytest.raises(CpuKernelError, match="RuntimeError: the toolchain broke"):
        use_cpu_kernels([_Loaded(program)], True)


def test_off_builds_nothing(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "build_cpu_kernels", lambda: pytest.fail("built"))
    assert use_cpu_kernels([_Loaded(cpu_program(_program()))], False) == 0
    assert use_cpu_kernels([], True) == 0  # nothing to bind: nothing built


def test_a_program_checked_every_call_keeps_every_program_on_the_bodies(monkeypatch, caplog):
    monkeypatch.setattr(cpu_kernels, "build_cpu_kernels", lambda: pytest.fail("built"))
    program = cpu_program(_program())
    others = [_Loaded(program), _Loaded(torch.nn.Identity())]  # a module without a fast graph
    with caplog.at_level(logging.INFO, logger=cpu_kernels.__name__):
        assert use_cpu_kernels(others, None) == 0
    assert "no fast graph" in caplog.text and "attention_planned" in _names(program)
    with pytest.raises(CpuKernelError, match="checked every call"):
        use_cpu_kernels(others, True)


def test_checking_ahead_runs_each_first_call_at_load_and_zeroes_the_buffers_but_the_kept():
    program = cpu_program(_program())
    use_cpu_kernels([_Loaded(program)], True)
    weights, inputs = _weights(), _inputs(0)
    buffers = {"k_cache": inputs[0], "v_cache": inputs[1], "positions": inputs[3], "kept": torch.ones(3)}
    calls = []
    checked = program._forward
    program._forward = lambda *args: calls.append(1) or checked(*args)
    check_ahead([_Loaded(program)], lambda p: [weights, *inputs], buffers, keep=["kept"])
    assert calls == [1] and not inputs[0].any() and not inputs[3].any() and torch.equal(buffers["kept"], torch.ones(3))
    views = [weights] + [tensor.view(tensor.shape) for tensor in inputs]  # other objects, the same memory
    for tensor, value in zip(views[3:], _inputs(1)[2:]):
        tensor.copy_(value)
    program(list(weights), *views[1:])
    assert calls == [1]  # the serving calls run the fast graph (the kernels), never the checked bodies

def test_slow_first_checked_calls_are_shown_one_line_a_program(monkeypatch):
    program = cpu_program(_program())
    use_cpu_kernels([_Loaded(program)], True)
    weights, inputs = _weights(), _inputs(0)
    buffers = {"k_cache": inputs[0], "v_cache": inputs[1]}
    loaded = [_Loaded(program, "prefill", 1, 8), _Loaded(program, "decode", 3, 3)]
    lines = []
    check_ahead(loaded, lambda p: [weights, *inputs], buffers, progress=lines.append)
    assert lines == []  # fast: nothing shown
    monkeypatch.setattr(cpu_kernels, "SLOW_CHECK_SECONDS", 0.0)
    program._checked = None  # checked again
    check_ahead(loaded, lambda p: [weights, *inputs], buffers, progress=lines.append)
    assert [line.split(" in ")[0] for line in lines] == ["ran the first (checked) call of prefill R=1 T=8",
                                                        "ran the first (checked) call of decode R=3 T=3"]
    assert lines[0].endswith(" s [1/2]") and lines[1].endswith(" s [2/2]")


def test_a_cold_build_is_shown_as_progress(monkeypatch):
    lines = []
    use_cpu_kernels([_Loaded(cpu_program(_program()))], True, lines.append)
    assert lines == []  # loaded from the process's builds: no line
    monkeypatch.setattr(cpu_kernels, "COLD_BUILD_SECONDS", 0.0)
    use_cpu_kernels([_Loaded(cpu_program(_program()))], True, lines.append)
    assert len(lines) == 1 and lines[0].startswith("CPU kernels ready in ")


def test_the_load_binds_them_by_default_and_never_with_compiled_programs_or_off(monkeypatch):
    from helios.runtime.loading import model as model_module, program_compile
    from helios.runtime.loading.model import LoadOptions, load_model
    from runtime.test_model_fixture import open_fixture

    model = load_model(open_fixture(), LoadOptions())
    decode = [p for p in model.programs if p.graph.startswith("decode")]
    assert decode and all("decode_attention_kernel" in _names(p.module) for p in decode)
    off = load_model(open_fixture(), LoadOptions(cpu_kernels=False))
    assert not [p for p in off.programs if "decode_attention_kernel" in _names(p.module)]
    seen = []
    monkeypatch.setattr(program_compile, "compile_programs", lambda programs, arguments, progress: seen.append(1))
    monkeypatch.setattr(model_module, "use_cpu_kernels", lambda *args: pytest.fail("bound beside compiling"))
    load_model(open_fixture(), LoadOptions(compile_programs=True))
    assert seen == [1]


@pytest.mark.parametrize("flags, expected", [([], None), (["--cpu-kernels", "on"], True),
                                             (["--cpu-kernels", "off"], False), (["--cpu-kernels", "auto"], None)])
def test_the_cpu_kernels_flag_reaches_the_load_options(flags, expected):
    parser = argparse.ArgumentParser()
    add_runtime_flags(parser)
    load, _, _ = runtime_flags(parser.parse_args(flags), StartupOptions(), "cpu")
    assert load.cpu_kernels is expected and (load.progress is not None) is (expected is not False)


def test_the_cpu_kernels_flag_refuses_other_values(capsys):
    parser = argparse.ArgumentParser()
    add_runtime_flags(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cpu-kernels", "sometimes"])
    assert "invalid choice" in capsys.readouterr().err


def test_the_kernels_are_built_once_per_process():
    assert build_cpu_kernels() == build_cpu_kernels()
