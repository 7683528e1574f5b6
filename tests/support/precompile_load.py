"""One load of a core on CUDA in a fresh process (its own Triton cache, nothing compiled in memory),
for tests/gpu/test_kernel_precompile_cuda.py: prints one JSON line with the greedy tokens of the
prompts, the precompile report, the Triton variants the process compiled itself after the
workers' compiles were awaited that no worker had been sent, and how many of the tensors the captured
graph modules hold (their constants) the load changed.

    python -m support.precompile_load CORE PUBLIC_KEY_HEX NAMESPACE WORKERS PROMPTS_JSON MAX_TOKENS
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    core_path, public_hex, namespace, workers, prompts_json, max_tokens = argv
    import torch
    from triton.runtime.jit import JITFunction

    from helios.core.keys import PublicKey
    from helios.core.reader import open_core
    from helios.runtime.loading import cuda_graphs, kernel_precompile
    from helios.runtime.loading.model import LoadOptions
    from support.runtime_runs import greedy_run

    seen = {"after_wait": False, "sent": set(), "report": None, "unsent_after_wait": []}
    do_compile, wait = JITFunction._do_compile, kernel_precompile.KernelCompiler.wait

    def counted(self, key, *args, **kwargs):  # reached only by variants compiled in this process
        if seen["after_wait"] and (id(self), key) not in seen["sent"]:
            seen["unsent_after_wait"].append(self._fn_name)
        return do_compile(self, key, *args, **kwargs)

    def waited(compiler):
        report = wait(compiler)
        seen.update(after_wait=True, sent=set(compiler._jobs), report=report)
        return report

    JITFunction._do_compile, kernel_precompile.KernelCompiler.wait = counted, waited
    held = []  # (a graph module's own tensor, its value when the module was built)
    plan_of = cuda_graphs._plan

    def planned(program, device):
        plan = plan_of(program, device)
        held.extend((t, t.clone()) for module in plan.modules() for t in cuda_graphs.held_tensors(module))
        return plan

    cuda_graphs._plan = planned
    core = open_core(core_path, accept=namespace, trusted_keys=[PublicKey(bytes.fromhex(public_hex))])
    run = greedy_run(core, json.loads(prompts_json), int(max_tokens),
                     LoadOptions(device="cuda", compile_workers=int(workers)))
    print(json.dumps({"tokens": run.tokens, "captured": run.captured, "report": seen["report"],
                      "unsent_after_wait": seen["unsent_after_wait"], "held": len(held),
                      "held_changed": sum(not torch.equal(t, value) for t, value in held)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
