"""Encoded image features cached by the image's content hash, so a repeated image is not encoded
again.

The cache is one slab of `num_images` slots of `rows_per_image` feature rows each (the largest
image a captured patch capacity holds), allocated once at load on the model's device; storing an
image's features copies them into a slot, evicting the least recently used image when none is
free. So the request path allocates no device memory for cached features. Hit, miss and eviction
counts feed /metrics. Only the model worker thread uses a cache.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import torch

from helios.runtime.loading.defaults import DEFAULT_CACHE_BYTES, DEFAULT_CACHED_IMAGES

FEATURE_BUFFER_INPUT = "image_features"  # the prompt programs' feature buffer (multimodal_spec)


def default_num_images(rows_per_image: int, width: int, element_bytes: int) -> int:
    """DEFAULT_CACHED_IMAGES, or fewer (at least one) when their slots would pass DEFAULT_CACHE_BYTES."""
    slot_bytes = rows_per_image * width * element_bytes
    return max(1, min(DEFAULT_CACHED_IMAGES, DEFAULT_CACHE_BYTES // slot_bytes))


@dataclass
class FeatureCacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class ImageFeatureCache:
    """digest -> features [F, H] of one image (F <= rows_per_image), held in slab slots."""

    def __init__(self, num_images: int, rows_per_image: int, width: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        if num_images < 1 or rows_per_image < 1 or width < 1:
            raise ValueError("an image feature cache needs at least one image slot of one row")
        self.rows_per_image = rows_per_image
        self.slab = torch.zeros(num_images * rows_per_image, width, dtype=dtype, device=device)
        self._entries: OrderedDict[str, tuple[int, int]] = OrderedDict()  # digest -> (slot, rows), LRU first
        self._free: deque[int] = deque(range(num_images))
        self.stats = FeatureCacheStats()

    def __contains__(self, digest: str) -> bool:
        """Whether `digest` is cached (counts neither a hit nor a miss)."""
        return digest in self._entries

    @property
    def num_images(self) -> int:
        return self.slab.shape[0] // self.rows_per_image

    def lookup(self, digest: str) -> torch.Tensor | None:
        """The cached features (a view of the slab, valid until the next `store`), or None."""
        entry = self._entries.get(digest)
        if entry is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(digest)
        self.stats.hits += 1
        return self._view(*entry)

    def store(self, digest: str, features: torch.Tensor) -> torch.Tensor:
        """Copy `features` [F, H] into a slot (the least recently used image's when none is free)
        and return that slot's view (valid until the next `store`)."""
        rows = int(features.shape[0])
        if rows > self.rows_per_image:
            raise ValueError(f"{rows} feature rows; an image slot holds {self.rows_per_image}")
        entry = self._entries.get(digest)
        if entry is None:
            if not self._free:
                _, (slot, _) = self._entries.popitem(last=False)
                self._free.append(slot)
                self.stats.evictions += 1
            entry = (self._free.popleft(), rows)
            self._entries[digest] = entry
        self._entries.move_to_end(digest)
        view = self._view(*entry)
        view.copy_(features)
        return view

    def _view(self, slot: int, rows: int) -> torch.Tensor:
        return self.slab.narrow(0, slot * self.rows_per_image, rows)


def encode_with_cache(cache: ImageFeatureCache, digests, feature_counts, encode) -> torch.Tensor:
    """Features of a request's images in order (a new tensor): cached images reused, the rest
    encoded in one call. `encode(missing_indices)` returns features [sum of their counts, H] of
    those images in order."""
    missing = [i for i, digest in enumerate(digests) if digest not in cache]
    fresh = dict(zip(missing, encode(missing).split([feature_counts[i] for i in missing]))) if missing else {}
    out = []
    for i, digest in enumerate(digests):
        cached = cache.lookup(digest)
        out.append((cached if cached is not None else cache.store(digest, fresh[i])).clone())
    return torch.cat(out)
