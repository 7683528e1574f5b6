import sys, time, torch
sys.path.insert(0, "src")
from helios.runtime.loading import gemm_algos
device = torch.device("cuda", 0)
torch.ones(1, device=device)
shapes = {(r, n, k, torch.bfloat16) for r in (64, 256) for n, k in ((28672, 4096), (4096, 14336), (128256, 4096), (6144, 4096))}
t = time.perf_counter()
for c in gemm_algos.choose_algorithms(shapes, device):
    print(c.shape[:3], f"F.linear {c.f_linear_us:.2f}", f"best {c.best_us} {c.best_label}", "chosen" if c.label else "-", flush=True)
print(f"{time.perf_counter() - t:.1f} s")
