"""Cutting a prepared model into N tensor-parallel ranks (Megatron-style), at preparation time.

`rank_architecture(arch, N)` is the Architecture of one rank (see `architecture`'s module docstring)
and `rank_weights(recipe, N, rank)` that rank's weights, in `weight_layout` order:

| weight | rank r of N holds |
|---|---|
| ``qkv.weight`` / ``qkv.bias`` (column-parallel) | its q heads, then its k heads, then its v heads |
| ``o.weight`` (row-parallel) | the input columns of its q heads; ``o.bias`` whole (added after the sum) |
| ``gate_up.weight`` / ``gate_up.bias`` (column-parallel) | its gate rows, then its up rows |
| ``down.weight`` (row-parallel) | the input columns of its MLP rows; ``down.bias`` whole |
| ``experts.gate_up`` / ``experts.gate_up_bias``, ``shared.gate_up.weight`` | per expert its gate rows, then its up rows |
| ``experts.down``, ``shared.down.weight`` | per expert the input columns of its rows |
| ``experts.down_bias`` | rank 0 whole, other ranks zeros (the sum over ranks adds it once) |
| ``router.*``, ``shared.gate`` (Qwen2-MoE's shared-expert gate [1, H]) | whole (every rank routes and gates every token alike) |
| Mamba2 ``mixer.in_proj`` / ``mixer.conv`` | its heads' z, x, dt rows; its groups' B, C rows (one group: whole) |
| ``mixer.dt_bias`` / ``mixer.A`` / ``mixer.D`` / ``mixer.norm`` | its heads' entries (the norm: their channels) |
| ``mixer.out.weight`` (row-parallel) | the input columns of its heads; ``mixer.out.bias`` whole |
| ``sinks`` (attention sinks, one per query head) | its q heads' |
| ``q_norm`` / ``k_norm`` spanning whole projections (``qk_norm_whole``) or per head (``qk_norm_heads``) | its q / k heads' entries |
| ``up.weight`` / ``up.bias`` (a non-gated MLP, column-parallel) | its MLP rows |
| ``embed`` / ``lm_head`` / ``lm_head_bias`` (vocabulary-parallel) | vocabulary rows [r * ceil(V/N), ...), zero-padded |
| latent attention ``q.weight`` / ``q_b.weight`` / ``kv_b.weight`` | the rows of its heads |
| ``q_a.weight``, ``kv_a.weight`` (latent down-projections), their norms | whole (replicated) |
| ``indexer.*`` (a token indexer's projections and norm, `helios.ignition.token_indexer`) | whole (replicated) |
| norms (``attn_out_norm`` / ``mlp_out_norm`` too), ``rope.inv_freq``, ``rope.local_inv_freq`` | whole (replicated) |
| ``vocab.start`` | [r * ceil(V/N)] |

A latent layer's history (latent and rotary key) is the same for every head, so each rank keeps the
whole latent region. A Mamba2 mixer is split by heads and by the B/C groups those heads read
(rank r: heads [r H/N, (r+1) H/N), groups [r G/N, (r+1) G/N)), so each rank's convolution, scan,
gated group norm and state rows (conv state of its channels, SSM state of its heads) are local and
one all-reduce after out sums the mixer. A one-group mixer (most Mamba2 hybrids) keeps B and C
whole on every rank and its gated norm sums each token's squares over the ranks (one all-reduce).
Experts are split by their intermediate width (each rank runs every selected expert on its share
and one all-reduce sums the routed and shared experts). Heads, key/value heads, the MLP width, the
expert widths and a mixer's heads and groups (unless one) must divide by N (a `CheckpointError`
says which does not, and the config.json setting that holds it: fewer key/value heads than ranks
are refused, not replicated); the vocabulary need not (the last rank's rows are padded with zeros
and their logits cut). A Gated DeltaNet layer (Qwen3-Next, Qwen3.5) is split by key heads, each with
the value heads that read it (rank r: key heads [r Hk/N, (r+1) Hk/N) and their Hv/N value heads): its
q/k/v/z/b/a rows, convolution channels, dt_bias and A, its state rows and the input columns of out
are the rank's own (the per-head output norm is whole on each rank), and one all-reduce after out
sums the layer; an attention output gate's rows are cut by query heads like the queries.
Every rank has the same shapes, so one captured program serves all of them.

`rank_weight_files` turns each rank's weights into its safetensors resource and the per-rank
weight catalog (stored tensor views; they describe the resource and select no serving behaviour).
The resource is a `SafetensorsImage`: the bytes `safetensors.torch.save` would produce, kept as a
header plus the tensors' own memory, so the core writer compresses the weights in place.
"""

from __future__ import annotations

import dataclasses
import json

import torch

from helios.contract import manifest_pb2 as mpb
from helios.core.catalogs import TensorView, WeightCatalog
from helios.ignition.architecture import Architecture, CheckpointError
from helios.ignition.recipes.base import NamedWeight, Recipe, check_weights
from helios.ignition.recurrent_geometry import GatedDeltaNetGeometry, KimiDeltaGeometry, ShortConvGeometry
from helios.ignition.safetensors_image import SafetensorsImage, safetensors_image


def rank_architecture(arch: Architecture, ranks: int) -> Architecture:
    """The Architecture of one of `ranks` tensor-parallel ranks (`arch` itself when ranks == 1)."""
    if ranks < 1:
        raise CheckpointError(f"tensor parallelism needs at least one rank, got {ranks}")
    if arch.tensor_parallel != 1:
        raise CheckpointError("the architecture is already one rank's share")
    if ranks == 1:
        return arch
    extents = {"attention heads (num_attention_heads)": arch.num_heads,
               "key/value heads (num_key_value_heads)": arch.num_kv_heads}
    if arch.has_dense_mlp:  # a config's intermediate_size that no layer uses (every one sparse) cuts nothing
        extents["MLP width (intermediate_size)"] = arch.intermediate_size
    recurrent = arch.recurrent
    if isinstance(recurrent, KimiDeltaGeometry) or (recurrent is not None and arch.latent is not None):
        raise CheckpointError("tensor parallelism: Kimi Delta Attention layers and latent attention beside recurrent "
                              "layers are prepared for one rank")
    if isinstance(recurrent, GatedDeltaNetGeometry):  # key heads, each with the value heads reading it
        extents["linear-attention key heads (linear_num_key_heads)"] = recurrent.num_key_heads
    elif isinstance(recurrent, ShortConvGeometry):  # channels (with their gates and convolution taps)
        extents["short convolution channels (hidden_size)"] = recurrent.channels
    elif recurrent is not None:  # a mixer's heads and the B/C groups they read are split alike
        extents["mixer heads (mamba_n_heads)"] = recurrent.num_heads
        if recurrent.num_groups > 1:  # one group: B/C whole on every rank, the norm summed over ranks
            extents["mixer groups (mamba_n_groups)"] = recurrent.num_groups
    moe = arch.moe
    if moe is not None:
        extents["expert width (moe_intermediate_size; Mixtral's and gpt-oss's intermediate_size)"] = \
            moe.expert_intermediate_size
        extents["shared expert width (n_shared_experts x moe_intermediate_size, or "
                "shared_expert_intermediate_size / shared_intermediate_size)"] = moe.shared_intermediate_size
    uneven = [f"{name} {value}" for name, value in extents.items() if value % ranks]
    if uneven:
        raise CheckpointError(f"tensor parallel {ranks} needs {', '.join(uneven)} divisible by {ranks}")
    if moe is not None:
        moe = dataclasses.replace(moe, expert_intermediate_size=moe.expert_intermediate_size // ranks,
                                  shared_intermediate_size=moe.shared_intermediate_size // ranks)
    if isinstance(recurrent, GatedDeltaNetGeometry):
        recurrent = dataclasses.replace(recurrent, num_key_heads=recurrent.num_key_heads // ranks,
                                        num_value_heads=recurrent.num_value_heads // ranks)
    elif isinstance(recurrent, ShortConvGeometry):
        recurrent = dataclasses.replace(recurrent, channels=recurrent.channels // ranks)
    elif recurrent is not None:
        split = recurrent.num_groups > 1
        recurrent = dataclasses.replace(recurrent, num_heads=recurrent.num_heads // ranks,
                                        num_groups=recurrent.num_groups // ranks if split else 1,
                                        norm_ranks=1 if split else ranks)
    return dataclasses.replace(
        arch, num_heads=arch.num_heads // ranks, num_kv_heads=arch.num_kv_heads // ranks,
        intermediate_size=arch.intermediate_size // ranks if arch.has_dense_mlp else 0, tensor_parallel=ranks,
        moe=moe, recurrent=recurrent,
    )


ENGRAM_PREFIX = "engram."  # extra weights every rank holds whole (`helios.ignition.engram`)


def rank_weights(recipe: Recipe, ranks: int, rank: int) -> tuple[NamedWeight, ...]:
    """Rank `rank`'s weights, following `weight_layout(rank_architecture(...))` exactly."""
    full, shard = recipe.architecture, rank_architecture(recipe.architecture, ranks)
    if ranks == 1:
        return recipe.weights + recipe.extra_weights
    replicated = tuple(w for w in recipe.extra_weights if w.name.startswith(ENGRAM_PREFIX))
    if len(replicated) != len(recipe.extra_weights):
        raise CheckpointError(f"{recipe.source_architecture} checkpoints are prepared for one rank")
    if not 0 <= rank < ranks:
        raise CheckpointError(f"rank {rank} is not below {ranks}")
    cut = _Cutter(full, shard, rank)
    weights = tuple(NamedWeight(w.name, cut(w.name, w.tensor)) for w in recipe.weights)
    start = torch.tensor([rank * shard.vocab_rows], dtype=torch.int64)
    weights += (NamedWeight("vocab.start", start),)
    check_weights(shard, weights)  # names, order, shapes and dtypes of weight_layout(shard)
    return weights + replicated  # an Engram projection: every rank adds the whole term after the embedding


@dataclasses.dataclass(frozen=True)
class _Cutter:
    full: Architecture
    shard: Architecture
    rank: int

    def __call__(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        key = name.split(".", 2)[2] if name.startswith("layers.") else name
        if key in ("qkv.weight", "qkv.bias"):
            return self.qkv(tensor)
        if key in ("gate_up.weight", "gate_up.bias"):
            return self.gate_up(tensor, self.full.intermediate_size, self.shard.intermediate_size)
        if key.startswith(("experts.", "shared.")):
            return self.experts(key, tensor)
        if key.startswith("mixer.") and key != "mixer.out.bias":
            return self.mixer(key, tensor)
        if key.startswith("delta."):
            return self.delta(key, tensor)
        if key.startswith("short.") and key != "short.out.bias":
            return self.short_conv(key, tensor)
        if key == "o.weight":
            return self.columns(tensor, self.shard.attention_out_size)
        if key in ("q.weight", "q_b.weight", "kv_b.weight"):  # latent attention: per-head rows
            return self.rows(tensor, tensor.shape[0] // self.shard.tensor_parallel).clone()
        if key == "sinks":
            return self.rows(tensor, self.shard.num_heads).contiguous()
        if key in ("up.weight", "up.bias"):  # a non-gated MLP's rows
            return self.rows(tensor, self.shard.intermediate_size).contiguous()
        if key in ("q_norm", "k_norm") and (self.full.qk_norm_whole or self.full.qk_norm_heads):  # per q/k row
            return self.rows(tensor, self.shard.q_size if key == "q_norm" else self.shard.kv_size).clone()
        if key == "down.weight":
            return self.columns(tensor, self.shard.intermediate_size)
        if name in ("embed", "lm_head", "lm_head_bias"):
            return self.vocabulary(tensor)
        return tensor.clone()  # norms, o/down biases, rotary frequencies: replicated

    def qkv(self, tensor: torch.Tensor) -> torch.Tensor:
        gate_size = self.full.q_size if self.full.attention_gate else 0  # output-gate rows last, by query head
        q, k, v, gate = tensor.split([self.full.q_size, self.full.kv_size, self.full.kv_size, gate_size])
        return torch.cat([self.rows(q, self.shard.q_size), self.rows(k, self.shard.kv_size),
                          self.rows(v, self.shard.kv_size), self.rows(gate, gate_size // self.shard.tensor_parallel)
                          ]).contiguous()

    def delta(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A Gated DeltaNet layer's share: its key heads' q/k rows, their value heads' v/z/b/a rows
        (in_proj and the convolution's q/k/v channels), dt_bias and A, the input columns of out."""
        full, shard = self.full.recurrent, self.shard.recurrent
        if key == "delta.out.weight":
            return self.columns(tensor, shard.value_dim)
        if key == "delta.norm":  # one weight for every value head
            return tensor.clone()
        if key in ("delta.dt_bias", "delta.A"):
            return self.rows(tensor, shard.num_value_heads).clone()
        widths = [full.key_dim, full.key_dim, full.value_dim]
        shares = [shard.key_dim, shard.key_dim, shard.value_dim]
        if key == "delta.in_proj.weight":  # q | k | v | z | b | a
            widths += [full.value_dim, full.num_value_heads, full.num_value_heads]
            shares += [shard.value_dim, shard.num_value_heads, shard.num_value_heads]
        parts = tensor.split(widths)  # delta.conv.weight / delta.conv.bias: q | k | v channels
        return torch.cat([self.rows(part, share) for part, share in zip(parts, shares)]).contiguous()

    def short_conv(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A gated short convolution's share: its channels' rows of B, C and x (in_proj), of the
        convolution, and its channels' input columns of out (whose bias is added once, whole)."""
        width = self.shard.recurrent.channels
        if key == "short.out.weight":
            return self.columns(tensor, width)
        if key in ("short.in_proj.weight", "short.in_proj.bias"):  # B | C | x
            return torch.cat([self.rows(part, width) for part in tensor.chunk(3)]).contiguous()
        return self.rows(tensor, width).contiguous()  # short.conv.weight / short.conv.bias

    def gate_up(self, tensor: torch.Tensor, full: int, width: int, dim: int = 0) -> torch.Tensor:
        gate, up = tensor.split([full, full], dim=dim)
        own = slice(self.rank * width, (self.rank + 1) * width)
        return torch.cat([gate.narrow(dim, own.start, width), up.narrow(dim, own.start, width)], dim=dim).contiguous()

    def experts(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """Each expert's (or the shared expert's) share of its intermediate width."""
        full, shard = self.full.moe, self.shard.moe
        if key == "shared.gate":  # reads the whole input, scales each rank's share alike
            return tensor.clone()
        if key.startswith("shared."):
            full_width, width = full.shared_intermediate_size, shard.shared_intermediate_size
            if key == "shared.gate_up.weight":
                return self.gate_up(tensor, full_width, width)
            if key == "shared.up.weight":  # a non-gated shared expert's rows
                return self.rows(tensor, width).contiguous()
            return self.columns(tensor, width)
        full_width, width = full.expert_intermediate_size, shard.expert_intermediate_size
        if key in ("experts.gate_up", "experts.gate_up_bias"):
            return self.gate_up(tensor, full_width, width, dim=1)
        if key in ("experts.up", "experts.up_bias"):  # non-gated experts: each expert's up rows
            return tensor[:, self.rank * width:(self.rank + 1) * width].contiguous()
        if key == "experts.down":
            return tensor[:, :, self.rank * width:(self.rank + 1) * width].contiguous()
        return tensor.clone() if self.rank == 0 else torch.zeros_like(tensor)  # experts.down_bias

    def mixer(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A Mamba2 mixer's share: its heads' rows of z, x, dt, dt_bias, A, D and the gated norm, its
        groups' rows of B and C (in_proj and the convolution), its heads' input columns of out."""
        full, shard = self.full.recurrent, self.shard.recurrent
        if key in ("mixer.in_proj.weight", "mixer.in_proj.bias"):
            z, xbc, dt = tensor.split([full.intermediate, full.conv_dim, full.num_heads])
            return torch.cat([self.rows(z, shard.intermediate), self.conv_channels(xbc),
                              self.rows(dt, shard.num_heads)]).contiguous()
        if key in ("mixer.conv.weight", "mixer.conv.bias"):
            return self.conv_channels(tensor).contiguous()
        if key == "mixer.out.weight":
            return self.columns(tensor, shard.intermediate)
        width = shard.intermediate if key == "mixer.norm" else shard.num_heads  # dt_bias, A, D: per head
        return self.rows(tensor, width).clone()

    def conv_channels(self, tensor: torch.Tensor) -> torch.Tensor:
        """The rank's rows of the convolved channels x | B | C (first dim)."""
        full, shard = self.full.recurrent, self.shard.recurrent
        x, b, c = tensor.split([full.intermediate, full.num_groups * full.state_size,
                                full.num_groups * full.state_size])
        if shard.norm_ranks > 1:  # one group, read by every rank's heads: B and C whole
            return torch.cat([self.rows(x, shard.intermediate), b, c])
        groups = shard.num_groups * shard.state_size
        return torch.cat([self.rows(x, shard.intermediate), self.rows(b, groups), self.rows(c, groups)])

    def rows(self, tensor: torch.Tensor, count: int) -> torch.Tensor:
        return tensor[self.rank * count:(self.rank + 1) * count]

    def columns(self, tensor: torch.Tensor, count: int) -> torch.Tensor:
        return tensor[:, self.rank * count:(self.rank + 1) * count].contiguous()

    def vocabulary(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = self.shard.vocab_rows
        held = tensor[self.rank * rows:(self.rank + 1) * rows]
        padded = torch.zeros((rows, *tensor.shape[1:]), dtype=tensor.dtype)
        padded[: held.shape[0]] = held
        return padded


@dataclasses.dataclass(frozen=True)
class RankWeightsFile:
    """One rank's weights resource: a safetensors image (tensor names ``w.<slot>``; it borrows the
    rank's tensors) and its catalog."""

    rank: int
    resource_id: str
    image: SafetensorsImage
    catalog: WeightCatalog


# A rank's weights are cut into resources of about this many bytes (whole tensors, name order): each
# resource is its own zstd frame, so load decodes, verifies and copies them side by side on a pool
# (one frame decodes on one core). A model under this size keeps one resource per rank.
WEIGHT_PART_NBYTES = 512 << 20


def rank_weight_files(recipe: Recipe, ranks: int, part_nbytes: int | None = None) -> tuple[RankWeightsFile, ...]:
    """Every rank's weights resources, rank order then part order; resource ids ``weights.rank<r>``
    for the first part and ``weights.rank<r>.part<k>`` for the others. Every rank has the same
    shapes, so every rank has the same parts (load maps them by position). `part_nbytes`: None for
    WEIGHT_PART_NBYTES."""
    part_nbytes = part_nbytes or WEIGHT_PART_NBYTES
    files = []
    for rank in range(ranks):
        tensors = {f"w.{w.name}": w.tensor.contiguous() for w in rank_weights(recipe, ranks, rank)}
        for index, part in enumerate(weight_parts(tensors, part_nbytes)):
            image = safetensors_image(part)
            resource_id = f"weights.rank{rank}" + (f".part{index}" if index else "")
            files.append(RankWeightsFile(rank, resource_id, image, weight_catalog(rank, resource_id, image.header)))
    return tuple(files)


def weight_parts(tensors: dict[str, torch.Tensor], part_nbytes: int) -> list[dict[str, torch.Tensor]]:
    """`tensors` in name order, cut into consecutive groups of at most `part_nbytes` bytes (a tensor
    larger than that is a group of its own); at least one group."""
    parts: list[dict[str, torch.Tensor]] = [{}]
    filled = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if parts[-1] and filled + nbytes > part_nbytes:
            parts.append({})
            filled = 0
        parts[-1][name] = tensors[name]
        filled += nbytes
    return parts


def weight_resources(files: tuple[RankWeightsFile, ...], rank: int = 0) -> dict[str, str]:
    """Weight slot name (``w.`` stripped) -> the resource of rank `rank` that holds it."""
    return {view.name[2:]: file.resource_id for file in files if file.rank == rank for view in file.catalog.tensors}


def weight_catalog(rank: int, resource_id: str, data: bytes) -> WeightCatalog:
    """The stored tensor views of a safetensors resource: names, dtypes, shapes, byte ranges.
    `data` is the file or just its header (length prefix and JSON)."""
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    views = []
    for name, entry in sorted(header.items()):
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        views.append(TensorView(name, _CATALOG_DTYPES[entry["dtype"]], tuple(entry["shape"]),
                                8 + header_len + begin, end - begin))
    return WeightCatalog(rank, resource_id, tuple(views))


_CATALOG_DTYPES = {"F32": mpb.DTYPE_FLOAT32, "BF16": mpb.DTYPE_BFLOAT16, "F16": mpb.DTYPE_FLOAT16,
                   "I64": mpb.DTYPE_INT64, "I32": mpb.DTYPE_INT32}
