"""The speculative ops on CUDA (selection) against their sorted references, one process: tokens and kept sets
(vs the CPU reference), then time in CUDA graphs at R rows x 128,256 ids."""
import statistics
import sys
import time

import torch

sys.path.insert(0, ".anchor")
sys.path.insert(0, "tests")
from helios.abi import speculative  # noqa: E402
from helios.abi.rng import SAMPLE_OFFSET  # noqa: E402
from support.abi_inputs import control_inputs, seeds_and_counters, verify_inputs  # noqa: E402
from draw_bench import V, capture, timed, inputs_for, SETTINGS  # noqa: E402

OPS = torch.ops.helios
NAMES = ("temperature", "top_k", "top_p", "min_p")


def reference_weights(logits, temperature, top_k, top_p, min_p, penalties, prompt_counts, output_counts, grammar_mask,
                      mask_rows):
    return speculative.sampling_weights_reference(logits, (temperature, top_k, top_p, min_p), penalties,
                                                  (prompt_counts, output_counts), grammar_mask, mask_rows)


if __name__ == "__main__":
    t0 = time.time()
    kept_differ = weight_err = draws_differ = rows = verify_differ = 0
    for seed in range(3):
        inputs = control_inputs(48, V, seed)
        expected = OPS.sampling_weights(**inputs)
        got = OPS.sampling_weights(**{k: v.cuda() for k, v in inputs.items()}).cpu()
        kept_differ += int(((got > 0) != (expected > 0)).any(dim=-1).sum())
        scale = expected.abs().clamp(min=1e-300)
        weight_err = max(weight_err, float(((got - expected).abs() / scale)[expected > 0].max()))
        seeds, counters = seeds_and_counters(48, torch.Generator().manual_seed(seed))
        want = OPS.draw_weighted(expected, seeds, counters, SAMPLE_OFFSET)
        drawn = OPS.draw_weighted(expected.cuda(), seeds.cuda(), counters.cuda(), SAMPLE_OFFSET).cpu()
        draws_differ += int((want != drawn).sum())
        rows += 48
    for seed in range(4):
        inputs = verify_inputs(32, 4, 3, 32000, seed)
        want = OPS.verify_proposals(**inputs)
        got = OPS.verify_proposals(**{k: v.cuda() for k, v in inputs.items()})
        verify_differ += sum(int((a.cpu() != b).sum()) for a, b in zip(got, want))
    print(f"checks: {rows} rows of 128k: kept sets differ in {kept_differ} rows, weights max rel err {weight_err:.2e}, "
          f"draws differ {draws_differ}; verify 128 lanes x 4: {verify_differ} values differ ({time.time() - t0:.0f} s)")

    for rows in (1, 8, 64, 256):
        for shape in ("flat", "peaked"):
            for name, settings in SETTINGS.items():
                static = inputs_for(rows, shape, settings)
                del static["seeds"], static["counters"]
                g_new, w_new = capture(OPS.sampling_weights, static)
                g_old, w_old = capture(reference_weights, static)
                seeds = torch.arange(rows, device="cuda", dtype=torch.int64) * 7919
                draw_static = dict(weights=w_old, seeds=seeds, counters=seeds + 1, offset=SAMPLE_OFFSET)
                d_new, t_new = capture(OPS.draw_weighted, draw_static)
                d_old, t_old = capture(lambda **kw: speculative.draw_reference(**kw), draw_static)
                times = {k: [] for k in ("wn", "wo", "dn", "do")}
                for _ in range(5):
                    times["wn"].append(timed(g_new))
                    times["wo"].append(timed(g_old))
                    times["dn"].append(timed(d_new))
                    times["do"].append(timed(d_old))
                wn, wo, dn, do = (statistics.median(times[k]) for k in ("wn", "wo", "dn", "do"))
                same_kept = int(((w_new > 0) == (w_old > 0)).all(dim=-1).sum())
                same_draws = int((t_new == t_old).sum())
                print(f"R={rows:3d} {shape:6s} {name:26s} weights sorted/selection {wo / wn:5.2f}x, "
                      f"draw sorted/selection {do / dn:5.2f}x; same kept sets {same_kept}/{rows}, "
                      f"same draws {same_draws}/{rows}")
                del g_new, g_old, d_new, d_old
        torch.cuda.empty_cache()
