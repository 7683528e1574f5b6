"""Encoded image features cached by the image's content hash, so a repeated image is not encoded
again. Bounded by a total feature-row budget (least recently used first out); hit, miss and
eviction counts feed /metrics."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class FeatureCacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class ImageFeatureCache:
    """digest -> features [F, H] of one image."""

    def __init__(self, max_rows: int):
        if max_rows < 0:
            raise ValueError("max_rows must be >= 0")
        self._max_rows, self._rows = max_rows, 0
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = FeatureCacheStats()

    def lookup(self, digest: str) -> torch.Tensor | None:
        with self._lock:
            features = self._entries.get(digest)
            if features is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(digest)
            self.stats.hits += 1
            return features

    def store(self, digest: str, features: torch.Tensor) -> None:
        rows = int(features.shape[0])
        with self._lock:
            if rows > self._max_rows or digest in self._entries:
                return
            while self._rows + rows > self._max_rows:
                _, evicted = self._entries.popitem(last=False)
                self._rows -= int(evicted.shape[0])
                self.stats.evictions += 1
            self._entries[digest] = features
            self._rows += rows


def encode_with_cache(cache: ImageFeatureCache, digests, feature_counts, encode) -> torch.Tensor:
    """Features of a request's images in order: cached images reused, the rest encoded in one call.
    `encode(missing_indices)` returns features [sum of their counts, H] of those images in order."""
    cached = [cache.lookup(digest) for digest in digests]
    missing = [i for i, features in enumerate(cached) if features is None]
    if missing:
        fresh = encode(missing).split([feature_counts[i] for i in missing])
        for i, features in zip(missing, fresh):
            cached[i] = features
            cache.store(digests[i], features)
    return torch.cat(cached)
