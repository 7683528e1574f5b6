"""The execution ABI: generic `helios::*` custom ops that captured programs call.

Importing this package registers every op (CPU reference implementations; CUDA kernels where
present), so loading a program that uses them can validate their schemas.
"""

from helios.abi import attention, attention_sinks, collectives, completion, grammar, latent_attention, moe  # noqa: F401  (registers ops)
from helios.abi import fused, recurrent, rng, sampling, speculative, token_logprobs, tuning  # noqa: F401  (registers ops)
from helios.abi import delta_rule, fresh_attention, reduce_norm, rotary_attention  # noqa: F401  (registers ops)
from helios.abi import layer_norm, vocab_shards  # noqa: F401  (registers ops)
from helios.abi import attention_softcap  # noqa: F401  (registers ops)
from helios.abi import sparse_index  # noqa: F401  (registers ops)
from helios.abi import attention_chunked  # noqa: F401  (registers ops)
from helios.abi import moe_sparsemixer  # noqa: F401  (registers ops)
