"""The tiny example contract (examples/contract-tiny.json) prepared into a signed core by the
contract-driven generator (`helios.ignition.contract_core`), once per test session and base
directory (the engine and server tests share it), plus helpers that read what it computes."""

from __future__ import annotations

from pathlib import Path

from helios.contract import PreparedContract
from support.server_core import TinyCore

REPO = Path(__file__).resolve().parents[2]
TINY_CONTRACT = REPO / "examples" / "contract-tiny.json"
NAMESPACE = "test.helios/example-core"


def example_core(base: Path) -> TinyCore:
    """Prepared by `helios contract example-core` (the CLI's own entry point, in this process)."""
    from helios.cli.main import main
    from helios.core.keys import SigningKey, write_key_pair

    root = Path(base) / "helios-example-core"
    prepared = PreparedContract.from_json(TINY_CONTRACT.read_text())
    core = TinyCore(root / "example.core", root / "publisher.key.pub", NAMESPACE, prepared.contract.served_id)
    if core.path.is_file():
        return core
    root.mkdir(parents=True, exist_ok=True)
    key_path = root / "publisher.key"
    if not key_path.is_file():
        write_key_pair(key_path, SigningKey.generate(), [NAMESPACE])
    scratch = root / "example.core.partial"
    code = main(["contract", "example-core", str(TINY_CONTRACT), "-o", str(scratch), "--key", str(key_path),
                 "--namespace", NAMESPACE, "--seed", "7"])
    assert code == 0, code
    scratch.rename(core.path)
    return core


def open_example(core: TinyCore):
    from helios.core.reader import open_core

    return open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
