"""A token-selecting indexer over latent attention (DeepSeek Sparse Attention): the typed geometry.

With ``Architecture.indexer`` set, each query of a latent-attention layer attends only to the `topk`
past positions of its row that a lightweight indexer scores best (every position while a row holds
no more than `topk`). The layers in `layers` score and select; every other layer reuses the selection
of the nearest earlier scoring layer of the same step (GLM-5's "shared" layers; DeepSeek-V3.2 scores
in every layer). A scoring layer i (H = `num_heads`, D = `head_dim`, Q = the latent query rank):

* queries ``q = layers.i.indexer.q.weight`` [H D, Q] of the normed query latent (the latent
  attention's ``q_a_norm`` output), keys ``k = LayerNorm(layers.i.indexer.k.weight [D, hidden] x)``
  with ``layers.i.indexer.k_norm`` [D], ``layers.i.indexer.k_norm_bias`` [D] and epsilon `norm_eps`;
* the first `rope_dim` values of each query head and of the key rotate by the step's rotary tables
  in halves (a recipe de-interleaves rows that a checkpoint interleaves); the rest pass through;
* per-head weights ``layers.i.indexer.weights`` [H, hidden] float32 of the normed hidden state,
  times H ** -0.5; then ``helios::index_topk`` (scale D ** -0.5) picks the positions, whose keys
  the layer first writes (``helios::index_key_write``) into its plane of ``index_cache``
  [scoring layers, pages, page_tokens, D]: a plane of the latent region, so it is paged, sized,
  shared by prefixes, released and preempted with the latents through the same page tables.

Ties between equal scores go to the earlier position (see `helios.abi.sparse_index`).

Under tensor parallelism every rank holds the indexer's weights whole (`helios.ignition.sharding`
replicates them, as it does the latent down-projections) and its inputs are whole, so every rank
selects the same positions for its share of the heads and keeps the whole ``index_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass

INDEX_CACHE = "index_cache"  # the programs' input holding every scoring layer's key plane


@dataclass(frozen=True)
class TokenIndexer:
    """Geometry of the indexer (see the module docstring)."""

    num_heads: int
    head_dim: int
    topk: int  # positions each query keeps
    rope_dim: int  # leading dims of each indexer query head and key that rotate (in halves)
    layers: tuple[int, ...]  # the layers that score and select, ascending; the first is layer 0
    norm_eps: float = 1e-6

    def problems(self, arch) -> list[str]:
        """What keeps `arch` (an Architecture) from serving this indexer, in words; [] when nothing."""
        found = []
        if min(self.num_heads, self.head_dim, self.topk) < 1:
            found.append(f"indexer heads {self.num_heads}, head width {self.head_dim} and top-k {self.topk} "
                         f"must be >= 1")
        latent = arch.latent
        if latent is None or not latent.q_lora_rank:
            found.append("a token indexer needs latent attention with a query rank (its queries come from "
                         "the normed query latent)")
        elif self.rope_dim != latent.qk_rope_head_dim:
            found.append(f"indexer rope_dim {self.rope_dim} must equal qk_rope_head_dim {latent.qk_rope_head_dim} "
                         f"(it rotates with the attention's tables)")
        if self.rope_dim < 2 or self.rope_dim % 2 or self.rope_dim > self.head_dim:
            found.append(f"indexer rope_dim {self.rope_dim} must be even, >= 2 and at most its head width "
                         f"{self.head_dim}")
        if (not self.layers or self.layers[0] != 0 or list(self.layers) != sorted(set(self.layers))
                or self.layers[-1] >= arch.num_layers):
            found.append(f"indexer layers {self.layers} must ascend from layer 0 within {arch.num_layers} layers")
        if not (self.norm_eps > 0):
            found.append(f"indexer norm_eps {self.norm_eps} must be > 0")
        return found

    def plane_index(self, layer: int) -> int | None:
        """`layer`'s plane of ``index_cache``, or None where it reuses an earlier selection."""
        return self.layers.index(layer) if layer in self.layers else None


def indexer_slots(arch, layer: int, slot, weight_slot) -> list:
    """`layer`'s indexer weight slots (none where it reuses a selection): `slot(name, *shape)` makes
    one in the model's dtype, `weight_slot(name, shape, dtype)` one of its own dtype."""
    indexer, prefix = arch.indexer, f"layers.{layer}.indexer."
    if indexer is None or indexer.plane_index(layer) is None:
        return []
    heads, width = indexer.num_heads, indexer.head_dim
    return [slot(prefix + "q.weight", heads * width, arch.latent.q_lora_rank),
            slot(prefix + "k.weight", width, arch.hidden_size),
            slot(prefix + "k_norm", width), slot(prefix + "k_norm_bias", width),
            weight_slot(prefix + "weights", (heads, arch.hidden_size), "float32")]


def index_input_specs(arch, page_tokens: int, options, operation) -> tuple:
    """The programs' last input with an indexer: ``index_cache`` [scoring layers, pages, page_tokens, D],
    cache storage of the latent region; none without one. Raises CheckpointError for program kinds
    not built to select tokens (a draft model, speculation, images, Engram rows)."""
    from helios.ignition.architecture import CheckpointError
    from helios.ignition.program_spec import Access, InputRole, Operation, TensorSpec

    if arch.indexer is None:
        return ()
    extras = {"a draft model": options.draft is not None, "images": options.multimodal is not None,
              "Engram rows": options.engram is not None, "speculation": operation is Operation.SPECULATIVE}
    refused = [name for name, present in extras.items() if present]
    if refused:
        raise CheckpointError(f"a token-selecting indexer's programs take no {', '.join(refused)}")
    shape = (len(arch.indexer.layers), "pages", page_tokens, arch.indexer.head_dim)
    return (TensorSpec(INDEX_CACHE, arch.dtype, shape, InputRole.CACHE_STORAGE, Access.READ_WRITE),)
