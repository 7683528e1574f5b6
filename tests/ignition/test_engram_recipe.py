"""An Engram checkpoint (a `transformers` Llama checkpoint plus ``engram.safetensors``, the format of
`helios.ignition.engram`) prepared by `helios prepare` into a core with a host table: greedy tokens
equal the plain reference (the `transformers` model run on ``inputs_embeds`` = its embeddings plus the
projected n-gram rows of the specification's hash, float32) alone and batched, and two tensor-parallel
ranks (gloo, threads) generate what one rank does; bad tables stop prepare with `EngramTableError`
naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helios.cli.main import main
from helios.core.reader import open_core
from helios.ignition.engram import ENGRAM_FILE, EngramTable, EngramTableError, read_engram, write_engram
from helios.runtime.offline import generate
from helios.runtime.parallel.rank_peers import PeerKind, RankOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import GEMMA3, GRANITE, LLAMA3, random_model
from support.chat_checkpoint import VOCAB_SIZE, write_frontend_files
from support.sweeps import in_sweep

NAMESPACE = "test.helios/engram"
PROMPTS = [list(range(3, 23)), [40, 41, 42], [7, 8]]
MAX_TOKENS = 10
HEADS, NGRAM, ROWS, WIDTH = 2, 3, 97, 8
MULTIPLIERS = (11400714819323198485, 13787848793156543929, 10723151780598845931, 15485907386658061715,
               11562461410679940143, 16646288086500911323)
FAST = RankOptions(peers=PeerKind.THREADS, collective_timeout_s=5.0, join_timeout_s=60.0)


def _engram_checkpoint(directory: Path, family):
    sized = type(family)(family.name, family.config_class, family.overrides + (("vocab_size", VOCAB_SIZE),))
    model = random_model(sized, seed=4)
    directory.mkdir(parents=True)
    model.save_pretrained(directory)
    write_frontend_files(directory)
    g = torch.Generator().manual_seed(9)
    hidden = model.config.hidden_size
    write_engram(directory, torch.randn(ROWS, WIDTH, generator=g), torch.randn(hidden, HEADS * WIDTH, generator=g) * 2.0,
                 NGRAM, MULTIPLIERS)
    return directory, model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _engram_checkpoint(tmp_path_factory.mktemp("engram") / "checkpoint", LLAMA3)


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("engram-key") / "publisher.key"
    assert main(["keygen", "-o", str(path)]) == 0
    return path


def _prepare(checkpoint: Path, key: Path, ranks: int, decode_batches: str = "1,4", mixed: bool = True) -> Path:
    path = checkpoint.parent / f"engram-tp{ranks}.core"
    if not path.exists():
        assert main(["prepare", str(checkpoint), "-o", str(path), "--key", str(key), "--namespace", NAMESPACE,
                     "--context-tokens", "64", "--prefill-tokens", "16", "--decode-batches", decode_batches,
                     "--tensor-parallel", str(ranks), "--dtype", "float32", *(() if mixed else ("--no-mixed",)),
                     "--no-logprobs"]) == 0  # no request here (nor in the CUDA test) asks for logprobs
    return path


def _reference(model, engram: EngramTable, prompt: list[int]) -> list[int]:
    """Greedy tokens of the `transformers` model on embeddings plus the projected n-gram rows."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            ids = torch.tensor([tokens])
            rows = torch.stack([engram.table[engram.rows_at(tokens, p)].reshape(-1) for p in range(len(tokens))])
            embeds = model.get_input_embeddings()(ids) + (rows @ engram.proj.T)[None]
            logits = model(inputs_embeds=embeds).logits[0, -1]
            tokens.append(int(torch.argmax(logits)))
    return tokens[len(prompt):]


def _generate(path: Path, key: Path, prompts, ranks: RankOptions | None = None) -> list[list[int]]:
    core = open_core(path, accept=NAMESPACE, trusted_keys=[Path(str(key) + ".pub")])
    runtime = build_runtime(core, RuntimeOptions(ranks=ranks) if ranks else RuntimeOptions())
    try:
        assert runtime.model.weights["w.engram.table"].device.type == "cpu"
        results = generate(runtime.engine, prompts, MAX_TOKENS)
        return [list(r.token_ids) for r in results]
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def one_rank_tokens(checkpoint, key) -> list[list[int]]:
    """The one-rank core's greedy tokens of PROMPTS, batched (checked against the reference, and the
    two ranks' against them)."""
    return _generate(_prepare(checkpoint[0], key, 1), key, PROMPTS)


def test_an_engram_checkpoint_serves_the_reference_tokens_alone_and_batched(checkpoint, key, one_rank_tokens):
    directory, model = checkpoint
    engram = read_engram(directory, model.config.hidden_size, "float32")
    path = _prepare(directory, key, 1)
    core = open_core(path, accept=NAMESPACE, trusted_keys=[Path(str(key) + ".pub")])
    tables = core.prepared.contract.model.host_tables
    assert [(t.name, t.ngram_tokens, t.heads, tuple(t.multipliers)) for t in tables] == [
        ("engram", NGRAM, HEADS, MULTIPLIERS)]
    expected = [_reference(model, engram, prompt) for prompt in PROMPTS]
    assert expected[0] != _plain(model, PROMPTS[0])  # the n-gram rows change the tokens
    assert _generate(path, key, PROMPTS[:1]) == expected[:1]
    assert one_rank_tokens == expected


# Gemma 3 with HELIOS_FAMILY_SERVED_SWEEP=1: its recipe leaves the projection as stored (as Llama's does, whose
# core the test above serves) and its programs scale the lookup before adding the rows (as Granite's do).
@pytest.mark.parametrize("family", in_sweep("HELIOS_FAMILY_SERVED_SWEEP", (GRANITE,), (GEMMA3,)),
                         ids=lambda family: family.name)
def test_a_scaled_input_embedding_takes_the_rows_where_the_reference_does(tmp_path_factory, key, family):
    """Granite multiplies its inputs_embeds (the looked-up embeddings plus the projected rows) by
    embedding_multiplier (4 here), where the programs scale the lookup alone: the prepared projection
    carries the multiplier, so the core serves the reference's tokens (it added the rows unscaled).
    Gemma's scale is part of its lookup (its input embeddings), so its rows are added unscaled. One
    prompt (20 tokens, prefilled in two chunks) and a decode batch of 1, no MIXED program: batching
    engram rows, and mixing them into a decode step, is the Llama test's."""
    directory, model = _engram_checkpoint(tmp_path_factory.mktemp("engram-scaled") / "checkpoint", family)
    engram = read_engram(directory, model.config.hidden_size, "float32")
    prompts = PROMPTS[:1]
    expected = [_reference(model, engram, prompt) for prompt in prompts]
    assert _generate(_prepare(directory, key, 1, decode_batches="1", mixed=False), key, prompts) == expected


def _plain(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0, len(prompt):].tolist()


def test_two_ranks_generate_what_one_rank_generates(checkpoint, key, one_rank_tokens):
    # Decode batches of 4 alone and no MIXED program: the rows each rank stages and its whole projection are
    # what two ranks add; the one-rank core's programs serve the same prompts' other schedules.
    core = _prepare(checkpoint[0], key, 2, decode_batches="4", mixed=False)
    assert _generate(core, key, PROMPTS, FAST) == one_rank_tokens


def _broken(directory: Path, **metadata) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    target = directory.parent / f"broken-{len(list(directory.parent.iterdir()))}"
    shutil.copytree(directory, target)
    tensors = load_file(str(directory / ENGRAM_FILE))
    base = {"ngram_tokens": str(NGRAM), "heads": str(HEADS), "multipliers": ",".join(map(str, MULTIPLIERS))}
    base.update({k: v for k, v in metadata.items() if not k.startswith("tensor_")})
    for name, value in metadata.items():
        if name.startswith("tensor_"):
            tensors[name[len("tensor_"):].replace("_", ".")] = value
    base = {k: v for k, v in base.items() if v is not None}
    save_file(tensors, str(target / ENGRAM_FILE), metadata=base)
    return target


@pytest.mark.parametrize("change, message", [
    ({"heads": None}, "metadata 'heads' is missing"),
    ({"ngram_tokens": "0"}, "'ngram_tokens' must be a positive integer"),
    ({"multipliers": "3,5"}, "2 multipliers; heads x ngram_tokens is 6"),
    ({"multipliers": "2,3,5,7,9,11"}, "odd 64-bit integers, got 2"),
    ({"multipliers": "a,b"}, "comma-separated integers"),
    ({"tensor_engram_proj": torch.zeros(3, 3)}, "engram.proj is (3, 3)"),
    ({"tensor_engram_table": torch.zeros(4, 4, 2)}, "engram.table must be a 2-D"),
])
def test_a_bad_table_stops_prepare_naming_the_problem(checkpoint, key, change, message):
    directory, model = checkpoint
    broken = _broken(directory, **change)
    with pytest.raises(EngramTableError) as error:
        read_engram(broken, model.config.hidden_size, "float32")
    assert message in str(error.value)
    code = main(["prepare", str(broken), "-o", str(broken / "x.core"), "--key", str(key), "--namespace", NAMESPACE])
    assert code == EngramTableError.exit_code and not (broken / "x.core").exists()


def test_an_engram_core_refuses_speculation(checkpoint, key, tmp_path, capsys):
    directory, _ = checkpoint
    code = main(["prepare", str(directory), "-o", str(tmp_path / "x.core"), "--key", str(key), "--namespace",
                 NAMESPACE, "--draft", str(directory)])
    assert code == EngramTableError.exit_code and not (tmp_path / "x.core").exists()
    assert "cannot speculate" in capsys.readouterr().err
