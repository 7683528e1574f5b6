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
    from helios.core.keys import SigningKey, load_signing_key, write_key_pair
    from helios.ignition.contract_core import write_contract_core

    root = Path(base) / "helios-example-core"
    prepared = PreparedContract.from_json(TINY_CONTRACT.read_text())
    core = TinyCore(root / "example.core", root / "publisher.key.pub", NAMESPACE, prepared.contract.served_id)
    if core.path.is_file():
        return core
    root.mkdir(parents=True, exist_ok=True)
    key_path = root / "publisher.key"
    if key_path.is_file():
        key = load_signing_key(key_path)
    else:
        key = SigningKey.generate()
        write_key_pair(key_path, key, [NAMESPACE])
    scratch = root / "example.core.partial"
    write_contract_core(prepared, scratch, key, NAMESPACE, seed=7)
    scratch.rename(core.path)
    return core


def open_example(core: TinyCore):
    from helios.core.reader import open_core

    return open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
