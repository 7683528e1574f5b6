"""One load of a core on CUDA in a fresh process (its own Triton cache, nothing compiled in memory),
for tests/gpu/test_kernel_precompile_cuda.py: prints one JSON line with the greedy tokens of the
prompts, the precompile report, the Triton variants the process compiled itself once the capture
began waiting for the workers that no worker had been sent, and those a graph's warm-up reached
while the worker compiling it had not finished (its wait missed them).

    python -m support.precompile_load CORE PUBLIC_KEY_HEX NAMESPACE WORKERS PROMPTS_JSON MAX_TOKENS
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    core_path, public_hex, namespace, workers, prompts_json, max_tokens = argv
    from triton.runtime.jit import JITFunction

    from helios.core.keys import PublicKey
    from helios.core.reader import open_core
    from helios.runtime.loading import kernel_precompile
    from helios.runtime.loading.model import LoadOptions
    from support.runtime_runs import greedy_run

    seen = {"compiler": None, "report": None, "unsent_after_wait": [], "not_ready_at_warm_up": []}
    compiler_class = kernel_precompile.KernelCompiler
    do_compile, wait, wait_for = JITFunction._do_compile, compiler_class.wait, compiler_class.wait_for

    def counted(self, key, *args, **kwargs):  # reached by variants not in memory yet (on disk or not)
        compiler = seen["compiler"]
        if compiler is not None:
            job = compiler._jobs.get((id(self), key))
            if job is None:
                seen["unsent_after_wait"].append(self._fn_name)
            elif not job.done():
                seen["not_ready_at_warm_up"].append(self._fn_name)
        return do_compile(self, key, *args, **kwargs)

    def waited_for(compiler, label):
        seen["compiler"] = compiler  # the dry run is over: every variant it found was sent
        return wait_for(compiler, label)

    def waited(compiler):
        report = wait(compiler)
        seen["report"] = report
        return report

    JITFunction._do_compile, compiler_class.wait, compiler_class.wait_for = counted, waited, waited_for
    core = open_core(core_path, accept=namespace, trusted_keys=[PublicKey(bytes.fromhex(public_hex))])
    run = greedy_run(core, json.loads(prompts_json), int(max_tokens),
                     LoadOptions(device="cuda", compile_workers=int(workers)))
    print(json.dumps({"tokens": run.tokens, "captured": run.captured, "report": seen["report"],
                      "unsent_after_wait": seen["unsent_after_wait"],
                      "not_ready_at_warm_up": seen["not_ready_at_warm_up"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
