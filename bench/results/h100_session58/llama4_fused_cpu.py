"""Session 58: Llama 4's fused rotary attention on recorded program inputs, on the CPU: the unfused graph, the fused
graph with the CPU reference body, and the fused graph with the Triton kernel interpreted (all equal).
Run from tests/: PYTHONPATH=. python ../bench/results/h100_session58/llama4_fused_cpu.py"""
from helios.abi.triton_interpret import enable_interpreter
enable_interpreter()
import copy, tempfile
from pathlib import Path
import torch
from gpu import test_runtime_cuda as base
from ignition.hf_checkpoints import LLAMA4
from support.runtime_runs import greedy_run
from helios.runtime.loading import cpu_programs, rotary_calls
from helios.abi.rotary_attention import triton_rotary_paged_attention
import helios.abi.rotary_attention as ra

FAMILY = LLAMA4
cores = base.Cores(Path(tempfile.mkdtemp()))
core = cores.open(FAMILY)
recorded = {}
orig = cpu_programs.CpuProgram.__call__
def rec(self, weights, *inputs):
    key = id(self)
    if key not in recorded or len(recorded[key][2]) < 3:
        snap = ([w for w in weights], [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
        calls = recorded.get(key, (self, None, []))[2]
        calls.append(snap)
        recorded[key] = (self, None, calls)
    return orig(self, weights, *inputs)
cpu_programs.CpuProgram.__call__ = rec
greedy_run(core, base.PROMPTS[:3], 6)
cpu_programs.CpuProgram.__call__ = orig
print('programs recorded', len(recorded))

lib = torch.library.Library("helios", "IMPL")
state = {"triton": False}
def dispatch(*args):
    if state["triton"]:
        return triton_rotary_paged_attention(*args[:15], prefetch=None)
    return ra.rotary_paged_attention.body(*args)
lib.impl("rotary_paged_attention", dispatch, "CPU")

def restored(gm):
    g = copy.deepcopy(gm.graph)
    for n in g.nodes:
        if n.op == 'call_function' and callable(n.target) and not isinstance(n.target, torch._ops.OpOverload):
            name = getattr(n.target, '__name__', '')
            if hasattr(torch.ops.helios, name):
                n.target = getattr(torch.ops.helios, name).default
    return g

for key, (prog, _, calls) in recorded.items():
    gm = prog.module
    plain = torch.fx.GraphModule(gm, restored(gm))
    g = restored(gm)
    fused_count = rotary_calls.fuse_rotary_attention(g)
    if not fused_count:
        continue
    fused = torch.fx.GraphModule(gm, g)
    for weights, inputs in calls:
        outs = {}
        for label, module, tri in (("plain", plain, False), ("fused-ref", fused, False), ("fused-triton", fused, True)):
            state["triton"] = tri
            ins = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
            out = module(*weights, *ins)
            outs[label] = out
        a = outs["plain"]; 
        def diff(x, y):
            return max(((u.float() - v.float()).abs().max().item() if isinstance(u, torch.Tensor) and u.is_floating_point() and u.numel() else 0.0) for u, v in zip(x, y))
        print(fused_count, [tuple(t.shape) for t in inputs[5:8]], 'fused-ref', diff(a, outs["fused-ref"]), 'fused-triton', diff(a, outs["fused-triton"]), flush=True)
