"""The tiny example contract (examples/contract-tiny.json) prepared into a signed core by the
contract-driven generator (`helios.ignition.contract_core`), once per test session and base
directory (the engine and server tests share it; under pytest-xdist, once for all the workers),
plus helpers that read what it computes."""

from __future__ import annotations

from pathlib import Path

from helios.contract import PreparedContract
from support.server_core import TinyCore
from support.shared_prepare import prepared_once, shared_root

REPO = Path(__file__).resolve().parents[2]
TINY_CONTRACT = REPO / "examples" / "contract-tiny.json"
NAMESPACE = "test.helios/example-core"


def example_core(base: Path) -> TinyCore:
    """Prepared by `helios contract example-core` (the CLI's own entry point, in this process)."""
    from helios.cli.main import main
    from helios.core.keys import SigningKey, write_key_pair

    root = shared_root(base) / "helios-example-core"
    prepared = PreparedContract.from_json(TINY_CONTRACT.read_text())
    core = TinyCore(root / "example.core", root / "publisher.key.pub", NAMESPACE, prepared.contract.served_id)

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        contract = _exportable_contract(root)
        key_path = root / "publisher.key"
        if not key_path.is_file():
            write_key_pair(key_path, SigningKey.generate(), [NAMESPACE])
        scratch = root / "example.core.partial"
        code = main(["contract", "example-core", str(contract), "-o", str(scratch), "--key", str(key_path),
                     "--namespace", NAMESPACE, "--seed", "7"])
        assert code == 0, code
        scratch.rename(core.path)

    prepared_once(root, core.path, prepare)
    return core


def _exportable_contract(root: Path) -> Path:
    """The tiny contract, or, on a torch whose program serializer lacks unsigned 16- or 32-bit tensors
    (2.11 has no uint32), a copy with those buffers declared as the signed type of the same width (the
    same words; the generator refuses the original there with the buffer's path)."""
    import torch

    from helios.ignition.contract_core import exportable_dtypes

    known = exportable_dtypes()
    text = TINY_CONTRACT.read_text()
    for dtype, unsigned, signed in ((torch.uint16, "DTYPE_UINT16", "DTYPE_INT16"),
                                    (torch.uint32, "DTYPE_UINT32", "DTYPE_INT32")):
        if dtype not in known:
            text = text.replace(f'"{unsigned}"', f'"{signed}"')
    if text == TINY_CONTRACT.read_text():
        return TINY_CONTRACT
    variant = root / "contract-tiny-signed.json"
    variant.write_text(text)
    return variant


def open_example(core: TinyCore):
    from helios.core.reader import open_core

    return open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
