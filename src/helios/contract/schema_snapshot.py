"""Descriptor snapshot of the wire schema, and the compatibility rules between two snapshots.

The committed snapshot (proto/descriptor_snapshot.json) records, for every message and enum in
every proto/helios/contract/*.proto file, what each field number and enum number means. A
schema change is compatible when every recorded number either keeps its meaning (name, type,
label, presence) or is removed *and* reserved (number and name). Adding fields, values,
messages and enums is always compatible. Tests compare the .proto files against the snapshot;
after a compatible change, refresh it with ``scripts/refresh_descriptor_snapshot.sh``, which
refuses to record an incompatible change.

Building a snapshot compiles the .proto files with the pinned grpcio-tools protoc (test extra).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO / "proto"
SCHEMA_DIR = PROTO_ROOT / "helios" / "contract"
SNAPSHOT = PROTO_ROOT / "descriptor_snapshot.json"
_TYPES = {v: k[len("TYPE_"):].lower() for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()}


def compile_schema(proto_root: Path = PROTO_ROOT, files: list[Path] | None = None) -> descriptor_pb2.FileDescriptorSet:
    """Compile the contract .proto files under `proto_root` into a FileDescriptorSet."""
    files = files or sorted((proto_root / "helios" / "contract").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "schema.pb"
        command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_root}", f"--descriptor_set_out={out}"]
        subprocess.run(command + [str(f) for f in files], check=True, capture_output=True, text=True)
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def build_snapshot(files: descriptor_pb2.FileDescriptorSet) -> dict:
    """The snapshot dictionary of a compiled schema (stable order, JSON-serializable)."""
    messages: dict[str, dict] = {}
    enums: dict[str, dict] = {}
    sources: list[str] = []
    for file in files.file:
        sources.append(file.name)
        prefix = f".{file.package}" if file.package else ""
        for enum in file.enum_type:
            enums[f"{prefix}.{enum.name}"[1:]] = _enum(enum)
        for message in file.message_type:
            _collect(message, prefix, messages, enums)
    return {"files": sorted(sources), "messages": dict(sorted(messages.items())), "enums": dict(sorted(enums.items()))}


def _collect(message, prefix: str, messages: dict, enums: dict) -> None:
    name = f"{prefix}.{message.name}"
    fields = {}
    for field in message.field:
        fields[str(field.number)] = {
            "name": field.name,
            "type": _TYPES[field.type],
            "type_name": field.type_name.lstrip("."),
            "repeated": field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
            "explicit_presence": field.proto3_optional,
        }
    messages[name[1:]] = {
        "fields": fields,
        "reserved_numbers": [[r.start, r.end - 1] for r in message.reserved_range],
        "reserved_names": sorted(message.reserved_name),
    }
    for enum in message.enum_type:
        enums[f"{name}.{enum.name}"[1:]] = _enum(enum)
    for nested in message.nested_type:
        _collect(nested, name, messages, enums)


def _enum(enum) -> dict:
    return {
        "values": {str(v.number): v.name for v in enum.value},
        "reserved_numbers": [[r.start, r.end] for r in enum.reserved_range],
        "reserved_names": sorted(enum.reserved_name),
    }


def _reserved(entry: dict, number: int, name: str) -> bool:
    in_range = any(low <= number <= high for low, high in entry["reserved_numbers"])
    return in_range and name in entry["reserved_names"]


def compatibility_problems(old: dict, new: dict) -> list[str]:
    """Every way `new` changes the meaning of a number recorded in `old` (empty: compatible)."""
    problems = []
    for name, entry in old["messages"].items():
        current = new["messages"].get(name)
        if current is None:
            problems.append(f"message {name} was removed; keep it (reserve its fields) instead")
            continue
        for number, field in entry["fields"].items():
            now = current["fields"].get(number)
            if now is None:
                if not _reserved(current, int(number), field["name"]):
                    problems.append(f"{name} field {number} ({field['name']}) was removed without reserving its number and name")
            elif now != field:
                problems.append(f"{name} field {number} changed meaning: {field} -> {now}")
    for name, entry in old["enums"].items():
        current = new["enums"].get(name)
        if current is None:
            problems.append(f"enum {name} was removed; keep it (reserve its values) instead")
            continue
        for number, value in entry["values"].items():
            now = current["values"].get(number)
            if now is None:
                if not _reserved(current, int(number), value):
                    problems.append(f"{name} value {number} ({value}) was removed without reserving its number and name")
            elif now != value:
                problems.append(f"{name} value {number} changed meaning: {value} -> {now}")
    return problems


def render(snapshot: dict) -> str:
    return json.dumps(snapshot, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check or refresh proto/descriptor_snapshot.json.")
    parser.add_argument("--write", action="store_true", help="record the current schema (refused if incompatible)")
    args = parser.parse_args(argv)
    current = build_snapshot(compile_schema())
    recorded = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {"messages": {}, "enums": {}}
    problems = compatibility_problems(recorded, current)
    for problem in problems:
        print(f"incompatible: {problem}", file=sys.stderr)
    if problems:
        return 1
    if args.write:
        SNAPSHOT.write_text(render(current))
        print(f"wrote {SNAPSHOT.relative_to(REPO)}")
    elif render(current) != render(recorded):
        print("compatible, but the snapshot is stale: run scripts/refresh_descriptor_snapshot.sh", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
