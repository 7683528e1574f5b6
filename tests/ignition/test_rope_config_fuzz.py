"""Differential fuzz of the rope settings a config.json carries, against transformers.

Each seed draws one family's tiny checkpoint (Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen3-MoE,
GLM-4.5, DeepSeek-V3, gpt-oss, Bamba, Phi-3, and Qwen2.5-VL's decoder with an ``mrope_section`` in its
``text_config``; the weights written once per family) and a rope configuration
of one of the types Helios or transformers knows (``default`` and every key of transformers'
``ROPE_INIT_FUNCTIONS``, plus names neither knows), in the layout transformers 5 writes
(``rope_parameters``), the legacy one (``rope_theta`` / ``partial_rotary_factor`` /
``original_max_position_embeddings`` beside ``rope_scaling``, ``type`` for ``rope_type``, a stale
``rope_parameters`` beside it) or none at all, then mutates it: a key left out, a value of the wrong
type or out of range (zero or negative factors and thetas, ``beta_fast`` below ``beta_slow``,
``low_freq_factor`` at or above ``high_freq_factor``, an original context of 0 or past
``max_position_embeddings``, partial rotary factors, factor lists of the wrong length, unknown keys).

transformers loads the checkpoint and runs a 5-token forward: it accepts the configuration where that
gives finite logits. Helios' `load_checkpoint` must then either give the reference's rotary inverse
frequencies, cos/sin attention factor (and DeepSeek's softmax scale) within float32 rounding, or
refuse with a `CheckpointError` naming one of the drawn settings (for a required key transformers
misses, that key). Where transformers refuses, or accepts and computes non-finite values, Helios
must refuse by name too: a configuration never prepares into a model the reference cannot run, and
no NaN or infinite frequency reaches a core. Every `GREEDY_EVERY`-th case Helios accepts is also run
end to end (eager programs through the test driver) for transformers' float32 greedy tokens and logits.

Two readings of transformers 5.25 are not taken at face value: its yarn, dynamic and longrope
functions fail on a Mixtral config.json without ``head_dim`` (they read the null attribute), so the
reference re-reads such a checkpoint with ``head_dim`` written out (`_reference`). (BambaConfig
replaces a top-level ``partial_rotary_factor`` with 0.5, only the rope dict's own counting; Helios
reads it the same way, and the legacy draws put it at the top level too.)

``HELIOS_ROPE_FUZZ_SEEDS`` (default 30; 60 with HELIOS_CONFIG_FUZZ_SWEEP=1) sets the number of drawn cases; ``HELIOS_ROPE_FUZZ_GREEDY``
(default 6) how often an accepted one also runs end to end. `PINNED` keeps the configurations the
fuzz found defects in.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes import load_checkpoint
from support.sweeps import swept

from .driver import PagedModel, Sequence, generate
from .hf_checkpoints import Family, random_model, write_checkpoint
from .test_config_fuzz import _DEEPSEEK, _GLM, _TINY, _programs
from .test_equivalence import TOLERANCE, relative_error

# Half the draws by default, every one with HELIOS_CONFIG_FUZZ_SWEEP=1: each seed is one more drawn rope on the same
# recipes' rope readers, and PINNED keeps the configurations the fuzz found defects in.
SEEDS = int(os.environ.get("HELIOS_ROPE_FUZZ_SEEDS", "60" if swept("HELIOS_CONFIG_FUZZ_SWEEP") else "30"))
GREEDY_EVERY = int(os.environ.get("HELIOS_ROPE_FUZZ_GREEDY", "6"))
MAX_POSITIONS = 512  # every family's max_position_embeddings
PROMPT_LEN, NEW_TOKENS = 9, 3

_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=16)
FAMILIES = {
    "llama": Family("llama", transformers.LlamaConfig, tuple(dict(_TINY, head_dim=16).items())),
    "qwen2": Family("qwen2", transformers.Qwen2Config, tuple(_TINY.items())),
    "qwen3": Family("qwen3", transformers.Qwen3Config, tuple(dict(_TINY, head_dim=16).items())),
    "mistral": Family("mistral", transformers.MistralConfig, tuple(dict(_TINY, sliding_window=None).items())),
    "mixtral": Family("mixtral", transformers.MixtralConfig, tuple(dict(
        _TINY, num_local_experts=4, num_experts_per_tok=2).items())),
    "qwen3_moe": Family("qwen3_moe", transformers.Qwen3MoeConfig, tuple(dict(
        _TINY, head_dim=16, num_experts=4, **_MOE).items())),
    "glm4_moe": Family("glm4_moe", transformers.Glm4MoeConfig, tuple(_GLM.items())),
    "deepseek": Family("deepseek", transformers.DeepseekV3Config, tuple(dict(_DEEPSEEK, qk_rope_head_dim=16).items())),
    "gpt_oss": Family("gpt_oss", transformers.GptOssConfig, tuple(dict(
        _TINY, head_dim=16, num_local_experts=2, num_experts_per_tok=2, sliding_window=6).items())),
    # hidden_size / heads = head_dim 16: Phi3Config sizes LongRoPE's lists by it
    "phi3": Family("phi3", transformers.Phi3Config, tuple(dict(
        _TINY, hidden_size=64, pad_token_id=None, bos_token_id=None, eos_token_id=None).items())),
    "bamba": Family("bamba", transformers.BambaConfig, tuple(dict(
        _TINY, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8).items())),
}
# Vision-language decoders, drawn in their text_config with an mrope_section (Qwen3-VL's interleaved).
VISION_LANGUAGE, VISION_LANGUAGE_3 = "qwen2_5_vl", "qwen3_vl"
# The rotated width of each family's heads before a partial_rotary_factor (DeepSeek's rotary key).
HEAD_DIMS = {"qwen2": 8, "mistral": 8, "mixtral": 8, "bamba": 8}
# The config.json keys a rope configuration is spelled with (removed from the saved config, then drawn).
ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
             "original_max_position_embeddings")
ROPE_TYPES = ("default", *sorted(ROPE_INIT_FUNCTIONS))
UNKNOWN_TYPES = ("su", "ntk", "mrope", "YaRN", "")
WRONG_TYPES = ("2.0", True, [2.0], {"value": 2.0})


# ---------------------------------------------------------------------------------------------------
# Drawing a configuration.


def _choice(rng: random.Random, options):
    return options[rng.randrange(len(options))]


def _valid(rng: random.Random, kind: str, rotary_pairs: int) -> dict:
    """A well-formed rope dict of `kind` (rotary_pairs: the frequencies a longrope list holds)."""
    params: dict = {"rope_type": kind}
    if rng.random() < 0.8:
        params["rope_theta"] = _choice(rng, (100.0, 10000.0, 500000.0, 10000))
    if kind in ("linear", "dynamic", "proportional"):
        params["factor"] = _choice(rng, (1.0, 2.0, 4.0, 8))
    elif kind == "llama3":
        params.update(factor=_choice(rng, (2.0, 8.0, 32.0)), low_freq_factor=_choice(rng, (1.0, 2)),
                      high_freq_factor=_choice(rng, (4.0, 8.0)))
    elif kind == "yarn":
        params["factor"] = _choice(rng, (2.0, 4.0, 40.0, 8))
        if rng.random() < 0.5:
            params.update(beta_fast=_choice(rng, (8.0, 32.0, 32)), beta_slow=_choice(rng, (1.0, 2.0, 1)))
        if rng.random() < 0.3:
            params["attention_factor"] = _choice(rng, (1.25, 0.9, 1.0))
        if rng.random() < 0.3:
            params.update(mscale=_choice(rng, (1.0, 0.707)), mscale_all_dim=_choice(rng, (1.0, 0.8, 0.0)))
        if rng.random() < 0.3:
            params["truncate"] = _choice(rng, (False, True))
    elif kind == "longrope":
        params.update(short_factor=[1.0 + i / 8 for i in range(rotary_pairs)],
                      long_factor=[2.0 + i for i in range(rotary_pairs)])
        if rng.random() < 0.5:
            params["factor"] = _choice(rng, (2.0, 8.0))
    if kind in ("llama3", "yarn", "longrope") and rng.random() < 0.8:
        params["original_max_position_embeddings"] = _choice(rng, (16, 64, 128))
    if rng.random() < 0.15:
        params["partial_rotary_factor"] = _choice(rng, (0.5, 1.0))
    return params


def _mutate(rng: random.Random, params: dict, rotary_pairs: int) -> str:
    """Changes `params` one way (a key left out, a wrong type, a value out of range ...); says how."""
    present = sorted(params)
    mutation = rng.randrange(14)
    if mutation == 0 and present:
        key = _choice(rng, present)
        del params[key]
        return f"no {key}"
    if mutation == 1 and present:
        key = _choice(rng, present)
        params[key] = _choice(rng, (*WRONG_TYPES, None))
        return f"{key} {params[key]!r}"
    if mutation == 2:
        params["factor"] = _choice(rng, (-2.0, 0.0, 0.5, 1.0, 0.999, 1e30, None))
        return f"factor {params['factor']}"
    if mutation == 3:
        fast, slow = _choice(rng, ((1.0, 32.0), (2.0, 2.0), (-1.0, 1.0), (32.0, -1.0), (0.0, 0.0), (1e-3, 1.0)))
        params.update(beta_fast=fast, beta_slow=slow)
        return f"beta_fast {fast} beta_slow {slow}"
    if mutation == 4:
        low, high = _choice(rng, ((4.0, 1.0), (2.0, 2.0), (0.0, 4.0), (-1.0, 4.0), (1.0, 0.0)))
        params.update(low_freq_factor=low, high_freq_factor=high)
        return f"low_freq_factor {low} high_freq_factor {high}"
    if mutation == 5:
        params["original_max_position_embeddings"] = _choice(rng, (0, 1, 2 * MAX_POSITIONS, 64.0, -1, 2**40))
        return f"original_max_position_embeddings {params['original_max_position_embeddings']}"
    if mutation == 6:
        params["partial_rotary_factor"] = _choice(rng, (0.25, 0.5, 0.75, 1.5, 0.0, -0.5, 0.3, 1))
        return f"partial_rotary_factor {params['partial_rotary_factor']}"
    if mutation == 7:
        key = _choice(rng, ("short_factor", "long_factor"))
        params[key] = [1.5] * _choice(rng, (0, rotary_pairs - 1, rotary_pairs + 1, 2 * rotary_pairs))
        params.setdefault("short_factor" if key == "long_factor" else "long_factor", [1.0] * rotary_pairs)
        return f"{key} of {len(params[key])}"
    if mutation == 8 and "rope_type" in params:
        kind = params.pop("rope_type")
        if rng.random() < 0.5:
            params["type"] = kind
            return "type for rope_type"
        params.update(type=_choice(rng, ROPE_TYPES), rope_type=kind)
        return f"type {params['type']} beside rope_type"
    if mutation == 9:
        params[_choice(rng, ("foo", "scaling_factor", "rope_theta_local", "mrope_section"))] = 1
        return "an unknown key"
    if mutation == 10:
        params["attention_factor"] = _choice(rng, (-1.0, 0.0, 1, 1.25, "1.0", 1e30))
        return f"attention_factor {params['attention_factor']!r}"
    if mutation == 11:
        params.update(mscale=_choice(rng, (0.707, 1.0, -1.0, 0.0)), mscale_all_dim=_choice(rng, (0.0, 1.0, -1.0)))
        return f"mscale {params['mscale']} mscale_all_dim {params['mscale_all_dim']}"
    if mutation == 12:
        params["rope_theta"] = _choice(rng, (-1.0, 0.0, None, "10000", 1.0, 1e300, 0.5))
        return f"rope_theta {params['rope_theta']!r}"
    if mutation == 13:
        params["truncate"] = _choice(rng, (False, "no", 0, None, 1))
        return f"truncate {params['truncate']!r}"
    return "unchanged"


def _layout(rng: random.Random, params: dict, family: str) -> tuple[dict, str]:
    """The config.json keys holding `params`: transformers 5's rope_parameters, or the legacy spelling."""
    layout = _choice(rng, ("current", "current", "legacy", "legacy", "none"))
    if layout == "none":
        return {}, "no rope keys"
    if layout == "current":
        return {"rope_parameters": params}, "rope_parameters"
    scaling, top = dict(params), {}
    for key in ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings"):
        if key in scaling and rng.random() < 0.6:
            top[key] = scaling.pop(key)
    if scaling.get("rope_type") == "default" and rng.random() < 0.5:
        scaling.pop("rope_type")
    elif "rope_type" in scaling and rng.random() < 0.5:
        scaling["type"] = scaling.pop("rope_type")
    top["rope_scaling"] = scaling or None
    if rng.random() < 0.2:  # a stale rope_parameters beside it: transformers reads rope_scaling
        top["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    return top, "legacy rope_scaling"


def draw_case(seed: int) -> tuple[str, dict, str]:
    """(family name, config.json rope keys, description) of seed `seed`."""
    rng = random.Random(f"rope-{seed}")
    family = _choice(rng, (*sorted(FAMILIES), VISION_LANGUAGE, VISION_LANGUAGE_3))
    kind = _choice(rng, (*ROPE_TYPES, "yarn", "llama3", "linear", _choice(rng, UNKNOWN_TYPES)))
    pairs = HEAD_DIMS.get(family, 16) // 2
    params = _valid(rng, kind, pairs)
    if family in (VISION_LANGUAGE, VISION_LANGUAGE_3):
        params.update(mrope_section=[2, 3, 3], **({"mrope_interleaved": True} if family == VISION_LANGUAGE_3 else {}))
    mutations = [_mutate(rng, params, pairs) for _ in range(_choice(rng, (0, 1, 1, 1, 2, 3)))]
    keys, layout = _layout(rng, params, family)
    return family, keys, f"{family} {kind} in {layout}: {'; '.join(mutations) or 'well-formed'}"


# ---------------------------------------------------------------------------------------------------
# Running one case on both sides.


def _vision_language_model(name: str):
    """A tiny Qwen2.5-VL or Qwen3-VL (its decoder's rope is what is drawn; the encoder is one block)."""
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, temporal_patch_size=2,
                  spatial_merge_size=2, out_hidden_size=64)
    tokens = dict(image_token_id=90, vision_start_token_id=91, vision_end_token_id=92, tie_word_embeddings=False)
    torch.manual_seed(7)
    if name == VISION_LANGUAGE:
        config = transformers.Qwen2_5_VLConfig(text_config=dict(_TINY, hidden_size=64, rope_parameters={
            "rope_type": "default", "mrope_section": [2, 3, 3]}), vision_config=dict(
            vision, patch_size=14, window_size=56, fullatt_block_indexes=[0]), **tokens)
        return transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    config = transformers.Qwen3VLConfig(text_config=dict(_TINY, hidden_size=64, head_dim=16, rope_parameters={
        "rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}), vision_config=dict(
        vision, patch_size=16, num_position_embeddings=16, deepstack_visual_indexes=[0]), **tokens)
    return transformers.Qwen3VLForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Each family's tiny checkpoint, written once (its rope keys are rewritten per case)."""
    root = tmp_path_factory.mktemp("rope-families")
    written = {name: write_checkpoint(_vision_language_model(name), root / name)
               for name in (VISION_LANGUAGE, VISION_LANGUAGE_3)}
    for name, family in FAMILIES.items():
        written[name] = write_checkpoint(random_model(family, seed=7), root / name)
    return written


def _write_case(source: Path, directory: Path, keys: dict) -> Path:
    """A copy of `source` (files hard-linked: a checkpoint's symbolic links may not leave it) whose
    config.json holds `keys` for its rope settings."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name != "config.json" and not (directory / path.name).exists():
            os.link(path, directory / path.name)
    config = json.loads((source / "config.json").read_text())
    text = config["text_config"] if "vision_config" in config else config  # a vision-language decoder's
    for key in ROPE_KEYS:
        config.pop(key, None)
        text.pop(key, None)
    text.update(json.loads(json.dumps(keys)))  # the rope dicts copied: both sides may change theirs
    (directory / "config.json").write_text(json.dumps(config))
    return directory


class Reference:
    """transformers' reading of a checkpoint: the model, or why it refused; its rope values."""

    def __init__(self, directory: Path):
        self.model, self.refusal = None, None
        vision = "vision_config" in json.loads((directory / "config.json").read_text())
        auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
        try:
            model = auto.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32).eval()
            with torch.no_grad():
                logits = model(torch.tensor([[1, 5, 9, 2, 7]])).logits
        except Exception as error:  # noqa: BLE001 - any refusal of the reference counts as one
            self.refusal = f"{type(error).__name__}: {error}"
            return
        self.model, decoder = model, getattr(model.model, "language_model", model.model)
        rotary = decoder.rotary_emb
        self.inv_freq, self.attention_factor = rotary.inv_freq.float(), float(rotary.attention_scaling)
        attention = getattr(decoder.layers[0], "self_attn", None)
        self.scale = float(attention.scaling) if hasattr(attention, "scaling") else None
        values = torch.cat([self.inv_freq, logits.flatten(), torch.tensor([self.attention_factor])])
        self.finite = bool(torch.isfinite(values).all())

    @property
    def missing_keys(self) -> set[str]:
        """The required rope keys transformers refused the configuration for lacking."""
        found = re.search(r"Missing required keys in `rope_parameters`.*?: \{(.*)\}", self.refusal or "")
        return set(re.findall(r"'([^']+)'", found.group(1))) if found else set()


def _reference(directory: Path) -> Reference:
    """transformers' reading of the checkpoint at `directory`. (Its yarn, dynamic and longrope
    functions read ``getattr(config, "head_dim", ...)``, None in a Mixtral config.json without one,
    and fail where its other rope functions and its attention take hidden_size / heads: that
    reference defect is worked around by reading the same checkpoint with the head_dim written out.)"""
    reference = Reference(directory)
    if re.search(r"'NoneType' and '(float|int)'", reference.refusal or ""):
        config = json.loads((directory / "config.json").read_text())
        if "hidden_size" in config and config.get("head_dim") is None:
            config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
            explicit = _write_case(directory, directory.with_name(directory.name + "-head-dim"), {})
            (explicit / "config.json").write_text(json.dumps(config))
            return Reference(explicit)
    return reference


def _named(message: str, keys: dict, required: set[str]) -> bool:
    """Whether a refusal names a drawn setting: a key of the rope dict or beside it (not the dict's
    own name unless there is none, nor the type unless the type is what is refused), a required
    key it lacks, or the mrope_section a vision-language decoder needs."""
    if re.search(r"rope_type \S+ is not|(rope_type|\.type) must be", message):
        return True
    names = {key for key, value in keys.items() if not isinstance(value, dict)} | required | {"mrope_section"}
    names |= {key for value in keys.values() if isinstance(value, dict) for key in value}
    if not any(isinstance(value, dict) and value for value in keys.values()):  # no rope dict: its name
        names |= {"rope_scaling", "rope_parameters"}
    return any(name in message for name in names - {"rope_type", "type"})


def _helios_values(recipe) -> tuple[torch.Tensor, float, float | None]:
    """(rotary inverse frequencies, cos/sin attention factor, latent softmax scale or None)."""
    arch = recipe.architecture
    inv_freq = next(weight.tensor for weight in recipe.weights if weight.name == "rope.inv_freq").float()
    if arch.latent is not None:
        return inv_freq, arch.latent.rope_attention_factor, arch.latent.scale
    return inv_freq, arch.rotary_factor, None


def check_case(keys: dict, what: str, source: Path, directory: Path, greedy: bool = False) -> str:
    """The outcome of one case: 'both refuse: <Helios' reason>', 'helios refuses: <reason>', 'match'
    or 'match, greedy' (`greedy`: run end to end too); raises AssertionError where Helios prepares
    what transformers refuses, or computes other values."""
    directory = _write_case(source, directory, keys)
    reference = _reference(directory)
    try:
        # Served context: the greedy run's (Phi-3's LongRoPE list follows it; no drawn original context
        # lies between the reference's 5-token forward and it, where the two would take different lists).
        recipe = load_checkpoint(directory, context_tokens=PROMPT_LEN + NEW_TOKENS)
    except CheckpointError as error:
        assert _named(str(error), keys, reference.missing_keys), f"{what}: refusal names no drawn setting: {error}"
        return f"{'both refuse' if reference.model is None or not reference.finite else 'helios refuses'}: {error}"
    inv_freq, factor, scale = _helios_values(recipe)
    assert torch.isfinite(inv_freq).all() and math.isfinite(factor), f"{what}: non-finite rope prepared"
    assert reference.model is not None, f"{what}: transformers refuses ({reference.refusal}), Helios prepares it"
    assert reference.finite, f"{what}: transformers computes non-finite values, Helios prepares it"
    expected = reference.inv_freq
    assert inv_freq.shape[0] >= expected.shape[0], f"{what}: {inv_freq.shape[0]} frequencies, not {expected.shape[0]}"
    torch.testing.assert_close(inv_freq[:expected.shape[0]], expected, rtol=2e-6, atol=0,
                               msg=lambda m: f"{what}: inverse frequencies differ: {m}")
    assert not inv_freq[expected.shape[0]:].any(), f"{what}: pass-through pairs rotate"
    # the programs read a zero frequency as a pass-through pair, which the attention factor leaves alone
    assert factor == 1.0 or inv_freq[:expected.shape[0]].all(), f"{what}: a rotated pair reads as pass-through"
    assert math.isclose(factor, reference.attention_factor, rel_tol=1e-6), (
        f"{what}: attention factor {factor} is not transformers' {reference.attention_factor}")
    if scale is not None:
        assert math.isclose(scale, reference.scale, rel_tol=1e-6), (
            f"{what}: softmax scale {scale} is not transformers' {reference.scale}")
    if not greedy:
        return "match"
    _assert_greedy(recipe, reference.model, what)
    return "match, greedy"


def _assert_greedy(recipe, reference, what: str) -> None:
    """Helios' eager programs give the reference's greedy tokens and logits."""
    prompt = torch.randint(0, recipe.architecture.vocab_size, (PROMPT_LEN,),
                           generator=torch.Generator().manual_seed(5)).tolist()
    tokens, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            rows.append(reference(torch.tensor([tokens])).logits[0, -1])
            tokens.append(int(rows[-1].argmax()))
    model = PagedModel(recipe.weight_tensors, _programs(recipe.architecture))
    sequence = Sequence(0, list(prompt))
    generate(model, [sequence], NEW_TOKENS, chunk=4)
    assert sequence.generated == tokens[PROMPT_LEN:], f"{what}: greedy tokens differ"
    worst = relative_error(torch.stack(sequence.logits), torch.stack(rows))
    assert worst < TOLERANCE, f"{what}: greedy logits differ by {worst:.2e}"


# ---------------------------------------------------------------------------------------------------
# The fuzz.


def test_every_transformers_rope_type_is_drawn():
    """A rope type a later transformers adds is drawn too (and must then match or be refused by name)."""
    assert set(ROPE_INIT_FUNCTIONS) | {"default"} == set(ROPE_TYPES)


# The seeds in blocks (one test each, within the suite's per-test timeout at any HELIOS_ROPE_FUZZ_SEEDS).
BLOCK = 500


@pytest.mark.parametrize("start", range(0, SEEDS, BLOCK), ids=lambda start: f"seeds-{start}")
def test_drawn_rope_configurations_match_transformers_or_are_refused_by_name(checkpoints, tmp_path, start):
    outcomes, seeds = Counter(), range(start, min(start + BLOCK, SEEDS))
    for seed in seeds:
        family, keys, what = draw_case(seed)
        greedy = GREEDY_EVERY > 0 and (outcomes["match"] + outcomes["match, greedy"]) % GREEDY_EVERY == 0
        outcome = check_case(keys, f"seed {seed}, {what}", checkpoints[family], tmp_path / str(seed), greedy)
        outcomes[outcome.split(":")[0]] += 1
        shutil.rmtree(tmp_path / str(seed), ignore_errors=True)
    print(f"seeds {seeds.start}-{seeds.stop - 1}: {dict(outcomes)}")
    if len(seeds) >= 60:  # every kind of outcome is drawn
        assert all(outcomes[kind] for kind in ("match", "match, greedy", "both refuse", "helios refuses")), outcomes


# ---------------------------------------------------------------------------------------------------
# Configurations the fuzz found defects in, pinned (each failed before its fix): the outcome, or the
# words Helios' refusal must hold.

_YARN = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 64}
_LLAMA3 = {"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
_NO_FACTOR = {key: value for key, value in _YARN.items() if key != "factor"}
_UNFACTORED = "both refuse: config.json: rope_type 'yarn' has no 'factor'"
PINNED = {
    # transformers requires a yarn factor (a null one is max / original context): it was computed so
    "llama-yarn-without-factor": ("llama", {"rope_parameters": _NO_FACTOR}, _UNFACTORED),
    "qwen2-legacy-yarn-without-factor": ("qwen2", {"rope_theta": 100.0, "rope_scaling": {
        "type": "yarn", "original_max_position_embeddings": 64}}, _UNFACTORED),
    "deepseek-yarn-without-factor": ("deepseek", {"rope_parameters": _NO_FACTOR},
                                     _UNFACTORED),
    "gpt_oss-yarn-without-factor": ("gpt_oss", {"rope_parameters": _NO_FACTOR},
                                    _UNFACTORED),
    "llama-yarn-null-factor": ("llama", {"rope_parameters": {**_YARN, "factor": None}}, "match"),  # (a control)
    # divisions by zero escaped as ZeroDivisionError, not a CheckpointError
    "llama-llama3-zero-low-freq-factor": ("llama", {"rope_parameters": {**_LLAMA3, "low_freq_factor": 0.0}},
                                          "both refuse: rope_type 'llama3' needs a non-zero low_freq_factor"),
    "mistral-yarn-theta-one": ("mistral", {"rope_parameters": {**_YARN, "rope_theta": 1.0}},
                               "both refuse: rope_type 'yarn' needs a rope_theta other than 1"),
    # a math domain error, refused without naming the setting
    "qwen3-yarn-negative-beta-slow": ("qwen3", {"rope_parameters": {**_YARN, "beta_fast": 32.0, "beta_slow": -1.0}},
                                      "both refuse: rope_type 'yarn' needs a positive beta_slow"),
    "glm4_moe-yarn-original-context-zero": ("glm4_moe", {"rope_parameters": {
        **_YARN, "original_max_position_embeddings": 0}}, "needs a positive original_max_position_embeddings"),
    # a null theta or partial rotary factor: a TypeError's words, naming neither
    "qwen3_moe-null-theta": ("qwen3_moe", {"rope_theta": None, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
                             "both refuse: config.json: rope_theta must be a positive number, got null"),
    "glm4_moe-null-partial-rotary-factor": ("glm4_moe", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 100.0, "factor": 2.0, "partial_rotary_factor": None}},
        "both refuse: config.json: partial_rotary_factor must be a number, got null"),
    # gpt-oss without rope settings: the plain rope was prepared, where transformers 5's GptOssConfig
    # reads YaRN factor 32 over 4096 positions (and 4.x over max_position_embeddings): refused by name
    "gpt_oss-no-rope-keys": ("gpt_oss", {}, "helios refuses: a gpt-oss config.json without rope_scaling"),
    "gpt_oss-theta-only": ("gpt_oss", {"rope_theta": 1000.0, "rope_scaling": None},
                           "helios refuses: a gpt-oss config.json without rope_scaling"),
    # partial rotary ignored: the reference rotates part of each head (and fails), Helios rotated whole heads
    "gpt_oss-yarn-partial-rotary": ("gpt_oss", {"rope_parameters": {**_YARN, "partial_rotary_factor": 0.5}},
                                    "both refuse: partial_rotary_factor 0.5 is not supported"),
    "deepseek-yarn-partial-rotary": ("deepseek", {"rope_parameters": {**_YARN, "partial_rotary_factor": 0.75}},
                                     "both refuse: partial_rotary_factor 0.75 is not supported"),
    # an attention factor whose square overflows float32: the reference's logits are NaN
    "qwen3-yarn-huge-attention-factor": ("qwen3", {"rope_parameters": {**_YARN, "attention_factor": 1e30}},
                                         "both refuse: attention_factor 1e+30 overflows"),
    # DeepSeek's softmax scale reads a null yarn factor (and transformers fails): max / original was taken
    "deepseek-yarn-null-factor-mscale-all-dim": ("deepseek", {"rope_parameters": {
        **_YARN, "factor": None, "mscale": 1.0, "mscale_all_dim": 1.0}},
        "both refuse: rope_type 'yarn' with mscale_all_dim needs a factor"),
    "deepseek-yarn-null-factor": ("deepseek", {"rope_parameters": {**_YARN, "factor": None}}, "match"),  # (control)
    # a theta whose frequencies underflow to 0 in float32: the programs took those pairs for pass-through
    # ones and left YaRN's attention factor off them (greedy tokens differed)
    "glm4_moe-yarn-theta-underflow": ("glm4_moe", {"rope_parameters": {**_YARN, "rope_theta": 1e300}},
                                      "helios refuses: rope_theta 1e+300 underflows rotary frequencies"),
    "llama-yarn-theta-underflow": ("llama", {"rope_parameters": {**_YARN, "rope_theta": 1e60}},
                                   "helios refuses: rope_theta 1e+60 underflows rotary frequencies"),
    # a null original context (transformers refuses it): max_position_embeddings was taken
    "qwen2-llama3-null-original-context": ("qwen2", {"rope_parameters": {
        **_LLAMA3, "original_max_position_embeddings": None}}, "both refuse: rope_type 'llama3' needs original_max"),
    "llama-yarn-top-level-null-original-context": ("llama", {
        "rope_theta": 100.0, "original_max_position_embeddings": None,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
        "both refuse: rope_type 'yarn' needs original_max"),
    # a rotary width past the head: refused by the architecture's check, naming no config.json key
    "bamba-partial-rotary-past-the-head": ("bamba", {"rope_parameters": {
        "rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 1.5}},
        "both refuse: partial_rotary_factor 1.5 gives a rotary width of 12"),
    # Qwen2-VL's "type": "mrope" (transformers' Qwen2.5-VL reads the plain rope): refused as an unknown type
    "qwen2_5_vl-mrope-type": (VISION_LANGUAGE, {"rope_theta": 100.0, "rope_scaling": {
        "type": "mrope", "mrope_section": [2, 3, 3]}}, "match"),
    # no rope_theta: the decoder took 10000, transformers' text configs 1000000 (Qwen2.5-VL), 500000 (Qwen3-VL)
    "qwen2_5_vl-default-theta": (VISION_LANGUAGE, {"rope_parameters": {"rope_type": "default",
                                                                       "mrope_section": [2, 3, 3]}}, "match"),
    "qwen3_vl-default-theta": (VISION_LANGUAGE_3, {"rope_parameters": {
        "rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}}, "match"),
    "qwen3_vl-mrope-type": (VISION_LANGUAGE_3, {"rope_parameters": {  # transformers' Qwen3-VL refuses it too
        "rope_type": "mrope", "rope_theta": 100.0, "mrope_section": [2, 3, 3]}}, "both refuse: rope_type 'mrope'"),
    # an mrope_section not a list of integers: a TypeError's words, naming nothing
    "qwen2_5_vl-mrope-section-string": (VISION_LANGUAGE, {"rope_parameters": {
        "rope_type": "default", "mrope_section": "2.0"}}, "mrope_section must be a list of non-negative integers"),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_rope_configuration(checkpoints, tmp_path, name):
    family, keys, expected = PINNED[name]
    outcome = check_case(keys, name, checkpoints[family], tmp_path, greedy=expected == "match")
    assert outcome == "match, greedy" if expected == "match" else expected in outcome, outcome
