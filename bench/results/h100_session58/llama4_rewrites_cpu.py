"""Session 58: Llama 4's programs through the CUDA capture's rewrites (rotary fusion, step bookkeeping) on the CPU,
against the programs as prepared, on recorded inputs (all equal). Run from tests/:
PYTHONPATH=. python ../bench/results/h100_session58/llama4_rewrites_cpu.py [llama4|smollm3]"""
from helios.abi.triton_interpret import enable_interpreter
enable_interpreter()
import copy, tempfile, sys
from pathlib import Path
import torch
from gpu import test_runtime_cuda as base
from ignition.hf_checkpoints import LLAMA4, SMOLLM3
from support.runtime_runs import greedy_run
from helios.runtime.loading import cpu_programs, rotary_calls
from helios.runtime.loading.step_calls import step_module
from helios.runtime.loading.program_build import deferred_recompile, finish_recompile

FAMILY = {"llama4": LLAMA4, "smollm3": SMOLLM3}[sys.argv[1] if len(sys.argv) > 1 else "llama4"]
cores = base.Cores(Path(tempfile.mkdtemp()))
core = cores.open(FAMILY)
recorded = {}
orig = cpu_programs.CpuProgram.__call__
def rec(self, weights, *inputs):
    calls = recorded.setdefault(id(self), (self, []))[1]
    if len(calls) < 2:
        calls.append(([w for w in weights], [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]))
    return orig(self, weights, *inputs)
cpu_programs.CpuProgram.__call__ = rec
greedy_run(core, base.PROMPTS[:3], 6)
cpu_programs.CpuProgram.__call__ = orig

def restored(gm):
    g = copy.deepcopy(gm.graph)
    for n in g.nodes:
        if n.op == 'call_function' and callable(n.target) and not isinstance(n.target, torch._ops.OpOverload):
            name = getattr(n.target, '__name__', '')
            if hasattr(torch.ops.helios, name):
                n.target = getattr(torch.ops.helios, name).default
    return torch.fx.GraphModule(gm, g)

def pipeline(module, fuse):
    with deferred_recompile():
        fused = rotary_calls.rotary_module(module, enabled=fuse)
        owned = fused is not module
        stepped = step_module(fused, torch.device("cpu"), in_place=owned)
    finish_recompile(stepped)
    return stepped

def diff(x, y):
    return max(((u.float() - v.float()).abs().max().item() if isinstance(u, torch.Tensor) and u.is_floating_point() and u.numel() else 0.0) for u, v in zip(x, y))

for key, (prog, calls) in recorded.items():
    plain = restored(prog.module)
    if not any(rotary_calls.fusable_attention(n) for n in plain.graph.nodes):
        continue
    variants = {"unfused": pipeline(plain, False), "fused": pipeline(plain, True)}
    for weights, inputs in calls:
        ins = lambda: [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
        ref = plain(*weights, *ins())
        print([tuple(t.shape) for t in inputs[5:7]], {k: diff(ref, m(*weights, *ins())) for k, m in variants.items()}, flush=True)
