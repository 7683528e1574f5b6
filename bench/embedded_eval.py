"""Held-out evaluation of the embedded default model through the real server and the `openai`
client (not a test): arithmetic answers, tool calls, and reasoning kept in the reasoning field.

Starts `helios serve` on a free loopback port (with no core: the embedded model, prepared into a
temporary cache), sends held-out prompts that are not in the training set (greedy), and prints:
arithmetic exact-answer accuracy, the share of tool-requiring prompts answered with a call of the
right tool whose arguments are valid under the tool's schema, and the share of answers whose
visible content holds no reasoning markup while the reasoning field is non-empty.

    .venv/bin/python bench/embedded_eval.py [--per-kind 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training"))

from default_model_conversation import ToolCall  # noqa: E402
from default_model_data import heldout_conversations, training_conversations  # noqa: E402
from default_model_eval import ARITHMETIC_KINDS, eval_items  # noqa: E402

from helios.embedded import default_tools  # noqa: E402

TRAIN_SEED, TRAIN_COUNT = 0, 64000


def start_server(cache: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, HELIOS_CACHE=str(cache), PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "helios.cli.main", "serve", "--port", "0"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    for line in process.stdout:
        if "http://" in line:
            url = "http://" + line.split("http://", 1)[1].split()[0].rstrip(".,")
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        return process, url
                except httpx.HTTPError:
                    time.sleep(0.2)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise RuntimeError("the server did not start")


def valid_arguments(arguments: str, tool: dict) -> bool:
    try:
        values = json.loads(arguments)
    except ValueError:
        return False
    schema = tool["function"]["parameters"]
    if not isinstance(values, dict) or set(schema.get("required", ())) - set(values):
        return False
    kinds = {"string": str, "number": (int, float), "integer": int, "boolean": bool}
    return all(isinstance(values[k], kinds.get(schema["properties"][k]["type"], object))
               for k in values if k in schema["properties"])


def evaluate(client: OpenAI, model: str, items) -> dict[str, list[bool]]:
    tools = {t["function"]["name"]: t for t in default_tools()}
    results: dict[str, list[bool]] = {"arithmetic": [], "tool_call": [], "reasoning_only_in_field": []}
    for item in items:
        kwargs = {"tools": list(item.tools)} if item.tools else {}
        response = client.chat.completions.create(model=model, messages=list(item.messages), temperature=0,
                                                  max_tokens=200, **kwargs)
        message = response.choices[0].message
        if isinstance(item.expected, ToolCall):
            calls = message.tool_calls or []
            results["tool_call"].append(bool(calls) and calls[0].function.name == item.expected.name
                                        and valid_arguments(calls[0].function.arguments, tools[item.expected.name]))
            continue
        content = message.content or ""
        reasoning = getattr(message, "reasoning_content", None) or ""
        results["reasoning_only_in_field"].append(bool(reasoning) and "<think>" not in content
                                                  and "</think>" not in content)
        if item.kind in ARITHMETIC_KINDS:
            numbers = [part.split()[0].rstrip(".") for part in content.split("= ")[1:] if part.split()]
            results["arithmetic"].append(bool(numbers) and numbers[-1] == item.expected)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=30, help="held-out conversations per task kind")
    args = parser.parse_args()
    tools = default_tools()
    seen = {c.first_user_text for c in training_conversations(TRAIN_SEED, TRAIN_COUNT, tools)}
    conversations = heldout_conversations(TRAIN_SEED, args.per_kind, tools, seen)
    items = [i for i in eval_items(conversations)
             if i.kind in ARITHMETIC_KINDS or isinstance(i.expected, ToolCall) or i.kind in ("metric", "clock")]
    with tempfile.TemporaryDirectory() as cache:
        process, url = start_server(Path(cache))
        try:
            client = OpenAI(base_url=url + "/v1", api_key="unused")
            model = client.models.list().data[0].id
            started = time.monotonic()
            results = evaluate(client, model, items)
            elapsed = time.monotonic() - started
        finally:
            process.terminate()
            process.wait(30)
    print(f"{len(items)} held-out prompts through {url} in {elapsed:.0f} s")
    for name, outcomes in results.items():
        print(f"{name:24s} {sum(outcomes)}/{len(outcomes)} = {sum(outcomes) / max(1, len(outcomes)):.1%}")


if __name__ == "__main__":
    main()
