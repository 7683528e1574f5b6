"""Prepare-time bounds of the chat template: a template that runs on (loops that render nothing)
or blows up on any probe conversation, including the optional probes a template may reject (tools,
multi-turn prefixes), stops prepare with a CheckpointError naming the chat template, in bounded
time, instead of hanging or being taken for a template that merely rejects the probe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helios.core.template_sandbox import RenderBounds
from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.frontend import render
from support.chat_checkpoint import CHAT_TEMPLATE, VOCAB_SIZE

SPIN = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


def _with_template(directory: Path, template: str) -> Path:
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": template}))
    return directory


@pytest.fixture
def short_cpu_budget(monkeypatch):
    """A probe render gets 0.2 s of thread CPU time here instead of PROBE_BOUNDS' 2 s: each spinning
    template below spends the whole budget before the bound stops it, and which bound stops the render
    (not its value) is what these tests check. The probes of a template that does not spin take a few
    milliseconds of it."""
    monkeypatch.setattr(render, "PROBE_BOUNDS", RenderBounds(render.PROBE_BOUNDS.max_chars, cpu_seconds=0.2))


def _refused(directory: Path, phrase: str) -> None:
    """The bound that stopped the render is the one `phrase` names (its CPU time, a size): no
    wall-clock assertion, which a loaded machine fails; pytest-timeout catches a render that hangs."""
    with pytest.raises(CheckpointError, match=phrase):
        read_assets(directory, VOCAB_SIZE)


def test_the_unbounded_probes_still_pass(checkpoint):
    assert read_assets(checkpoint, VOCAB_SIZE) is not None


def test_nested_loops_that_render_nothing_stop_prepare(checkpoint, short_cpu_budget):
    _refused(_with_template(checkpoint, SPIN + CHAT_TEMPLATE),
                     "the chat template cannot render a single user message: .*CPU time")


@pytest.mark.parametrize("trap, phrase", [
    ("{% if tools %}" + SPIN + "{% endif %}", "CPU time"),
    ("{% if messages|length > 2 %}" + SPIN + "{% endif %}", "CPU time"),
    ("{% if messages|length > 2 %}{{ 'x' * 10**10 }}{% endif %}", "repetition of 10000000000 items"),
    ("{% if tools %}{% for i in range(10**9) %}{% endfor %}{% endif %}", "range of 1000000000 items"),
], ids=["spins on tools", "spins on three messages", "blows up on three messages", "huge range on tools"])
def test_a_template_that_runs_away_on_an_optional_probe_stops_prepare(checkpoint, short_cpu_budget, trap, phrase):
    _refused(_with_template(checkpoint, trap + CHAT_TEMPLATE), f"the chat template .*{phrase}")
