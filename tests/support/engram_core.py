"""A tiny Engram test model: an n-gram language model whose context comes only from a hashed n-gram
embedding table resident in host memory, staged per step by the runtime (`helios.runtime.execution.host_staging`).

For every packed token t at position p the model reads the rows its n-gram selects (one per hash
head, staged by the runtime into ``engram_rows`` [tokens, heads, width]) and computes

    hidden = embed[t] + engram_rows[p].flatten() @ proj        logits = hidden @ head^T

sampling greedily at each row's last packed token. `write_engram_core` builds such a core from the
committed fixture core (its tokenizer, chat template, capacities and graph declarations): PREFILL,
DECODE and MIXED keep their bindings and gain one HOST_TABLE_ROWS binding, their programs are
replaced by exported `EngramProgram`s, DECODE's pending token becomes host-fed, and the table
([rows, width], PLACEMENT_HOST) is a WEIGHT resource of its own. `reference_tokens` is the plain
computation: the same hash and arithmetic, directly over the token list, no runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save as save_safetensors

import helios.abi.completion  # noqa: F401  (registers helios::completion_record)
from helios.abi.program_image import encode_program
from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.core.keys import load_signing_key
from helios.core.records import ResourceKind
from helios.core.writer import CoreWriter
from helios.runtime.loading.model import program_arguments
from helios.runtime.service import build_runtime

MASK64 = (1 << 64) - 1
GRAPHS = ("prefill", "decode", "mixed")
WEIGHTS = ("engram.embed", "engram.proj", "engram.head")


@dataclass(frozen=True)
class EngramModel:
    """Weights and hash of the test model (float32)."""

    embed: torch.Tensor  # [V, D]
    proj: torch.Tensor  # [heads * width, D]
    head: torch.Tensor  # [V, D]
    table: torch.Tensor  # [rows, width], host memory
    multipliers: tuple[int, ...]  # heads * ngram_tokens, head-major
    ngram_tokens: int
    heads: int

    @staticmethod
    def random(vocab: int, seed: int = 5, rows: int = 257, width: int = 8, dim: int = 16, heads: int = 2,
               ngram_tokens: int = 3) -> "EngramModel":
        g = torch.Generator().manual_seed(seed)
        multipliers = tuple(int(torch.randint(1, 2**62, (1,), generator=g)) * 2 + 1 for _ in range(heads * ngram_tokens))
        return EngramModel(torch.randn(vocab, dim, generator=g) * 0.1, torch.randn(heads * width, dim, generator=g),
                           torch.randn(vocab, dim, generator=g), torch.randn(rows, width, generator=g),
                           multipliers, ngram_tokens, heads)

    def rows_at(self, tokens: list[int], position: int) -> list[int]:
        """The table row each head selects for the n-gram ending at `position` (the spec's hash)."""
        out = []
        for h in range(self.heads):
            key = 0
            for i in range(self.ngram_tokens):
                p = position - i
                key ^= (((tokens[p] + 1) if p >= 0 else 0) * self.multipliers[h * self.ngram_tokens + i]) & MASK64
            out.append(key % self.table.shape[0])
        return out


def reference_tokens(model: EngramModel, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation of `prompt` computed directly (the plain reference)."""
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        p = len(tokens) - 1
        staged = model.table[model.rows_at(tokens, p)].reshape(-1)
        hidden = model.embed[tokens[p]] + staged @ model.proj
        token = int(torch.argmax(hidden @ model.head.T))
        out.append(token)
        tokens.append(token)
    return out


class EngramProgram(torch.nn.Module):
    """One PREFILL, DECODE or MIXED program; `names` are its program inputs (the fixture's, then
    ``engram_rows``). Reads only what the Engram model needs; writes nothing in place."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__()
        self.names = names

    def forward(self, weights: list[torch.Tensor], *inputs):
        x = dict(zip(self.names, inputs))
        embed, proj, head = weights
        tokens, query_lens = x["token_ids"], x["query_lens"]
        zero = torch.zeros(1, dtype=torch.int64)
        query_start = torch.cat((zero, torch.cumsum(query_lens.to(torch.int64), 0)))
        last = (query_start[1:] - 1).clamp(min=0)
        rows = x["engram_rows"]
        hidden = embed[tokens.to(torch.int64).clamp(min=0)] + rows.reshape(rows.shape[0], -1) @ proj
        logits = hidden[last] @ head.T
        sampled = torch.where(x["sample_rows"].to(torch.bool), torch.argmax(logits, dim=-1), torch.full_like(last, -1))
        offered = query_lens.to(torch.int64)
        consumed = torch.where(offered > 0, x["positions"].to(torch.int64)[last] + 1, torch.zeros_like(offered))
        record = torch.ops.helios.completion_record(
            x["request_slots"], x["generations"], x["submission"].reshape(()), sampled, offered,
            torch.zeros_like(offered), (sampled >= 0).to(torch.int64), consumed, None)
        return record, logits


def write_engram_core(fixture, model: EngramModel, key_path: Path, namespace: str, target: Path,
                      ranks: int = 1) -> Path:
    """The Engram core derived from the opened fixture core `fixture` (module docstring). With
    `ranks` 2 it is a tensor-parallel core whose ranks each run the whole (tiny) model: every rank
    stages its own frames, and a frame is reused only once both ranks retired its consumer."""
    contract_bytes, manifest_bytes = fixture.prepared.encode()
    contract = spb.ServingContract.FromString(contract_bytes)
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    fixture_runtime = build_runtime(fixture)  # its programs' exact argument shapes
    writer = CoreWriter()
    shared = None if ranks > 1 else 0  # rank of the programs and the model's weights
    for info in fixture.resources:
        if info.kind is ResourceKind.WEIGHTS:  # the fixture's own weights: one copy per rank
            for rank in range(ranks):
                name = info.id if rank == 0 else f"{info.id}.r{rank}"
                writer.add_resource(name, info.kind, fixture.read_resource(info.id), rank=rank)
        elif info.kind is not ResourceKind.PROGRAM_IMAGE or info.id.startswith("program.tuning"):
            writer.add_resource(info.id, info.kind, fixture.read_resource(info.id),
                                rank=shared if info.kind is ResourceKind.PROGRAM_IMAGE else info.rank)
    _declare(contract, manifest, model, max(h.capacity.packed_token_capacity for h in manifest.graph_handles))
    weights = {"engram.embed": model.embed, "engram.proj": model.proj, "engram.head": model.head}
    writer.add_resource("weights.engram", ResourceKind.WEIGHTS, save_safetensors(weights), rank=shared)
    writer.add_resource("weights.engram_table", ResourceKind.WEIGHTS,
                        save_safetensors({"engram.table": model.table}), rank=shared)
    loaded = {p.graph + str(p.packed_token_capacity): p for p in fixture_runtime.model.programs}
    for handle in manifest.graph_handles:
        if handle.graph not in GRAPHS:
            continue
        program = loaded[handle.graph + str(handle.capacity.packed_token_capacity)]
        example = program_arguments(program, fixture_runtime.model.weights, fixture_runtime.model.buffers)[1:]
        example.append(torch.zeros(handle.capacity.packed_token_capacity, model.heads, model.table.shape[1]))
        names = (*handle.program_inputs, "engram_rows")
        exported = torch.export.export(EngramProgram(names), ([model.embed, model.proj, model.head], *example))
        handle.resource_id = f"program.engram.{handle.graph}.t{handle.capacity.packed_token_capacity}"
        handle.program_inputs.append("engram_rows")
        del handle.abi_operations[:]
        handle.abi_operations.append("helios::completion_record")
        writer.add_resource(handle.resource_id, ResourceKind.PROGRAM_IMAGE, encode_program(exported), rank=shared)
    manifest.ranks = ranks
    for handle in list(manifest.graph_handles):
        for rank in range(1, ranks):
            manifest.graph_handles.add().CopyFrom(handle)
            manifest.graph_handles[-1].rank = rank
    writer.set_contract(PreparedContract.from_messages(contract, manifest))
    writer.set_publisher(namespace)
    writer.add_signing_key(load_signing_key(key_path))
    writer.write(target)
    return target


def _declare(contract: spb.ServingContract, manifest: mpb.ExecutionManifest, model: EngramModel, tokens: int) -> None:
    """The table, its destination and bindings, the model's weights and host-fed pending tokens."""
    rows, width = model.table.shape
    for name, tensor, resource in ((*item, "weights.engram") for item in zip(WEIGHTS, (model.embed, model.proj,
                                                                                         model.head))):
        buffer = manifest.buffers.add(name=name, dtype=mpb.DTYPE_FLOAT32, placement=mpb.PLACEMENT_DEVICE,
                                      role=mpb.BUFFER_ROLE_WEIGHT, resource_id=resource)
        buffer.shape.extend(mpb.Dim(size=size) for size in tensor.shape)
    table = manifest.buffers.add(name="engram.table", dtype=mpb.DTYPE_FLOAT32, placement=mpb.PLACEMENT_HOST,
                                 role=mpb.BUFFER_ROLE_WEIGHT, resource_id="weights.engram_table")
    table.shape.extend([mpb.Dim(size=rows), mpb.Dim(size=width)])
    # The destination lives on the device; the runtime's two host frames per table feed it.
    staged = manifest.buffers.add(name="engram_rows", dtype=mpb.DTYPE_FLOAT32, placement=mpb.PLACEMENT_DEVICE,
                                  role=mpb.BUFFER_ROLE_INPUT)
    staged.shape.extend([mpb.Dim(size=tokens), mpb.Dim(size=model.heads), mpb.Dim(size=width)])
    manifest.destinations.add(name="engram_rows", buffer="engram_rows")
    contract.model.host_tables.add(name="engram", table="engram.table", ngram_tokens=model.ngram_tokens,
                                   heads=model.heads, multipliers=model.multipliers)
    for graph in contract.model.graphs:
        if graph.name in GRAPHS:
            graph.pending_token_view = ""  # the host hashes every token: it feeds them all
            del graph.resource_dependencies[:]
            graph.resource_dependencies.extend(WEIGHTS)
            graph.bindings.add(destination="engram_rows", source=spb.VALUE_SOURCE_HOST_TABLE_ROWS,
                               indexing=spb.INDEXING_PACKED_TOKEN, host_table="engram")
