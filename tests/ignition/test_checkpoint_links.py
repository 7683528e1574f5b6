"""A checkpoint's symbolic links must resolve inside it (`helios.ignition.checkpoint_links`).

Before, `additional_chat_templates/tool_use.jinja` linked to any file of the preparing machine
prepared cleanly and carried that file's text into the signed core's chat template (the tool branch
is rendered only where tools are given). Each test starts from a copy of the tiny Qwen3 chat
checkpoint (`checkpoint` in conftest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helios.cli.main import main
from helios.ignition.architecture import CheckpointError
from helios.ignition.checkpoint_assets import read_assets
from helios.ignition.checkpoint_links import check_links
from helios.ignition.recipes import load_checkpoint
from support.chat_checkpoint import VOCAB_SIZE

SECRET = "{# not a template: a file of the machine #} secret-token-0123456789"


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "outside" / "secret.jinja"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def test_a_template_linked_out_of_the_checkpoint_fails_prepare_and_writes_no_core(checkpoint, secret, tmp_path,
                                                                                  capsys):
    (checkpoint / "additional_chat_templates").mkdir()
    (checkpoint / "additional_chat_templates" / "tool_use.jinja").symlink_to(secret)
    key, output = tmp_path / "publisher.key", tmp_path / "model.core"
    assert main(["keygen", "-o", str(key), "--namespace", "test/links"]) == 0
    status = main(["prepare", str(checkpoint), "-o", str(output), "--key", str(key), "--namespace", "test/links"])
    err = capsys.readouterr().err
    assert status == 2
    assert "tool_use.jinja links to" in err and "outside the checkpoint directory" in err
    assert "Traceback" not in err
    assert not output.exists() and not list(tmp_path.glob(".model.core*"))


@pytest.mark.parametrize("link", ["tokenizer.json", "config.json", "model.safetensors"])
def test_every_file_the_checkpoint_links_out_is_refused_before_it_is_read(checkpoint, tmp_path, link):
    outside = tmp_path / "elsewhere" / link
    outside.parent.mkdir()
    shutil.move(checkpoint / link, outside)  # the same bytes: only where they lie differs
    (checkpoint / link).symlink_to(outside)
    with pytest.raises(CheckpointError, match=f"{link} links to .*outside the checkpoint"):
        load_checkpoint(checkpoint)
    with pytest.raises(CheckpointError, match=f"{link} links to .*outside the checkpoint"):
        read_assets(checkpoint, VOCAB_SIZE)


def test_a_linked_folder_out_of_the_checkpoint_is_refused(checkpoint, secret):
    (checkpoint / "additional_chat_templates").symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(CheckpointError, match="additional_chat_templates links to .*outside"):
        read_assets(checkpoint, VOCAB_SIZE)


def test_links_within_the_checkpoint_are_followed(checkpoint):
    template = json.loads((checkpoint / "tokenizer_config.json").read_text())["chat_template"]
    (checkpoint / "templates").mkdir()
    (checkpoint / "templates" / "kept.jinja").write_text(template)
    (checkpoint / "chat_template.jinja").symlink_to(Path("templates", "kept.jinja"))
    check_links(checkpoint)
    assert read_assets(checkpoint, VOCAB_SIZE).chat_template == template


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_a_link_that_cannot_be_followed_is_named(checkpoint, kind):
    path = checkpoint / "generation_config.json"
    path.unlink(missing_ok=True)
    if kind == "dangling":
        path.symlink_to(checkpoint / "gone.json")
        phrase = "generation_config.json is a link to .*gone.json'?, which does not exist"
    else:
        path.symlink_to(checkpoint / "other.json")
        (checkpoint / "other.json").symlink_to(path)
        phrase = "is a link that cannot be followed"
    with pytest.raises(CheckpointError, match=phrase):
        check_links(checkpoint)


def test_a_hub_cache_snapshot_links_into_its_blobs_and_prepares(checkpoint, tmp_path):
    # The layout huggingface_hub writes: <repo>/snapshots/<revision>/<file> -> ../../blobs/<digest>.
    repo = tmp_path / "models--test--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for index, path in enumerate(sorted(p for p in checkpoint.iterdir() if p.is_file())):
        blob = repo / "blobs" / f"blob{index:04d}"
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", blob.name))
    recipe = load_checkpoint(snapshot)
    assert recipe.architecture.vocab_size == VOCAB_SIZE
    assert read_assets(snapshot, VOCAB_SIZE).chat_template == read_assets(checkpoint, VOCAB_SIZE).chat_template


def test_a_snapshot_link_out_of_its_repository_is_still_refused(checkpoint, secret, tmp_path):
    repo = tmp_path / "models--test--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    shutil.copytree(checkpoint, snapshot)
    (snapshot / "chat_template.jinja").unlink(missing_ok=True)
    (snapshot / "chat_template.jinja").symlink_to(secret)
    with pytest.raises(CheckpointError, match="chat_template.jinja links to .*outside the checkpoint"):
        check_links(snapshot)


def _hub_repository(root: Path, checkpoint: Path, subfolder: str = "") -> tuple[Path, Path]:
    """A hub cache repository under `root` whose snapshot (or its `subfolder`) links every file of
    `checkpoint` into its blobs; returns the repository and the linked checkpoint folder."""
    repo = root / "models--test--tiny"
    folder = repo / "snapshots" / "0123abcd" / subfolder
    (repo / "blobs").mkdir(parents=True)
    folder.mkdir(parents=True)
    up = Path(*[".."] * (2 + len(Path(subfolder).parts)))
    for index, path in enumerate(sorted(p for p in checkpoint.iterdir() if p.is_file())):
        blob = repo / "blobs" / f"blob{index:04d}"
        shutil.copyfile(path, blob)
        (folder / path.name).symlink_to(up / "blobs" / blob.name)
    return repo, folder


def test_a_checkpoint_in_a_folder_of_a_hub_snapshot_prepares(checkpoint, tmp_path):
    # A repository holding its model in a subfolder: its files link to ../../../blobs.
    _, folder = _hub_repository(tmp_path, checkpoint, "text_model")
    check_links(folder)
    assert read_assets(folder, VOCAB_SIZE).chat_template == read_assets(checkpoint, VOCAB_SIZE).chat_template


def test_a_local_folder_linking_into_a_hub_cache_prepares(checkpoint, tmp_path):
    # huggingface_hub's --local-dir before 0.23 linked large files into the cache's blobs.
    repo, _ = _hub_repository(tmp_path / "cache", checkpoint)
    local = tmp_path / "local"
    local.mkdir()
    for path in sorted((repo / "snapshots" / "0123abcd").iterdir()):
        (local / path.name).symlink_to(path.resolve())
    check_links(local)
    assert load_checkpoint(local).architecture.vocab_size == VOCAB_SIZE
