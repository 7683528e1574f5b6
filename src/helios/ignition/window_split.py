"""Sliding-window layers in a page-id space of their own (gpt-oss: sliding and full layers alternate).

A decoder that mixes sliding-window and full-attention layers keeps two paged history regions:

- ``attention`` (PAGED_KEY_VALUE): ``k_cache``/``v_cache`` [full layers, pages, page_tokens, Hkv, D],
  indexed by ``page_table``; every page is kept while the request runs;
- ``window`` (SLIDING_WINDOW, ``window_tokens`` = the widest layer window): ``window_k_cache``/
  ``window_v_cache`` [sliding layers, window_pages, page_tokens, Hkv, D], sized by the WINDOW_PAGES
  load extent and indexed by ``window_page_table`` with page ids of their own. The runtime allocates
  them from their own pool and releases the pages that fall out of the window.

Both tables map the same logical pages (entry i covers positions [i * page_tokens, (i + 1) *
page_tokens)); a sliding layer writes and reads its keys through the window table, a full layer
through the full one. Chunked layers (`Architecture.layer_chunks`, Llama 4's) keep their keys in the window
region too, as layers whose window is their chunk (`Architecture.layer_extents`): a chunked query reads
at most chunk - 1 positions back, so no page it reads falls out. Cores with a draft model, an image encoder, latent attention or recurrent
mixers keep one region (`window_tokens` returns 0): their programs are not built for the split.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from helios.ignition.architecture import Architecture

WINDOW_INPUTS = ("window_k_cache", "window_v_cache", "window_page_table")
WINDOW_REGION = "window"


def window_tokens(arch: Architecture, options=None) -> int:
    """The split window's extent (tokens), or 0 when `arch` keeps one paged region (see the module):
    `options` (the core's `ProgramOptions`) with a draft model or a multimodal encoder keeps one."""
    windows = [arch.layer_extents[layer] for layer in arch.attention_layers]
    mixed = any(w > 0 for w in windows) and any(w == 0 for w in windows)
    extras = options is not None and (options.draft is not None or options.multimodal is not None)
    if not mixed or extras or arch.latent is not None or arch.recurrent is not None:
        return 0
    return max(windows)


def window_input_specs(arch: Architecture, page_tokens: int, options) -> tuple:
    """The programs' inputs of the window region (last): its two planes [sliding layers, window_pages,
    page_tokens, Hkv, D] (WINDOW_PAGES) and its page table; none without a split."""
    from helios.ignition.program_spec import Access, InputRole, TensorSpec

    if not window_tokens(arch, options):
        return ()
    shape = (len(sliding_layers(arch)), "window_pages", page_tokens, arch.num_kv_heads, arch.head_dim)
    return (*(TensorSpec(name, arch.dtype, shape, InputRole.CACHE_STORAGE, Access.READ_WRITE)
              for name in WINDOW_INPUTS[:2]),
            TensorSpec(WINDOW_INPUTS[2], "int32", ("request_rows", "max_pages"), InputRole.STEP_INPUT))


def sliding_layers(arch: Architecture) -> tuple[int, ...]:
    return tuple(layer for layer in arch.attention_layers if arch.layer_extents[layer] > 0)


def full_layers(arch: Architecture) -> tuple[int, ...]:
    return tuple(layer for layer in arch.attention_layers if arch.layer_extents[layer] == 0)


class WindowStorage(NamedTuple):
    """One step's view of the window region: its planes and the step's rows of its page table."""

    k_cache: torch.Tensor  # [sliding layers, window_pages, page_tokens, Hkv, D]
    v_cache: torch.Tensor
    page_table: torch.Tensor  # int32 [R, max_pages]: the step's rows
    slot_mapping: torch.Tensor  # int64 [T]: each packed token's flat slot in the window planes


def layer_storage(arch: Architecture, layer: int, k_cache, v_cache, step, window: WindowStorage | None):
    """(key plane, value plane, page-table rows, slot mapping) `layer` attends and writes through."""
    if window is None:
        return k_cache[layer], v_cache[layer], step.page_table, step.slot_mapping
    windows = arch.layer_extents
    if windows[layer] > 0:
        index = sum(1 for earlier in arch.attention_layers if earlier < layer and windows[earlier] > 0)
        return window.k_cache[index], window.v_cache[index], window.page_table, window.slot_mapping
    index = sum(1 for earlier in arch.attention_layers if earlier < layer and windows[earlier] == 0)
    return k_cache[index], v_cache[index], step.page_table, step.slot_mapping
