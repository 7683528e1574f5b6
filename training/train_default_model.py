"""Train Helios's embedded default model from scratch on seeded synthetic conversations.

    .venv/bin/python training/train_default_model.py            # full run, writes the package data

Steps: generate conversations (default_model_data) -> train a byte-level BPE on part of them ->
tokenize every conversation through the shipped chat template with loss only on assistant tokens ->
train a small LlamaForCausalLM with AdamW (warmup + cosine) -> write the checkpoint directory ->
reload the stored (bfloat16) weights and report greedy held-out accuracy and the weights' SHA-256.

Determinism: one seed drives data, tokenizer and initialisation; the script fixes the thread
counts (torch, interop, tokenizers) and enables torch's deterministic algorithms, so the same
seed and options on the same machine and library versions give a byte-identical model.safetensors.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import default_model_checkpoint as checkpoint  # noqa: E402
import default_model_data as data  # noqa: E402
import default_model_eval as evaluation  # noqa: E402
from default_model_render import ChatRenderer, Example, encode_conversations, load_template_text  # noqa: E402
from default_model_tokenizer import PAD_TOKEN, train_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "src" / "helios" / "embedded" / "default_model"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every knob of a run; the defaults are the shipped model's."""

    seed: int = 0
    conversations: int = 70_000
    tokenizer_conversations: int = 6_000
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    batch_size: int = 8
    lr: float = 7e-4
    warmup_steps: int = 100
    weight_decay: float = 0.05
    bf16_autocast: bool = False
    heldout_per_kind: int = 80
    show_failures: int = 2
    eval_dtype: str = "float32"
    evaluate_only: bool = False
    threads: int = 1
    device: str = "cpu"
    out: str = str(DEFAULT_OUT)

    @property
    def geometry(self) -> dict:
        return {
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "vocab_size": self.vocab_size,
        }


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def make_deterministic(config: TrainConfig) -> None:
    torch.set_num_threads(config.threads)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already fixed by an earlier run in this process
            pass
    if config.device == "cpu":  # CUDA would also need CUBLAS_WORKSPACE_CONFIG; only CPU runs ship
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(config.seed)


def build_model(config: TrainConfig, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    values = checkpoint.llama_config_dict(config.geometry, tokenizer)
    for key in ("architectures", "dtype", "torch_dtype", "rope_scaling", "rope_theta"):
        values.pop(key)
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(LlamaConfig(**values, attn_implementation="sdpa"))
    return model.to(device=config.device, dtype=torch.float32)


def batches(examples: list[Example], config: TrainConfig) -> list[list[Example]]:
    """Fixed-size batches of similar length (sorted within windows of 64 batches), in seeded order."""
    rng = random.Random(f"helios-default-model-batches-{config.seed}")
    window = config.batch_size * 64
    result = []
    for start in range(0, len(examples), window):
        chunk = sorted(examples[start : start + window], key=lambda e: len(e.ids))
        result += [chunk[i : i + config.batch_size] for i in range(0, len(chunk), config.batch_size)]
    rng.shuffle(result)
    return [batch for batch in result if len(batch) == config.batch_size]


def batch_tensors(batch: list[Example], pad_id: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and next-token targets (-100 where no loss is taken)."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    targets = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, example in enumerate(batch):
        ids[row, : len(example.ids)] = torch.tensor(example.ids)
        trained = torch.tensor(example.trained[1:], dtype=torch.bool)
        next_ids = torch.tensor(example.ids[1:])
        targets[row, : len(example.ids) - 1] = torch.where(trained, next_ids, torch.full_like(next_ids, -100))
    return ids.to(device), targets.to(device)


def lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer_for(model, config: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98), eps=1e-8)


def train(model, examples: list[Example], pad_id: int, config: TrainConfig) -> None:
    """Optimise `model` in place over one pass of `examples`."""
    plan = batches(examples, config)
    optimizer = optimizer_for(model, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, len(plan), config.warmup_steps))
    log(f"training: {len(plan)} steps of {config.batch_size} conversations")
    started, seen_tokens, running = time.perf_counter(), 0, []
    model.train()
    for step, batch in enumerate(plan):
        ids, targets = batch_tensors(batch, pad_id, config.device)
        with torch.autocast(config.device.split(":")[0], dtype=torch.bfloat16, enabled=config.bf16_autocast):
            hidden = model.model(input_ids=ids).last_hidden_state
            chosen = targets != -100
            logits = model.lm_head(hidden[chosen])
        loss = torch.nn.functional.cross_entropy(logits.float(), targets[chosen])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        seen_tokens += ids.numel()
        running.append(loss.item())
        if (step + 1) % 50 == 0 or step + 1 == len(plan):
            elapsed = time.perf_counter() - started
            log(f"step {step + 1}/{len(plan)} loss {sum(running) / len(running):.4f} "
                f"lr {schedule.get_last_lr()[0]:.2e} {elapsed:.0f}s {seen_tokens / elapsed:.0f} tok/s")
            running = []


def evaluate(directory: Path, renderer: ChatRenderer, tokenizer, heldout, config: TrainConfig) -> dict[str, float]:
    """Greedy held-out accuracy of the checkpoint as stored, computed in `config.eval_dtype`."""
    from transformers import LlamaForCausalLM

    dtype = getattr(torch, config.eval_dtype)
    model = LlamaForCausalLM.from_pretrained(directory, dtype=dtype).to(config.device).eval()
    items = evaluation.eval_items(heldout)
    prompts = [renderer.render(item.messages, item.tools, add_generation_prompt=True) for item in items]
    completions = evaluation.greedy_completions(model, tokenizer, prompts, max_new_tokens=160)
    shown: dict[str, int] = {}
    for item, text in zip(items, completions):
        if not evaluation.is_correct(item, evaluation.parse_output(text)) and shown.get(item.kind, 0) < config.show_failures:
            shown[item.kind] = shown.get(item.kind, 0) + 1
            log(f"miss {item.kind}: asked {item.messages[-1].get('content')!r} expected {item.expected!r} got {text!r}")
    return evaluation.score(items, completions)


def run(config: TrainConfig) -> str:
    """The whole pipeline; returns the SHA-256 of the written model.safetensors."""
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    make_deterministic(config)
    tools = checkpoint_tools()
    conversations = data.training_conversations(config.seed, config.conversations, tools)
    template = load_template_text()
    renderer = ChatRenderer(template)
    corpus = [renderer.render(c.messages, c.tools) for c in conversations[: config.tokenizer_conversations]]
    tokenizer = train_tokenizer(corpus, config.vocab_size)
    examples = encode_conversations(renderer, tokenizer, conversations)
    num_tokens = sum(len(e.ids) for e in examples)
    log(f"data: {len(examples)} conversations, {num_tokens} tokens, "
        f"{sum(sum(e.trained) for e in examples)} trained tokens, longest {max(len(e.ids) for e in examples)}")
    model = build_model(config, tokenizer)
    log(f"model: {sum(p.numel() for p in model.parameters())} parameters, geometry {config.geometry}")
    train(model, examples, tokenizer.token_to_id(PAD_TOKEN), config)
    out = Path(config.out)
    digest = checkpoint.write_checkpoint(out, model.state_dict(), config.geometry, tokenizer, template)
    log(f"wrote {out} (model.safetensors {(out / 'model.safetensors').stat().st_size} bytes)")
    metrics: dict[str, float] = {}
    if config.heldout_per_kind:
        seen = {c.first_user_text for c in conversations}
        heldout = data.heldout_conversations(config.seed, config.heldout_per_kind, tools, seen)
        metrics = evaluate(out, renderer, tokenizer, heldout, config)
        for group, value in metrics.items():
            log(f"held-out {group}: {value:.3f}")
    runtime = {"wall_s": round(time.perf_counter() - wall_started), "cpu_s": round(time.process_time() - cpu_started)}
    log(f"runtime {runtime['wall_s']}s wall, {runtime['cpu_s']}s CPU (data, tokenizer, training, evaluation)")
    checkpoint.write_record(out, config_record(config), metrics, runtime)
    log(f"tokenizer.json sha256 {checkpoint.file_sha256(out / 'tokenizer.json')}")
    log(f"model.safetensors sha256 {digest}")
    return digest


def evaluate_only(config: TrainConfig) -> dict[str, float]:
    """Held-out accuracy of the checkpoint already in `config.out` (no training, nothing written);
    the training conversations are regenerated from the seed to keep held-out prompts apart."""
    from tokenizers import Tokenizer

    make_deterministic(config)
    tools = checkpoint_tools()
    seen = {c.first_user_text for c in data.training_conversations(config.seed, config.conversations, tools)}
    heldout = data.heldout_conversations(config.seed, config.heldout_per_kind, tools, seen)
    out = Path(config.out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    metrics = evaluate(out, ChatRenderer(load_template_text()), tokenizer, heldout, config)
    for group, value in metrics.items():
        log(f"held-out ({config.eval_dtype}) {group}: {value:.3f}")
    return metrics


def config_record(config: TrainConfig) -> dict:
    """The run's options as recorded beside the weights (the output path left out)."""
    import tokenizers
    import transformers

    record = {key: value for key, value in dataclasses.asdict(config).items() if key not in ("out", "evaluate_only")}
    record["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]}
    return record


def checkpoint_tools() -> list[dict]:
    sys.path.insert(0, str(REPO / "src"))
    from helios.embedded import default_tools

    return default_tools()


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = {"int": int, "float": float, "str": str}[field.type]
            parser.add_argument(flag, type=kind, default=field.default)
    return TrainConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    log(f"config: {config}")
    if config.evaluate_only:
        evaluate_only(config)
    else:
        run(config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
