"""Inputs of the vocabulary-shard sampling tests, and two NCCL ranks (spawned processes, one GPU
each) running the shard ops and the fused residual all-reduce eagerly and from a CUDA graph; each
rank sends its results (on the CPU) back to the test. Lives in `support` so that the spawned
children can import it."""

from __future__ import annotations


import torch

VOCAB, ROWS, RANKS = 77, 6, 2  # 77 = 2 shards of 39, the last one with a padding column
SHARD = -(-VOCAB // RANKS)
ALIGNED_VOCAB = 128  # 2 shards of 64: on CUDA the fused greedy pass takes them
SAMPLE_ARGS = ("seeds", "counters", "temperature", "top_k", "top_p", "min_p", "penalties", "prompt_counts",
               "output_counts", "grammar_mask", "mask_rows")


def row_inputs(seed: int = 0, vocab: int = VOCAB) -> dict:
    """Rows covering greedy, drawing (top-k, top-p, min-p), penalised, masked and all-masked rows."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, vocab, generator=g) * 3
    logits[0, [5, 60]] = 20.0  # a tie across the shards: the lower id wins
    logits[1, 3] = float("nan")
    logits[2, 70] = float("inf")
    penalties = torch.tensor([[1.0, 0.0, 0.0]] * ROWS)
    penalties[2] = torch.tensor([1.3, 0.4, 0.2])
    penalties[3] = torch.tensor([1.1, 0.0, 0.5])
    grammar_mask = torch.full((ROWS, -(-vocab // 32)), -1, dtype=torch.int32)
    grammar_mask[4] = torch.tensor([0x00F0F0F0, 0, 0x1, 0][:grammar_mask.shape[1]], dtype=torch.int32)  # both shards
    grammar_mask[5] = 0  # nothing allowed: NO_TOKEN
    counts = torch.randint(0, 3, (2, ROWS, vocab), generator=g, dtype=torch.int32)
    return dict(
        logits=logits, seeds=torch.arange(ROWS, dtype=torch.int64) * 7919, counters=torch.arange(ROWS) + 3,
        temperature=torch.tensor([0.0, 0.8, 0.0, 1.3, 0.7, 0.0]),
        top_k=torch.tensor([0, 5, 0, 0, 0, 0], dtype=torch.int32),
        top_p=torch.tensor([1.0, 1.0, 1.0, 0.9, 1.0, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.0]),
        penalties=penalties, prompt_counts=counts[0], output_counts=counts[1], grammar_mask=grammar_mask,
        mask_rows=torch.ones(ROWS, dtype=torch.bool))


def shard_of(logits: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s columns of `logits` and its first id (padding columns hold a value to ignore)."""
    vocab = logits.shape[1]
    shard = -(-vocab // RANKS)
    padded = torch.nn.functional.pad(logits, (0, shard * RANKS - vocab), value=0.5)
    return padded[:, rank * shard:(rank + 1) * shard].contiguous(), torch.tensor([rank * shard])


def residual_inputs(rank: int) -> tuple[torch.Tensor, ...]:
    """(x, this rank's partial, weight): float32 [5, 64], the same x and weight on every rank."""
    g = torch.Generator().manual_seed(4)
    x, weight = torch.randn(5, 64, generator=g), torch.rand(64, generator=g)
    partial = torch.randn(5, 64, generator=torch.Generator().manual_seed(100 + rank))
    return x, partial, weight


def run_shard_rank(rank: int, address: str, results) -> None:
    """Forms an NCCL group on ``cuda:rank`` and runs the shard ops (`nccl_ranks.report_rank`)."""
    from support.nccl_ranks import report_rank

    report_rank(rank, address, results, _shard_ops)


def _calls(group, rank: int, device, vocab: int):
    """The ops under test as bound programs call them, on this rank's (static) device inputs."""
    import helios.abi  # noqa: F401 - registers the ops
    from helios.abi.reduce_norm import GroupResidualNorm
    from helios.abi.sampling import SampleVariant
    from helios.abi.vocab_shards import ShardedSampling

    args = {name: value.to(device) for name, value in row_inputs(0, vocab).items()}
    logits, start = (t.to(device) for t in shard_of(args["logits"], rank))
    rest = [args[name] for name in SAMPLE_ARGS]
    tokens = torch.zeros(ROWS, dtype=torch.int64, device=device) + 4
    x, partial, weight = (t.to(device) for t in residual_inputs(rank))
    full, greedy = ShardedSampling(group), ShardedSampling(group, SampleVariant.GREEDY)
    norm = GroupResidualNorm(group).all_reduce_add_rms_norm
    return lambda: {"full": full.sample(logits, start, vocab, *rest, RANKS),
                    "greedy": greedy.sample(logits, start, vocab, *rest, RANKS),
                    "logprobs": full.token_logprobs(logits, start, vocab, tokens, *rest[6:], 5, RANKS),
                    "norm": norm(x, partial, weight, 1e-6, RANKS)}


def _shard_ops(rank: int, address: str):
    from support.nccl_ranks import form_group

    group, device = form_group(rank, address, RANKS)
    calls = [_calls(group, rank, device, vocab) for vocab in (VOCAB, ALIGNED_VOCAB)]
    call = lambda: {f"{vocab}.{name}": value for vocab, one in zip((VOCAB, ALIGNED_VOCAB), calls)  # noqa: E731
                    for name, value in one().items()}
    eager = call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capturing stream (Triton compiles here)
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    graph.replay()
    torch.cuda.synchronize(device)
    outputs = {}
    for mode, values in (("eager", eager), ("graph", captured)):
        for name, value in values.items():
            outputs[f"{mode}.{name}"] = tuple(v.cpu() for v in value) if isinstance(value, tuple) else value.cpu()
    return group, outputs
