"""The typed description of a decoder-only transformer that the generic program is built from.

A recipe turns a checkpoint's configuration into an `Architecture`; the program reads only these
fields, never a model name. `weight_layout(arch)` is the single definition of the ordered weight list
that programs take as their first input: recipes produce tensors in exactly this order and shape.

Weight layout (prepared at ignition time, torch ``nn.Linear`` convention ``[out, in]``):
  embed [V, H]; per layer i: ``layers.i.input_norm`` [H], ``layers.i.qkv.weight`` [(Hq + 2 Hkv) D, H]
  (rows: q, then k, then v), optional ``layers.i.qkv.bias``, optional ``layers.i.q_norm`` /
  ``layers.i.k_norm`` [D], ``layers.i.o.weight`` [H, Hq D], optional ``layers.i.o.bias``,
  ``layers.i.post_norm`` [H], ``layers.i.gate_up.weight`` [2 F, H] (rows: gate, then up), optional
  ``layers.i.gate_up.bias``, ``layers.i.down.weight`` [H, F], optional ``layers.i.down.bias``;
  then ``final_norm`` [H], ``lm_head`` [V, H] unless embeddings are tied, and ``rope.inv_freq``
  [D / 2] float32 (rotary inverse frequencies, scaling already applied by the recipe; a family that
  rotates only part of each head gets zero frequencies for the rest, see `helios.ignition.recipes.moe`).

Mixture-of-experts layers (``arch.moe``, the layers in ``moe.sparse_layers``) replace the gated MLP's
``gate_up`` / ``down`` slots by (E experts, F = ``moe.expert_intermediate_size``):
  ``layers.i.router.weight`` [E, H] float32, optional ``layers.i.router.bias`` [E] float32 (added to the
  logits), optional ``layers.i.router.correction_bias`` [E] float32 (the choice bias of sigmoid routing, or of
  one-group softmax routing: Ernie 4.5 MoE),
  ``layers.i.experts.gate_up`` [E, 2F, H] (per expert rows: gate, then up), optional
  ``layers.i.experts.gate_up_bias`` [E, 2F], ``layers.i.experts.down`` [E, H, F], optional
  ``layers.i.experts.down_bias`` [E, H]; with shared experts (S = ``moe.shared_intermediate_size`` > 0)
  ``layers.i.shared.gate_up.weight`` [2S, H] and ``layers.i.shared.down.weight`` [H, S]; with
  ``moe.shared_gate`` (Qwen2-MoE) also ``layers.i.shared.gate`` [1, H]: the shared expert's output is
  multiplied per token by sigmoid(x . gate) of the block's input x (whole on every tensor-parallel rank,
  so each rank scales its share of the shared expert by the same scalar and the gate stays whole).
  The other layers keep the dense MLP of width ``intermediate_size`` (0 when every layer is sparse).
  Non-gated experts (``moe.activation`` "relu2", Nemotron-H: relu(up x)^2) hold ``layers.i.experts.up``
  [E, F, H] (and ``experts.up_bias`` [E, F]) instead of ``experts.gate_up``, their shared expert
  ``shared.up.weight`` [S, H] instead of ``shared.gate_up.weight``; it and the dense layers are then the
  non-gated MLP (``gated_mlp`` False) of the same activation. With ``moe.latent_size`` L > 0 (Nemotron-H's
  latent experts) the routed experts work in L dims: ``layers.i.latent_in.weight`` [L, H] before the expert
  slots projects their input, ``layers.i.latent_out.weight`` [H, L] after them their weighted sum (the
  router and the shared expert read the layer's input as it is); expert shapes take L for H.

Multi-head latent attention (``latent`` set, DeepSeek-V2/V3): a layer's attention weights are instead
``layers.i.q.weight`` [Hq (Dn + Dr), H] or, with a query rank Q, ``layers.i.q_a.weight`` [Q, H],
``layers.i.q_a_norm`` [Q] and ``layers.i.q_b.weight`` [Hq (Dn + Dr), Q] (per head: Dn no-rotary then
Dr rotary rows); ``layers.i.kv_a.weight`` [C + Dr, H] (rows: the latent, then the shared rotary
key), ``layers.i.kv_a_norm`` [C], ``layers.i.kv_b.weight`` [Hq (Dn + Dv), C] (per head: Dn key rows,
then Dv value rows) and ``layers.i.o.weight`` [H, Hq Dv]. Rotary dims are laid out in halves (a
recipe de-interleaves them), ``head_dim`` is Dr and ``rope.inv_freq`` [Dr / 2]. With ``indexer`` (DeepSeek
Sparse Attention, `helios.ignition.token_indexer`) each query attends only to the positions a
token-selecting indexer picks; its scoring layers hold ``layers.i.indexer.*`` slots after ``o.weight``.

With ``attention_sinks`` each layer also holds ``layers.i.sinks`` [Hq] float32 right after the o
projection's slots: one learned logit per query head in the attention softmax's denominator
(``helios::paged_attention_sinks``). ``rotary_factor`` scales the rotary cos/sin tables
(YaRN's attention factor; 1.0 for none). The ``nope_layers`` attend without rotary embeddings
(their cos/sin tables are 1 and 0); they change no weight slot. With ``qk_norm_after_rotary`` the
q/k norms apply to the rotated queries and keys (HunYuan) instead of before the rotation (Qwen3).

Hybrid decoders (``recurrent``, see `helios.ignition.recurrent_geometry`): the listed layers hold a
recurrent mixer - a Mamba2 mixer or a Gated DeltaNet layer, by the geometry's type - in place of
attention. Their ``mlp_free_layers`` end after the mixer or attention: no ``post_norm`` and no MLP
slots (Nemotron-H's blocks, where a mixer need not be followed by an MLP). With ``parallel_mixer``
(Falcon-H1) every layer holds both: its attention slots (``qkv`` ... ``o``) right after ``input_norm``,
then its mixer's; both read the input norm's output and their outputs are added to the residual.
With ``post_norm_attention`` (OLMo Hybrid) the attention layers have no ``input_norm`` / ``post_norm``
but ``attn_out_norm`` after ``o`` and ``mlp_out_norm`` after the MLP (OLMo 2's block): each output is
normed before the residual adds it; the mixer layers keep their pre-norms.
With ``attention_gate`` (Qwen3-Next, AFMoE; not with latent attention) the attention layers'
``qkv.weight`` / ``qkv.bias`` rows end with Hq D output-gate rows: the attended values are multiplied
by sigmoid(gate) per channel before ``o``.

Sandwich norms (``sandwich_norms``, Gemma 3): each layer also holds ``layers.i.attn_out_norm`` [H]
right before ``post_norm`` and ``layers.i.mlp_out_norm`` [H] after its MLP slots; they norm the
attention and the MLP output before each residual add (``post_norm`` is then the norm before the
MLP). ``local_rope_layers`` rotate with a second table, ``rope.local_inv_freq`` [rotary / 2]
float32, right after ``rope.inv_freq``. ``mlp_activation`` picks the gated MLP's activation,
``embedding_scale`` multiplies looked-up embeddings, ``query_pre_attn_scalar`` (> 0) sets the
attention scale to its inverse square root and ``logit_softcap`` (> 0) caps the logits at
``tanh(logits / c) * c``. ``attention_softcap`` (> 0, Gemma 2) caps every scaled attention score the
same way before the mask and the softmax (``helios::paged_attention_softcap``; plain attention layers
only: not with sinks, latent attention or recurrent mixers); it changes no weight slot.

Without ``pre_norms`` (OLMo 2 / 3) a layer has no norm before its attention or its MLP: no
``layers.i.input_norm`` and no ``layers.i.post_norm`` slot, and the blocks take the residual stream
as it is (``sandwich_norms`` is then required: the output norms are the layer's only norms). With
``qk_norm_whole`` the q/k norms span the whole q and k projections: ``layers.i.q_norm`` [Hq D] and
``layers.i.k_norm`` [Hkv D] instead of [D] (under tensor parallelism each rank holds its heads'
entries and the mean square is summed over the ranks).

Cohere's and StarCoder2's dataflow: with ``layer_norm`` every norm (the layers', the final one and
the q/k norms) is a mean-subtracted LayerNorm (``helios::layer_norm``) of epsilon ``rms_norm_eps``,
not an RMSNorm; with ``norm_bias`` too each norm slot ``X`` is followed by its bias ``X_bias`` [H]
(``layers.i.input_norm_bias``, ``layers.i.post_norm_bias``, ``final_norm_bias``). With
``parallel_block`` a layer has no ``post_norm``: its attention and its MLP both read the
``input_norm`` output and their sum is added to the residual stream at once (under tensor
parallelism both partial outputs are summed by one all-reduce where neither has a bias); with
``parallel_mlp_norm`` too (GPT-NeoX's parallel residual) the MLP reads its own norm of the layer's
input, ``post_norm`` (and ``post_norm_bias``), which the layer then holds after ``o``. With
``qk_norm_heads`` each head has its own q/k norm weights, ``layers.i.q_norm`` [Hq D] and
``layers.i.k_norm`` [Hkv D] (head-major), each head normed over its own D (Cohere's
``use_qk_norm``; under tensor parallelism each rank holds its heads' rows). Without ``gated_mlp``
the MLP is ``down(act(up(x)))``: ``layers.i.up.weight`` [F, H] and optional ``layers.i.up.bias``
[F] replace the ``gate_up`` slots (``mlp_activation`` "gelu_tanh": the tanh-approximated GELU; the
non-gated MLP also takes "gelu", "relu2" and "xielu", `helios.ignition.activations`). An activation
with learned scalars (xielu: 4) adds ``layers.i.mlp_act`` [n] float32 right after the ``up`` slots.
With ``head_bias`` (Phi) ``lm_head_bias`` [vocab_rows] follows the head's slot (``lm_head``, or
``final_norm`` where embeddings are tied): a bias added to the logits (each rank: its rows').

Llama 4's dataflow (none changes a weight slot but the q/k norms'): ``layer_chunks`` (empty, or one
per layer) gives a layer chunked local attention: with chunk c > 0 a query at position p sees the
positions of its own chunk only, [p - p % c, p] (``helios::paged_attention_chunked``). The
``qk_unnormed_layers`` have no q/k norm slots and norm nothing (Llama 4 norms the q/k of its RoPE
layers only). ``query_temperature`` multiplies the queries of its layers at position p by
1 + scale * log1p(floor((p + position_offset) / floor_scale)) (Llama 4's attention temperature tuning
of its NoPE layers, offset 1; Ministral 3's of every layer, offset 0). With ``moe.input_weighted`` each routing weight scales its expert's input instead of
its output: out = sum_k expert_k(w_k x). ``qkv_clip`` (> 0, DBRX) clamps every output of the q/k/v
projection (biases included) to [-qkv_clip, qkv_clip] before the heads are split.

Tensor parallelism: an Architecture with ``tensor_parallel`` N > 1 describes ONE rank of N (see
`helios.ignition.sharding`): heads, key/value heads and the MLP width are that rank's share, the
vocabulary stays whole, and ``embed`` / ``lm_head`` hold the rank's ``vocab_rows`` = ceil(V / N)
vocabulary rows; the layout then ends with ``vocab.start`` int64 [1], the first vocabulary id of
the rank's rows (so one captured program serves every rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from helios.errors import UsageError
from helios.ignition.activations import PARAMETER_COUNTS
from helios.ignition.recurrent_geometry import (GatedDeltaNetGeometry, KimiDeltaGeometry, RecurrentGeometry,
                                                ShortConvGeometry, mixer_slots)
from helios.ignition.token_indexer import TokenIndexer, indexer_slots

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(UsageError):
    """A checkpoint or architecture description that preparation cannot turn into programs."""


ROUTER_SCORINGS = ("softmax", "topk_softmax", "sigmoid", "sparsemixer")  # sparsemixer: helios::moe_route_sparsemixer
EXPERT_ACTIVATIONS = ("silu", "swiglu_clamped", "relu2")  # relu2: non-gated experts (helios::moe_experts)
GATED_ACTIVATIONS = ("silu", "gelu_tanh")  # helios::silu_mul, helios::gelu_tanh_mul
MLP_ACTIVATIONS = GATED_ACTIVATIONS + ("gelu", "relu2", "xielu")  # the non-gated MLP's: helios.ignition.activations


@dataclass(frozen=True)
class MixtureOfExperts:
    """The sparse layers of a mixture-of-experts decoder: routing (``helios::moe_route``, whose
    docstring defines scoring, groups, normalisation and scale) and experts (``helios::moe_experts``)."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int  # per expert (one rank's share under tensor parallelism)
    sparse_layers: tuple[int, ...]  # the layers whose MLP is the mixture; the others are dense
    scoring: str = "softmax"
    num_groups: int = 1
    topk_groups: int = 1
    normalize: bool = True
    scale: float = 1.0
    correction_bias: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"
    alpha: float = 1.0  # swiglu_clamped only
    limit: float = 0.0  # swiglu_clamped only
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_gate: bool = False  # the shared expert's output scaled by sigmoid(x . shared.gate) (Qwen2-MoE)
    jitter_eps: float = 0.0  # sparsemixer only: its masking threshold (PhiMoE's router_jitter_noise)
    input_weighted: bool = False  # each routing weight scales its expert's input, not its output (Llama 4)
    latent_size: int = 0  # > 0: the routed experts work in a latent of this width (Nemotron-H's moe_latent_size)

    @property
    def is_gated(self) -> bool:
        """Gated experts (gate and up rows); a non-gated expert (relu2) has up rows alone."""
        return self.activation != "relu2"

    def __post_init__(self) -> None:
        if self.scoring not in ROUTER_SCORINGS:
            raise CheckpointError(f"router scoring {self.scoring!r} is not one of {ROUTER_SCORINGS}")
        if self.activation not in EXPERT_ACTIVATIONS:
            raise CheckpointError(f"expert activation {self.activation!r} is not one of {EXPERT_ACTIVATIONS}")
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise CheckpointError(f"{self.experts_per_token} experts per token of {self.num_experts}")
        if self.num_groups < 1 or self.num_experts % self.num_groups or not 1 <= self.topk_groups <= self.num_groups:
            raise CheckpointError(f"{self.num_experts} experts do not form {self.num_groups} groups "
                                  f"of which {self.topk_groups} are kept")
        if self.scoring == "sigmoid" and self.num_groups > 1 and self.num_experts < 2 * self.num_groups:
            # helios::moe_route scores a sigmoid group by its best two (a softmax group by its best one)
            raise CheckpointError(f"{self.num_experts} experts in {self.num_groups} groups leave fewer than 2 per group")
        if self.experts_per_token > self.topk_groups * (self.num_experts // self.num_groups):
            raise CheckpointError(f"{self.experts_per_token} experts per token of the {self.topk_groups} kept groups "
                                  f"of {self.num_experts // self.num_groups}")
        if self.expert_intermediate_size < 1 or self.shared_intermediate_size < 0:
            raise CheckpointError("expert widths must be positive")
        if self.scoring == "sparsemixer" and (self.experts_per_token != 2 or self.num_groups != 1 or self.correction_bias
                                             or self.router_bias or not math.isfinite(self.jitter_eps)
                                             or self.jitter_eps < 0):
            raise CheckpointError(f"sparsemixer routing picks 2 experts of one group, with no router or correction "
                                  f"bias and a finite jitter_eps >= 0 (got {self.experts_per_token} experts per token, "
                                  f"jitter_eps {self.jitter_eps})")
        if self.latent_size < 0 or (self.latent_size and self.input_weighted):
            raise CheckpointError(f"latent_size {self.latent_size} must be >= 0 (and not with input_weighted)")
        if self.shared_gate and not self.shared_intermediate_size:
            raise CheckpointError("shared_gate needs a shared expert (shared_intermediate_size > 0)")


@dataclass(frozen=True)
class QueryTemperature:
    """Attention temperature tuning (Llama 4's NoPE layers, every layer of Ministral 3): the queries of
    `layers` at position p are multiplied by log1p(floor((p + position_offset) / floor_scale)) * scale + 1
    before attending (Llama 4 floors p + 1, Ministral 3 p itself)."""

    floor_scale: float
    scale: float
    layers: tuple[int, ...]
    position_offset: float = 1.0

    def factors(self, positions: torch.Tensor) -> torch.Tensor:
        """float32 [T] of int64 positions [T], in the reference's order of operations."""
        shifted = positions.to(torch.float32) + self.position_offset
        return torch.log1p(torch.floor(shifted / self.floor_scale)) * self.scale + 1.0


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention: keys and values are up-projected from a per-token latent of
    `kv_lora_rank` values shared by every head, plus one rotary key of `qk_rope_head_dim` values.

    `scale` is the softmax scale (a recipe's rope scaling may change it), `rope_attention_factor`
    multiplies the rotary cos/sin tables, `norm_eps` is the epsilon of the q/kv latent norms.
    `q_lora_rank` 0: queries are projected from the hidden state directly.
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    scale: float
    q_lora_rank: int = 0
    rope_attention_factor: float = 1.0
    norm_eps: float = 1e-6
    # Bailing hybrid: each head's attended values times sigmoid(x . head_gate row) before o (hybrid decoders only)
    head_gate: bool = False

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class Architecture:
    """Geometry and dataflow switches of a pre-norm decoder with rotary attention and a gated MLP.

    Invariants (checked on construction): heads divide evenly into key/value groups, one window per
    layer (0 = full causal attention, w > 0 = the last w positions including the query's own).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    layer_windows: tuple[int, ...]
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    tensor_parallel: int = 1  # N > 1: this describes one rank's share (see the module docstring)
    # Hybrid decoders: the layers whose attention block is a recurrent mixer (None: none), and the
    # leading head dims that rotary embeddings rotate (0: all of head_dim).
    recurrent: RecurrentGeometry | GatedDeltaNetGeometry | ShortConvGeometry | KimiDeltaGeometry | None = None
    rotary_dim: int = 0
    attention_gate: bool = False  # attention output gated by sigmoid of extra q-sized rows (after q, k and v)
    moe: MixtureOfExperts | None = None
    latent: LatentAttention | None = None  # multi-head latent attention (see the module docstring)
    indexer: TokenIndexer | None = None  # latent attention over the positions an indexer selects
    attention_sinks: bool = False  # a learned per-head logit in every attention softmax (layers.i.sinks)
    rotary_factor: float = 1.0  # multiplies the rotary cos/sin tables (YaRN's attention scaling)
    nope_layers: tuple[int, ...] = ()  # layers whose attention rotates nothing (SmolLM3's NoPE layers)
    qk_norm_after_rotary: bool = False  # the q/k norms follow the rotation (HunYuan), not precede it (Qwen3)
    # Gemma 3's dataflow (see the module docstring); the defaults are every other family's.
    sandwich_norms: bool = False  # attention and MLP outputs normed before their residual adds
    mlp_activation: str = "silu"  # the gated MLP's (and shared experts') activation, one of MLP_ACTIVATIONS
    embedding_scale: float = 1.0  # multiplies looked-up embeddings (Gemma: sqrt(H) rounded to the dtype)
    embedding_norm: bool = False  # the (scaled) embeddings RMS-normed by ``embed_norm`` [H] before layer 0 (NanoChat)
    # JetMoE's mixture of attention heads (0: none): the query heads are attention_experts experts' sets of
    # num_kv_heads heads (head j * E + e is expert e's head j, on key/value head j); each token scales expert e's
    # heads by its routing weight: a softmax over the top attention_experts_per_token logits of
    # ``layers.i.attn_router.weight`` [E, H] float32, 0 for the experts not chosen.
    attention_experts: int = 0
    attention_experts_per_token: int = 0
    query_pre_attn_scalar: float = 0.0  # > 0: the attention scale is its inverse square root (0: head_dim's)
    local_rope_layers: tuple[int, ...] = ()  # layers rotating with rope.local_inv_freq (Gemma's sliding layers)
    logit_softcap: float = 0.0  # > 0: logits are tanh(logits / c) * c
    attention_softcap: float = 0.0  # > 0: attention scores are tanh(s / c) * c before the mask (Gemma 2)
    # OLMo 2's dataflow (see the module docstring); the defaults are every other family's.
    pre_norms: bool = True  # a norm before each attention and MLP block (False: their inputs un-normed)
    qk_norm_whole: bool = False  # the q/k norms span the whole q / k projections, not each head
    # Cohere's and StarCoder2's dataflow (see the module docstring); the defaults are every other family's.
    layer_norm: bool = False  # every norm is a mean-subtracted LayerNorm (helios::layer_norm), not an RMSNorm
    norm_bias: bool = False  # the LayerNorms add a bias (a ``<norm>_bias`` slot after each norm weight)
    parallel_block: bool = False  # attention and MLP both read input_norm's output; no post_norm
    parallel_mlp_norm: bool = False  # with parallel_block: the MLP reads post_norm of the layer's input (GPT-NeoX)
    qk_norm_heads: bool = False  # q/k norm weights per head: [Hq D] / [Hkv D], each head normed over its D
    gated_mlp: bool = True  # False: down(act(up(x))) with an ``up`` projection instead of ``gate_up``
    head_bias: bool = False  # the logits add ``lm_head_bias`` (Phi's lm_head bias)
    # Llama 4's dataflow (see the module docstring); the defaults are every other family's.
    layer_chunks: tuple[int, ...] = ()  # empty, or per layer: 0 unchunked, c > 0 chunked local attention
    qk_unnormed_layers: tuple[int, ...] = ()  # layers without q/k norms (no q_norm / k_norm slots)
    query_temperature: QueryTemperature | None = None  # position-dependent query scaling of some layers
    qkv_clip: float = 0.0  # > 0: the q/k/v projection's outputs clamped to [-c, c] (DBRX's clip_qkv)
    # Nemotron-H's blocks: layers whose attention or mixer has no MLP after it (hybrid decoders only)
    mlp_free_layers: tuple[int, ...] = ()  # no post_norm and no MLP slots: the layer ends after its mixer
    # Falcon-H1's layers: attention and a Mamba2 mixer side by side (every layer both), outputs added
    parallel_mixer: bool = False
    # OLMo Hybrid's attention layers: no pre-norms, norms on the attention's and the MLP's outputs
    # (``attn_out_norm`` / ``mlp_out_norm``); its mixer layers keep the pre-norms (hybrid decoders only)
    post_norm_attention: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if len(self.layer_windows) != self.num_layers:
            raise CheckpointError(f"{len(self.layer_windows)} layer windows for {self.num_layers} layers")
        if any(window < 0 for window in self.layer_windows):
            raise CheckpointError("layer windows must be >= 0")
        if self.dtype not in _DTYPES:
            raise CheckpointError(f"dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.head_dim % 2:
            raise CheckpointError("rotary attention needs an even head_dim")
        if self.tensor_parallel < 1:
            raise CheckpointError("tensor_parallel must be >= 1")
        if self.latent is not None and (self.head_dim != self.latent.qk_rope_head_dim or
                                        self.num_kv_heads != self.num_heads):
            raise CheckpointError("latent attention needs head_dim == qk_rope_head_dim and one key head per head")
        if self.indexer is not None and self.indexer.problems(self):
            raise CheckpointError("; ".join(self.indexer.problems(self)))
        if self.rotary_dim < 0 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise CheckpointError(f"rotary_dim {self.rotary_dim} must be even and at most head_dim {self.head_dim}")
        if self.recurrent is not None:
            problems = self.recurrent.problems(self.num_layers)
            if problems or not self.attention_layers:
                raise CheckpointError("; ".join(problems or ["a hybrid decoder needs at least one attention layer"]))
        if self.embedding_norm and self.recurrent is not None:
            raise CheckpointError("embedding_norm: only the plain decoder norms its embeddings")
        if self.attention_experts and (self.num_heads != self.attention_experts * self.num_kv_heads
                                       or not 1 <= self.attention_experts_per_token <= self.attention_experts
                                       or self.latent is not None or self.recurrent is not None
                                       or self.attention_gate):
            raise CheckpointError(f"attention_experts {self.attention_experts} (top "
                                  f"{self.attention_experts_per_token}) needs num_heads = experts x num_kv_heads of "
                                  f"plain, ungated attention layers")
        if self.latent is not None and self.latent.head_gate and self.recurrent is None:
            raise CheckpointError("latent head_gate: only a hybrid decoder's latent attention gates its heads")
        if self.attention_gate and (self.latent is not None or self.qkv_clip):
            raise CheckpointError("attention_gate: latent attention and clamped q/k/v do not gate their output")
        if self.qk_norm_after_rotary and (not self.qk_norm or self.latent is not None or self.recurrent is not None):
            raise CheckpointError("qk_norm_after_rotary needs q/k norms of plain attention layers")
        if self.nope_layers and (not set(self.nope_layers) <= set(range(self.num_layers))
                                 or self.latent is not None or self.recurrent is not None):
            raise CheckpointError(f"NoPE layers {self.nope_layers} need plain attention layers of {self.num_layers}")
        if self.moe is not None and not set(self.moe.sparse_layers) <= set(range(self.num_layers)):
            raise CheckpointError(f"sparse layers {self.moe.sparse_layers} are not layers of {self.num_layers}")
        self._check_dataflow()
        # Derived from config.json arithmetic (rope and YaRN scaling), so checked: a NaN here is NaN logits.
        scales = {"rms_norm_eps": self.rms_norm_eps, "rotary_factor": self.rotary_factor}
        if self.latent is not None:
            scales |= {"latent scale": self.latent.scale,
                       "latent rope_attention_factor": self.latent.rope_attention_factor}
        if self.moe is not None:
            scales |= {"router scale": self.moe.scale}
        bad = {name: value for name, value in scales.items() if not math.isfinite(value)}
        if bad:
            raise CheckpointError(f"config.json yields non-finite {bad}")

    def _check_dataflow(self) -> None:
        """The Gemma-style switches: each bad value a CheckpointError naming its field."""
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise CheckpointError(f"mlp_activation {self.mlp_activation!r} is not one of {MLP_ACTIVATIONS}")
        if self.gated_mlp and self.mlp_activation not in GATED_ACTIVATIONS:
            raise CheckpointError(f"mlp_activation {self.mlp_activation!r} is for a non-gated MLP (gated: "
                                  f"{GATED_ACTIVATIONS})")
        bounds = {"embedding_scale": (self.embedding_scale, 0.0, False),
                  "query_pre_attn_scalar": (self.query_pre_attn_scalar, 0.0, True),
                  "logit_softcap": (self.logit_softcap, 0.0, True),
                  "attention_softcap": (self.attention_softcap, 0.0, True),
                  "qkv_clip": (self.qkv_clip, 0.0, True)}
        for name, (value, low, zero) in bounds.items():
            if not (math.isfinite(value) and (value > low or (zero and value == low))):
                raise CheckpointError(f"{name} {value} must be finite and {'>=' if zero else '>'} {low}")
        if self.local_rope_layers and (not set(self.local_rope_layers) <= set(range(self.num_layers))
                                       or set(self.local_rope_layers) & set(self.nope_layers)
                                       or self.latent is not None or self.recurrent is not None):
            raise CheckpointError(f"local_rope_layers {self.local_rope_layers} need rotary attention layers of "
                                  f"{self.num_layers}")
        if self.attention_softcap and (self.attention_sinks or self.latent is not None or self.recurrent is not None):
            raise CheckpointError("attention_softcap needs plain attention layers without sinks (no latent attention, "
                                  "no recurrent mixers)")
        if self.sandwich_norms and self.recurrent is not None:
            raise CheckpointError("sandwich_norms: a hybrid decoder's layers have no sandwich norms")
        if not self.pre_norms and not self.sandwich_norms:
            raise CheckpointError("pre_norms False needs sandwich_norms (the layers would have no norm)")
        if self.qk_norm_whole and (not self.qk_norm or self.qk_norm_after_rotary or self.latent is not None):
            raise CheckpointError("qk_norm_whole needs q/k norms before the rotation of plain attention layers")
        self._check_layer_norms()

    def _check_layer_norms(self) -> None:
        """Cohere's and StarCoder2's switches: only the dataflow the programs implement with them."""
        if self.layer_norm and (self.recurrent is not None or self.latent is not None or self.sandwich_norms
                                or not self.pre_norms or self.qk_norm_whole or self.qk_norm_after_rotary):
            raise CheckpointError("layer_norm needs pre-norm plain attention layers without sandwich norms or "
                                  "whole / after-rotary q/k norms")
        if self.norm_bias and not self.layer_norm:
            raise CheckpointError("norm_bias needs layer_norm (RMS norms have no bias)")
        if self.qk_norm_heads and not (self.qk_norm and self.layer_norm):
            raise CheckpointError("qk_norm_heads needs q/k norms that are layer norms")
        if self.parallel_block and (not self.pre_norms or self.sandwich_norms or self.recurrent is not None):
            raise CheckpointError("parallel_block needs pre-norm layers without sandwich norms or recurrent mixers")
        if self.parallel_mlp_norm and not self.parallel_block:
            raise CheckpointError("parallel_mlp_norm needs parallel_block (a sequential MLP reads post_norm anyway)")
        if self.moe is not None and not self.gated_mlp and (self.moe.is_gated
                                                            or self.mlp_activation != self.moe.activation):
            raise CheckpointError("gated_mlp False with experts: only beside non-gated experts of the MLP's "
                                  "activation (their shared expert and dense layers take it)")
        if self.moe is not None and not self.moe.is_gated and self.gated_mlp:
            raise CheckpointError(f"non-gated {self.moe.activation} experts need the non-gated MLP (gated_mlp False)")
        if self.parallel_mixer and not (isinstance(self.recurrent, RecurrentGeometry)
                                        and set(self.recurrent.layers) == set(range(self.num_layers))):
            raise CheckpointError("parallel_mixer needs a Mamba2 mixer in every layer (recurrent.layers: all)")
        if self.post_norm_attention and (self.recurrent is None or self.parallel_mixer or not self.pre_norms
                                         or self.mlp_free_layers):
            raise CheckpointError("post_norm_attention needs a hybrid decoder whose mixer layers have pre-norms and "
                                  "MLPs (no parallel_mixer, no mlp_free_layers)")
        if self.mlp_free_layers and (self.recurrent is None or not set(self.mlp_free_layers) <= set(range(
                self.num_layers)) or any(self.is_sparse(layer) for layer in self.mlp_free_layers)):
            raise CheckpointError(f"mlp_free_layers {self.mlp_free_layers} must be dense layers of a hybrid decoder "
                                  f"of {self.num_layers} layers")
        self._check_chunks()

    def _check_chunks(self) -> None:
        """Llama 4's switches: only the dataflow the programs implement with them."""
        layers = set(range(self.num_layers))
        plain = self.latent is None and self.recurrent is None
        if self.layer_chunks:
            if len(self.layer_chunks) != self.num_layers or any(chunk < 0 for chunk in self.layer_chunks):
                raise CheckpointError(f"layer_chunks {self.layer_chunks} must hold one chunk >= 0 per layer of "
                                      f"{self.num_layers}")
            chunked = [layer for layer, chunk in enumerate(self.layer_chunks) if chunk]
            if chunked and (not plain or self.attention_sinks or self.attention_softcap
                            or any(self.layer_windows[layer] for layer in chunked)):
                raise CheckpointError("layer_chunks: chunked layers need plain attention without sinks, a soft cap "
                                      "or a sliding window (no latent attention, no recurrent mixers)")
        if self.qk_unnormed_layers and (not self.qk_norm or not set(self.qk_unnormed_layers) <= layers
                                        or self.qk_norm_whole or self.qk_norm_heads or not plain):
            raise CheckpointError(f"qk_unnormed_layers {self.qk_unnormed_layers} need per-head q/k norms of plain "
                                  f"attention layers of {self.num_layers}")
        temperature = self.query_temperature
        if temperature is not None:
            finite = all(math.isfinite(value) for value in (temperature.floor_scale, temperature.scale,
                                                            temperature.position_offset))
            if not finite or temperature.floor_scale <= 0 or not set(temperature.layers) <= layers or not plain:
                raise CheckpointError(f"query_temperature {temperature} needs a finite positive floor_scale, a finite "
                                      f"scale and plain attention layers of {self.num_layers}")
        if self.qkv_clip and (self.latent is not None or self.recurrent is not None):
            raise CheckpointError("qkv_clip needs plain attention layers (no latent attention, no recurrent mixers)")
        if self.moe is not None and self.moe.input_weighted and self.moe.activation != "silu":
            raise CheckpointError("moe.input_weighted: only silu experts take weighted inputs")

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the layers with an attention block (every layer unless `recurrent` says otherwise;
        every layer beside its mixer under `parallel_mixer`)."""
        mixers = set(self.recurrent.layers) if self.recurrent is not None and not self.parallel_mixer else set()
        return tuple(layer for layer in range(self.num_layers) if layer not in mixers)

    @property
    def rotary_width(self) -> int:
        return self.rotary_dim or self.head_dim

    def is_rotary(self, layer: int) -> bool:
        """Whether `layer`'s attention rotates its queries and keys (every layer but `nope_layers`)."""
        return layer not in self.nope_layers

    @property
    def layer_extents(self) -> tuple[int, ...]:
        """Per layer, how many of the latest positions its attention reads (0: every one): its window, or its
        chunk (a chunked query reads at most chunk - 1 positions back): what the cache must keep for it."""
        return tuple(window or self.layer_chunk(layer) for layer, window in enumerate(self.layer_windows))

    def is_qk_normed(self, layer: int) -> bool:
        """Whether `layer` norms its queries and keys (``qk_norm``, but not the ``qk_unnormed_layers``)."""
        return self.qk_norm and layer not in self.qk_unnormed_layers

    def layer_chunk(self, layer: int) -> int:
        """`layer`'s attention chunk (0: unchunked; see ``layer_chunks``)."""
        return self.layer_chunks[layer] if self.layer_chunks else 0

    def is_sparse(self, layer: int) -> bool:
        """Whether `layer`'s MLP is the mixture of experts."""
        return self.moe is not None and layer in self.moe.sparse_layers

    @property
    def has_dense_mlp(self) -> bool:
        """Whether some layer holds the dense MLP of ``intermediate_size`` (neither sparse nor MLP-free):
        where none does, that width sizes no weight."""
        return any(not self.is_sparse(layer) and layer not in self.mlp_free_layers for layer in range(self.num_layers))

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        if self.latent is not None:
            return self.latent.scale
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def rope_attention_factor(self) -> float:
        return self.rotary_factor if self.latent is None else self.latent.rope_attention_factor

    @property
    def attention_out_size(self) -> int:
        """Input width of ``o.weight``: the attended values of this rank's heads."""
        return self.q_size if self.latent is None else self.num_heads * self.latent.v_head_dim

    @property
    def vocab_rows(self) -> int:
        """Vocabulary rows of ``embed`` / ``lm_head`` held by one rank: ceil(V / tensor_parallel)."""
        return -(-self.vocab_size // self.tensor_parallel)


@dataclass(frozen=True)
class WeightSlot:
    """One entry of the program's weight list: its name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def weight_layout(arch: Architecture) -> tuple[WeightSlot, ...]:
    """The ordered weight list every program of `arch` takes as its first input."""
    slots = [_slot("embed", arch, arch.vocab_rows, arch.hidden_size)]
    if arch.embedding_norm:
        slots.append(_slot("embed_norm", arch, arch.hidden_size))
    mixers = set(arch.recurrent.layers) if arch.recurrent is not None else set()
    for layer in range(arch.num_layers):
        prefix = f"layers.{layer}."
        slots += (_mixer_layer_slots(arch, prefix) if layer in mixers
                  else _layer_slots(arch, prefix, post_only=arch.post_norm_attention))
    slots += _norm_slots(arch, "final_norm")
    if not arch.tie_word_embeddings:
        slots.append(_slot("lm_head", arch, arch.vocab_rows, arch.hidden_size))
    if arch.head_bias:
        slots.append(_slot("lm_head_bias", arch, arch.vocab_rows))
    slots.append(WeightSlot("rope.inv_freq", (arch.rotary_width // 2,), "float32"))
    if arch.local_rope_layers:
        slots.append(WeightSlot("rope.local_inv_freq", (arch.rotary_width // 2,), "float32"))
    if arch.tensor_parallel > 1:
        slots.append(WeightSlot("vocab.start", (1,), "int64"))
    return tuple(slots)


def _norm_slots(arch: Architecture, name: str) -> list[WeightSlot]:
    """A norm's weight [H], and its bias [H] under ``norm_bias``."""
    return [_slot(name, arch, arch.hidden_size)] + ([_slot(name + "_bias", arch, arch.hidden_size)]
                                                    if arch.norm_bias else [])


def _layer_slots(arch: Architecture, prefix: str, post_only: bool = False) -> list[WeightSlot]:
    """An attention layer's slots; `post_only` (``post_norm_attention``): output norms, no pre-norms."""
    hidden = arch.hidden_size
    pre_norms, sandwich_norms = arch.pre_norms and not post_only, arch.sandwich_norms or post_only
    slots = _norm_slots(arch, prefix + "input_norm") if pre_norms else []
    slots += _attention_slots(arch, prefix) if arch.latent is None else _latent_slots(arch, prefix)
    if sandwich_norms:
        slots.append(_slot(prefix + "attn_out_norm", arch, hidden))
    layer = int(prefix.split(".")[1])
    if layer in arch.mlp_free_layers:
        return slots
    if pre_norms and (not arch.parallel_block or arch.parallel_mlp_norm):
        slots += _norm_slots(arch, prefix + "post_norm")
    slots += _moe_slots(arch, prefix) if arch.is_sparse(layer) else _mlp_slots(arch, prefix)
    return slots + ([_slot(prefix + "mlp_out_norm", arch, hidden)] if sandwich_norms else [])


def _latent_slots(arch: Architecture, prefix: str) -> list[WeightSlot]:
    latent, hidden, heads = arch.latent, arch.hidden_size, arch.num_heads
    q_rows = heads * latent.qk_head_dim
    if latent.q_lora_rank:
        slots = [_slot(prefix + "q_a.weight", arch, latent.q_lora_rank, hidden),
                 _slot(prefix + "q_a_norm", arch, latent.q_lora_rank),
                 _slot(prefix + "q_b.weight", arch, q_rows, latent.q_lora_rank)]
    else:
        slots = [_slot(prefix + "q.weight", arch, q_rows, hidden)]
    return slots + [
        _slot(prefix + "kv_a.weight", arch, latent.kv_lora_rank + latent.qk_rope_head_dim, hidden),
        _slot(prefix + "kv_a_norm", arch, latent.kv_lora_rank),
        _slot(prefix + "kv_b.weight", arch, heads * (latent.qk_nope_head_dim + latent.v_head_dim), latent.kv_lora_rank),
        *([_slot(prefix + "head_gate.weight", arch, heads, hidden)] if latent.head_gate else []),
        _slot(prefix + "o.weight", arch, hidden, arch.attention_out_size),
    ] + indexer_slots(arch, int(prefix.split(".")[1]), lambda name, *shape: _slot(name, arch, *shape), WeightSlot)


def _attention_slots(arch: Architecture, prefix: str) -> list[WeightSlot]:
    layer = int(prefix.split(".")[1])
    qkv_rows = arch.q_size * (2 if arch.attention_gate else 1) + 2 * arch.kv_size  # output-gate rows last
    hidden = arch.hidden_size
    slots = [_slot(prefix + "qkv.weight", arch, qkv_rows, hidden)]
    if arch.qkv_bias:
        slots.append(_slot(prefix + "qkv.bias", arch, qkv_rows))
    if arch.is_qk_normed(layer):
        whole = arch.qk_norm_whole or arch.qk_norm_heads
        q_width, k_width = (arch.q_size, arch.kv_size) if whole else (arch.head_dim, arch.head_dim)
        slots += [_slot(prefix + "q_norm", arch, q_width), _slot(prefix + "k_norm", arch, k_width)]
    slots.append(_slot(prefix + "o.weight", arch, hidden, arch.q_size))
    if arch.o_bias:
        slots.append(_slot(prefix + "o.bias", arch, hidden))
    if arch.attention_sinks:
        slots.append(WeightSlot(prefix + "sinks", (arch.num_heads,), "float32"))
    if arch.attention_experts:
        slots.append(WeightSlot(prefix + "attn_router.weight", (arch.attention_experts, hidden), "float32"))
    return slots


def _mlp_slots(arch: Architecture, prefix: str) -> list[WeightSlot]:
    hidden, ff = arch.hidden_size, arch.intermediate_size
    first, rows = ("gate_up", 2 * ff) if arch.gated_mlp else ("up", ff)
    slots = [_slot(prefix + first + ".weight", arch, rows, hidden)]
    if arch.mlp_bias:
        slots.append(_slot(prefix + first + ".bias", arch, rows))
    if arch.mlp_activation in PARAMETER_COUNTS:  # the activation's learned scalars (xielu)
        slots.append(WeightSlot(prefix + "mlp_act", (PARAMETER_COUNTS[arch.mlp_activation],), "float32"))
    slots.append(_slot(prefix + "down.weight", arch, hidden, ff))
    if arch.mlp_bias:
        slots.append(_slot(prefix + "down.bias", arch, hidden))
    return slots


def _mixer_layer_slots(arch: Architecture, prefix: str) -> list[WeightSlot]:
    """A recurrent layer: the mixer (`helios.ignition.recurrent_geometry`) instead of attention."""
    def slot(name: str, *shape: int, dtype: str | None = None) -> WeightSlot:
        return WeightSlot(name, tuple(shape), dtype or arch.dtype)

    attention = _layer_slots(arch, prefix)
    post = next((i for i, s in enumerate(attention) if s.name == prefix + "post_norm"), len(attention))
    beside = attention[1:post] if arch.parallel_mixer else []  # Falcon-H1: the attention's slots, then the mixer's
    return [attention[0], *beside, *mixer_slots(arch, prefix, slot), *attention[post:]]


def _moe_slots(arch: Architecture, prefix: str) -> list[WeightSlot]:
    moe, hidden = arch.moe, arch.hidden_size
    experts, ff, shared = moe.num_experts, moe.expert_intermediate_size, moe.shared_intermediate_size
    slots = [WeightSlot(prefix + "router.weight", (experts, hidden), "float32")]
    if moe.router_bias:
        slots.append(WeightSlot(prefix + "router.bias", (experts,), "float32"))
    if moe.correction_bias:
        slots.append(WeightSlot(prefix + "router.correction_bias", (experts,), "float32"))
    width = moe.latent_size or hidden  # the experts' input and output width
    if moe.latent_size:
        slots.append(_slot(prefix + "latent_in.weight", arch, width, hidden))
    first, rows = ("experts.gate_up", 2 * ff) if moe.is_gated else ("experts.up", ff)  # non-gated: up rows alone
    slots.append(_slot(prefix + first, arch, experts, rows, width))
    if moe.expert_bias:
        slots.append(_slot(prefix + first + "_bias", arch, experts, rows))
    slots.append(_slot(prefix + "experts.down", arch, experts, width, ff))
    if moe.expert_bias:
        slots.append(_slot(prefix + "experts.down_bias", arch, experts, width))
    if moe.latent_size:
        slots.append(_slot(prefix + "latent_out.weight", arch, hidden, width))
    if shared:
        first, rows = ("shared.gate_up.weight", 2 * shared) if moe.is_gated else ("shared.up.weight", shared)
        slots += [_slot(prefix + first, arch, rows, hidden), _slot(prefix + "shared.down.weight", arch, hidden, shared)]
    if moe.shared_gate:
        slots.append(_slot(prefix + "shared.gate", arch, 1, hidden))
    return slots


def _slot(name: str, arch: Architecture, *shape: int) -> WeightSlot:
    return WeightSlot(name, tuple(shape), arch.dtype)
