"""Read a Hugging Face checkpoint directory: config.json and tensors from *.safetensors only.

Tensors are read lazily, one at a time, through safetensors (never pickle), so preparing a large model
does not hold the raw checkpoint and the prepared weights in memory at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open

from helios.ignition.architecture import CheckpointError


SIDE_TABLE = "engram.safetensors"  # helios.ignition.engram.ENGRAM_FILE


class CheckpointTensors:
    """Name -> tensor access over every *.safetensors file of a directory (read only), except
    ``engram.safetensors``: an n-gram table beside the model (`helios.ignition.engram`)."""

    def __init__(self, files_by_name: Mapping[str, Path]):
        self._files_by_name = dict(files_by_name)

    @classmethod
    def open(cls, directory: Path) -> "CheckpointTensors":
        files = sorted(path for path in directory.glob("*.safetensors") if path.name != SIDE_TABLE)
        if not files:
            raise CheckpointError(f"{directory} has no *.safetensors files (other weight formats are not read)")
        files_by_name: dict[str, Path] = {}
        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    if name in files_by_name:
                        raise CheckpointError(f"tensor {name} appears in {files_by_name[name].name} and {path.name}")
                    files_by_name[name] = path
        return cls(files_by_name)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._files_by_name)

    def __contains__(self, name: str) -> bool:
        return name in self._files_by_name

    def header(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype string such as "F8_E4M3", shape) of a tensor, read without its data."""
        path = self._files_by_name.get(name)
        if path is None:
            raise CheckpointError(f"the checkpoint has no tensor {name}")
        with safe_open(str(path), framework="pt") as handle:
            view = handle.get_slice(name)
            return view.get_dtype(), tuple(view.get_shape())

    def get(self, name: str) -> torch.Tensor:
        path = self._files_by_name.get(name)
        if path is None:
            raise CheckpointError(f"the checkpoint has no tensor {name}")
        with safe_open(str(path), framework="pt") as handle:
            return handle.get_tensor(name)


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from error
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return config
