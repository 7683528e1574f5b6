"""Read a Hugging Face checkpoint directory: config.json and tensors from safetensors files only:
``model.safetensors``, else the shards ``model.safetensors.index.json`` names (as transformers reads them).

Tensors are read lazily, one at a time, through safetensors (never pickle), so preparing a large model
does not hold the raw checkpoint and the prepared weights in memory at once.

Everything here is untrusted input: a malformed safetensors file (header, offsets, dtype), a shard
that is not a regular file, a `model.safetensors.index.json` that names an absent shard or a path
outside the directory, a weight of an integer dtype or holding NaN/Inf, and a config.json that is
not strict JSON each raise `CheckpointError` naming the file and the tensor, as does a tensor larger
than the memory available (checked before it is read: a sparse file) or a config or index larger
than `MAX_JSON_NBYTES`. Non-finite weights are refused rather than served: no checkpoint trained to
completion holds them, and one that does would answer every request with NaN logits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from safetensors import SafetensorError, safe_open

from helios.core.streams import available_memory_nbytes
from helios.ignition.architecture import CheckpointError


WEIGHTS_FILE = "model.safetensors"  # transformers' SAFE_WEIGHTS_NAME
INDEX_FILE = "model.safetensors.index.json"
EXPLICIT_WEIGHTS = "transformers_weights"  # config.json's name of the weights file, where model.safetensors is taken
# A config.json is kilobytes and a shard index about 100 bytes a tensor (megabytes for the largest models):
# a larger file is damaged or sparse, refused before it is read whole.
MAX_JSON_NBYTES = 64 << 20
# Weights are floating point; float8 ones are dequantized by `fp8_blocks`.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
_DTYPE_NBYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_FINITE_CHUNK = 1 << 22  # elements summed at once by the finiteness check
PROGRESS_NBYTES = 1 << 30  # a smaller checkpoint is read in seconds: no progress lines


class CheckpointTensors:
    """Name -> tensor access over a checkpoint's weight files (read only): ``model.safetensors``, or
    the shards its index names. (``engram.safetensors`` beside them is an n-gram table,
    `helios.ignition.engram`.)

    `progress`, where given, gets a line at each tenth of the tensors' bytes read from a checkpoint of
    `PROGRESS_NBYTES` or more: a large one is read for minutes before anything else is reported."""

    def __init__(self, files_by_name: Mapping[str, Path], progress: Callable[[str], None] | None = None):
        self._files_by_name = dict(files_by_name)
        self._progress = progress
        self._total_nbytes = 0 if progress is None else sum(map(_data_nbytes, set(self._files_by_name.values())))
        self._read_nbytes = 0
        self._reported_tenths = 0

    @classmethod
    def open(cls, directory: Path, progress: Callable[[str], None] | None = None) -> "CheckpointTensors":
        """The tensors of `directory`'s ``model.safetensors``, else of the shards its shard index names:
        the files transformers reads, in its order (``from_pretrained`` takes ``model.safetensors``
        where both are there, and never opens the index). Any other *.safetensors file is not read (a
        Mistral repository holds its weights twice: the shards, and consolidated.safetensors in
        Mistral's own names; a folder may hold an adapter or a copy beside the model, whose tensors
        were read as the model's). config.json's ``transformers_weights``, where it is set, names the
        one file (or shard index) to read instead, as transformers reads it (`_weight_files`)."""
        weights, index = _weight_files(directory)
        has_weights = weights is not None and (directory / weights).is_file()
        weight_map = _read_index(directory, index) if index is not None and not has_weights else None
        if weight_map is not None:
            files = [directory / shard for shard in sorted(set(weight_map.values()))]
        elif weights is not None and ((directory / weights).exists() or (directory / weights).is_symlink()):
            files = [directory / weights]
        elif (weights, index) == (WEIGHTS_FILE, INDEX_FILE):
            raise CheckpointError(f"{directory} has neither {WEIGHTS_FILE} nor {INDEX_FILE} (other weight "
                                  f"formats are not read)")
        else:
            raise CheckpointError(f"{directory} has no {weights or index}, which config.json's {EXPLICIT_WEIGHTS} "
                                  f"names as its weights")
        files_by_name: dict[str, Path] = {}
        for path in files:
            if not path.is_file():  # a FIFO would block the read forever
                raise CheckpointError(f"{path} is not a regular file")
            for name in _read(path, None, lambda handle: handle.keys()):
                if name in files_by_name:
                    raise CheckpointError(f"tensor {name} appears in {files_by_name[name].name} and {path.name}")
                files_by_name[name] = path
        if weight_map is not None:
            _check_index(weight_map, files_by_name, index)
        return cls(files_by_name, progress)

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
        view = _read(path, name, lambda handle: handle.get_slice(name))
        return view.get_dtype(), tuple(view.get_shape())

    def get(self, name: str) -> torch.Tensor:
        """The tensor, read from its file; a weight that is not floating point or not finite raises."""
        path = self._files_by_name.get(name)
        if path is None:
            raise CheckpointError(f"the checkpoint has no tensor {name}")
        tensor = _read(path, name, lambda handle: checked_tensor(handle, path, name))
        if not is_finite(tensor):
            raise CheckpointError(f"tensor {name} in {path.name} holds NaN or infinite values")
        self._count_read(tensor)
        return tensor

    def _count_read(self, tensor: torch.Tensor) -> None:
        if self._progress is None or self._total_nbytes < PROGRESS_NBYTES:
            return
        self._read_nbytes += tensor.numel() * tensor.element_size()
        tenths = min(10, self._read_nbytes * 10 // self._total_nbytes)  # a tensor read twice counts twice
        if tenths > self._reported_tenths:
            self._reported_tenths = tenths
            self._progress(f"read {10 * tenths}% of the checkpoint's {self._total_nbytes / 1e9:.1f} GB of weights")


def checked_tensor(handle, path: Path, name: str) -> torch.Tensor:
    """The tensor `name` of the open file, its header checked first: a weight is floating point, and
    no larger than the memory available. (Its file covers what its header claims, which safetensors
    checks, but a sparse file, a download preallocated and cut short or one made so, covers terabytes
    with holes, which reading would allocate in full before a recipe compares the shape with the config.)"""
    view = handle.get_slice(name)
    dtype, shape = view.get_dtype(), view.get_shape()
    if dtype not in FLOAT_DTYPES:
        raise CheckpointError(f"tensor {name} in {path.name} is {dtype}; weights are floating point "
                              f"({', '.join(FLOAT_DTYPES)})")
    nbytes = math.prod(shape) * _DTYPE_NBYTES[dtype]
    available = available_memory_nbytes()
    if available is not None and nbytes > available:
        raise CheckpointError(f"tensor {name} in {path.name} is {list(shape)} {dtype}, {nbytes} bytes: more than "
                              f"the {available} bytes of memory available (a damaged or sparse file?)")
    return handle.get_tensor(name)


def _data_nbytes(path: Path) -> int:
    """The bytes of a safetensors file's tensors: what follows its length prefix and header."""
    with path.open("rb") as handle:
        header_nbytes = int.from_bytes(handle.read(8), "little")
    return max(0, path.stat().st_size - 8 - header_nbytes)


def _read(path: Path, name: str | None, action):
    """`action(handle)` on the open file; safetensors' and the OS's errors become CheckpointError."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return action(handle)
    except (SafetensorError, OSError, MemoryError) as error:  # MemoryError: a tensor past a memory limit (ulimit)
        what = f"tensor {name} of {path}" if name else str(path)
        raise CheckpointError(f"cannot read {what}: {error}") from None


def is_finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity: each chunk's float32 sum is finite, or (a sum can overflow) every value is."""
    for chunk in tensor.reshape(-1).split(_FINITE_CHUNK):
        if not math.isfinite(chunk.sum(dtype=torch.float32)) and not torch.isfinite(chunk.float()).all():
            return False
    return True


def _weight_files(directory: Path) -> tuple[str | None, str | None]:
    """(weights file, shard index) transformers' ``from_pretrained`` looks for, in that order:
    ``model.safetensors`` and its index, or the one file config.json's ``transformers_weights`` names
    (set where ``model.safetensors`` holds something else, such as another library's weights), a
    safetensors file or a shard index, at a path inside the directory."""
    config = directory / "config.json"
    explicit = read_json(config, strict=False).get(EXPLICIT_WEIGHTS) if config.is_file() else None
    if explicit is None:
        return WEIGHTS_FILE, INDEX_FILE
    parts = Path(explicit).parts if isinstance(explicit, str) else ()
    if (not isinstance(explicit, str) or not explicit.endswith((".safetensors", ".safetensors.index.json"))
            or Path(explicit).is_absolute() or ".." in parts or not parts):
        raise CheckpointError(f"config.json: {EXPLICIT_WEIGHTS} must name a *.safetensors or *.safetensors.index.json "
                              f"file inside the checkpoint directory, got {explicit!r}")
    return (None, explicit) if explicit.endswith(".safetensors.index.json") else (explicit, None)


def _read_index(directory: Path, index: str = INDEX_FILE) -> dict[str, str] | None:
    """The shard index's weight_map (tensor -> shard file name), each shard a file of the directory;
    None without an index."""
    if not (directory / index).exists() and not (directory / index).is_symlink():
        return None
    weight_map = read_json(directory / index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{directory / index} has no weight_map object")
    if not weight_map:  # else read as a checkpoint of no tensors, refused later for a reason of its own
        raise CheckpointError(f"{directory / index}: its weight_map names no tensors")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(f"{index} places tensor {name} in {shard!r}, which is not a file name "
                                  f"inside {directory}")
        if not (directory / shard).is_file():
            raise CheckpointError(f"{index} places tensor {name} in shard {shard}, which is absent")
    return weight_map


def _check_index(weight_map: Mapping[str, str], files_by_name: Mapping[str, Path], index: str) -> None:
    """The shard index agrees with the shards: each of its tensors is in the shard it names."""
    for name, shard in weight_map.items():
        found = files_by_name.get(name)
        if found is None or found.name != shard:
            where = f"is in {found.name}" if found is not None else "is in no shard"
            raise CheckpointError(f"{index} places tensor {name} in shard {shard}, but it {where}")


# config.json keys every recipe reads the same way, checked before any recipe converts them (a
# string "64" or 64.5 would be taken as 64, "false" as True). Null stays allowed: recipes default it.
_POSITIVE_INTS = frozenset(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
                            "num_experts_per_tok", "num_experts", "n_routed_experts",
                            "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "depth", "num_heads", "patch_size",
                            "decoder_sparse_step"))
# num_local_experts 0: Granite 4.0's dense hybrids (a recipe with experts refuses it by its own count)
_COUNT_INTS = frozenset(("sliding_window", "max_window_layers", "first_k_dense_replace", "q_lora_rank",
                         "num_local_experts", "qk_nope_head_dim", "n_group", "topk_group", "n_shared_experts",
                         "max_position_embeddings", "original_max_position_embeddings", "num_nextn_predict_layers",
                         "mamba_d_conv", "mamba_d_state", "mamba_expand", "mamba_n_groups", "mamba_n_heads"))
# vision_config's geometry, also positive integers ("56" or 2.5 went through int(); elsewhere in a
# config these names may mean something else, so only vision_config's are checked)
_VISION_POSITIVE_INTS = frozenset(("spatial_merge_size", "temporal_patch_size", "window_size", "in_channels",
                                   "out_hidden_size", "num_position_embeddings"))
_MAX_INT = 2**31 - 1
_POSITIONS = frozenset(("max_position_embeddings", "original_max_position_embeddings"))  # sizes nothing: 2**63 - 1
_REQUIRED = frozenset(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))  # never null
_NON_NEGATIVE_FLOATS = frozenset(("rms_norm_eps", "layer_norm_eps", "swiglu_limit"))
_POSITIVE_FLOATS = frozenset(("rope_theta", "factor", "routed_scaling_factor", "swiglu_alpha",
                              "partial_rotary_factor"))
_FINITE_FLOATS = frozenset(("low_freq_factor", "high_freq_factor", "mscale", "mscale_all_dim", "beta_fast",
                            "beta_slow", "attention_factor"))
_BOOLS = frozenset(("tie_word_embeddings", "attention_bias", "mlp_bias", "norm_topk_prob", "rope_interleave",
                    "mamba_proj_bias", "use_sliding_window", "use_qk_norm"))
_STRINGS = frozenset(("hidden_act", "model_type", "dtype", "torch_dtype", "rope_type", "type"))
_NESTED = ("text_config", "vision_config", "rope_parameters", "rope_scaling")


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json")
    # NaN/Infinity literals are read (transformers writes a float("inf") so), and refused in the keys below.
    config = read_json(path, strict=False)
    _check_config(config, "")
    architectures = config.get("architectures")
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(name, str) for name in architectures)):
        raise CheckpointError(f"config.json: architectures must be a list of class names, got {architectures!r}")
    return config


def _check_config(config: Mapping[str, Any], where: str) -> None:
    """The types and ranges of the keys above, in `config` and its nested objects (`where`: their path)."""
    for key, value in config.items():
        name = f"{where}{key}"
        if key in _NESTED and value is not None:
            if not isinstance(value, dict):
                raise CheckpointError(f"config.json: {name} must be an object, got {value!r}")
            _check_config(value, f"{name}.")
        elif value is None and key not in _REQUIRED:
            continue
        elif key in _POSITIVE_INTS or key in _COUNT_INTS or (
                where == "vision_config." and key in _VISION_POSITIVE_INTS):
            least, most = 0 if key in _COUNT_INTS else 1, 2**63 - 1 if key in _POSITIONS else _MAX_INT
            if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
                raise CheckpointError(f"config.json: {name} must be an integer from {least} to {most}, got {value!r}")
        elif key in _NON_NEGATIVE_FLOATS or key in _POSITIVE_FLOATS or key in _FINITE_FLOATS:
            least = 0 if key in _NON_NEGATIVE_FLOATS or key in _POSITIVE_FLOATS else -math.inf
            # Checked before isfinite, which overflows on such an int; torch takes a Python int as int64.
            if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
                raise CheckpointError(f"config.json: {name} is an integer of {value.bit_length()} bits, past the "
                                      f"64 bits of a tensor's integers; write it as a decimal fraction")
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                    or value < least or (value == 0 and key in _POSITIVE_FLOATS)):
                kind = "positive" if key in _POSITIVE_FLOATS else "non-negative" if least == 0 else "finite"
                raise CheckpointError(f"config.json: {name} must be a {kind} number, got {value!r}")
        elif key in _BOOLS and not isinstance(value, bool):
            raise CheckpointError(f"config.json: {name} must be true or false, got {value!r}")
        elif key in _STRINGS and not isinstance(value, str):
            raise CheckpointError(f"config.json: {name} must be a string, got {value!r}")
        elif key == "layer_types" and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise CheckpointError(f"config.json: {name} must be a list of strings, got {value!r}")


def read_json(path: Path, strict: bool = True) -> dict[str, Any]:
    """A JSON object from `path`; `strict`: no NaN/Infinity literals, no number beyond the float range.
    A file past `MAX_JSON_NBYTES` is refused having read no more than that (its size as read, not as
    stat reports it: a sparse file of terabytes was read whole, then parsed)."""
    if not path.is_file():  # a FIFO would block the read forever
        raise CheckpointError(f"{path} is not a regular file")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_JSON_NBYTES + 1)
        if len(data) > MAX_JSON_NBYTES:
            raise CheckpointError(f"{path} is larger than {MAX_JSON_NBYTES} bytes, more than any config or shard "
                                  f"index holds (a damaged or sparse file?)")
        text = data.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float) if strict else json.loads(text)
    except (OSError, ValueError, RecursionError) as error:
        raise CheckpointError(f"cannot read {path}: {error}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of the float range")
    return value
