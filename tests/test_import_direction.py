"""The README's import direction, checked on the source: every module under src/helios is parsed
with `ast` (imports inside functions and `TYPE_CHECKING` blocks count too) and each import of a
helios module is judged by the importer's top-level package (README, Layout):

    server -> frontend -> runtime -> core -> contract   (a package may use any to its right)
    abi -> contract;  ignition -> contract, core, abi;  runtime -> abi, never ignition
    embedded -> ignition, abi, core, contract;  cli -> anything
    nothing but cli imports server, embedded or cli;  helios.errors is shared by all

and the rooms (immediate sub-packages and modules) of `runtime` and `frontend` import each other
without cycles. The checker's own tests feed it synthetic sources, so a broken rule cannot pass.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
SHARED = {"helios", "errors"}
UPSTREAM = {
    "contract": set(),
    "core": {"contract"},
    "abi": {"contract"},
    "ignition": {"contract", "core", "abi"},
    "runtime": {"core", "contract", "abi"},
    "frontend": {"runtime", "core", "contract"},
    "server": {"frontend", "runtime", "core", "contract"},
    "embedded": {"ignition", "abi", "core", "contract"},
    "errors": set(),
    "helios": set(),
}
EVERYTHING = set(UPSTREAM) | {"cli"}
ALLOWED = {**UPSTREAM, "cli": EVERYTHING}
ROOMED = ("runtime", "frontend")


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted module name (a module, or the package an imported name comes from)
    line: int


def imports_of(module: str, source: str, *, is_package: bool, known: set[str]) -> list[Import]:
    """Every helios import in one module's source, relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.append(Import(module, base, node.lineno))
            named = (f"{base}.{alias.name}" for alias in node.names)
            found += [Import(module, name, node.lineno) for name in named if name in known]
    return [imp for imp in found if imp.target == "helios" or imp.target.startswith("helios.")]


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "helios"


def direction_violations(imports: list[Import]) -> list[str]:
    """Imports that point against the layering; an unknown top-level package is one too."""
    bad = []
    for imp in imports:
        src, dst = layer(imp.importer), layer(imp.target)
        if src not in ALLOWED:
            bad.append(f"{imp.importer}: package {src!r} has no rule in the README's Layout")
        elif src != dst and dst not in SHARED and dst not in ALLOWED[src]:
            bad.append(f"{imp.importer}:{imp.line} imports {imp.target} ({src} may not use {dst})")
    return bad


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] in ROOMED else None


def room_cycle(imports: list[Import]) -> list[str]:
    """One cycle between rooms of the same package, as 'a -> b (importer:line)' steps; [] if none."""
    edges: dict[tuple[str, str], dict[str, Import]] = {}
    for imp in imports:
        a, b = room(imp.importer), room(imp.target)
        if a and b and a != b and layer(imp.importer) == layer(imp.target):
            edges.setdefault((layer(imp.importer), a), {}).setdefault(b, imp)
    state: dict[tuple[str, str], int] = {}  # 1 on the current path, 2 done
    path: list[tuple[str, str]] = []

    def visit(node: tuple[str, str]) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, {})):
            nxt = (node[0], target)
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                return [f"{p[0]}.{p[1]} -> {q[1]} ({_where(edges[p][q[1]])})" for p, q in zip(cycle, cycle[1:])]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def _where(imp: Import) -> str:
    return f"{imp.importer}:{imp.line}"


def scan(root: Path) -> list[Import]:
    files = {}
    for path in sorted((root / "helios").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    known = set(files)
    found = []
    for module, (path, is_package) in files.items():
        found += imports_of(module, path.read_text(encoding="utf-8"), is_package=is_package, known=known)
    return found


def test_the_source_follows_the_import_direction():
    imports = scan(SRC)
    assert len({imp.importer for imp in imports}) > 200  # the scan saw the tree, not an empty folder
    assert direction_violations(imports) == []


def test_the_rooms_of_runtime_and_frontend_have_no_cycles():
    imports = scan(SRC)
    assert {room(imp.importer) for imp in imports} >= {"records", "scheduling", "execution", "decoding", "preparation"}
    assert room_cycle(imports) == []


def _synthetic(module: str, source: str, *, is_package: bool = False, known: tuple[str, ...] = ()) -> list[Import]:
    return imports_of(module, source, is_package=is_package, known=set(known))


def test_checker_flags_runtime_importing_ignition_even_inside_a_function():
    source = "import os\n\ndef load():\n    from helios.ignition.export import prepare_core\n"
    bad = direction_violations(_synthetic("helios.runtime.loading.model", source))
    assert bad == ["helios.runtime.loading.model:4 imports helios.ignition.export (runtime may not use ignition)"]


def test_checker_flags_upstream_imports_of_server_cli_and_frontend():
    cases = [
        ("helios.frontend.session", "from helios.server import app"),
        ("helios.runtime.engine", "import helios.frontend.responses.output"),
        ("helios.core.keys", "from helios.runtime.records import plan"),
        ("helios.server.app", "from helios.cli import main"),
        ("helios.frontend.session", "from helios.abi import sampling_cpu"),
        ("helios.server.serve", "from helios.embedded.prepared import embedded_core"),
        ("helios.contract.settings", "from helios.core import frames"),
    ]
    for module, source in cases:
        assert len(direction_violations(_synthetic(module, source))) == 1, (module, source)


def test_checker_allows_the_documented_directions():
    cases = {
        "helios.server.app": "from helios.runtime.records.stats import WorkerStats\nfrom helios.core import keys",
        "helios.frontend.session": "from helios.contract import serving_pb2\nfrom helios.errors import RequestError",
        "helios.ignition.export": "from helios.abi import registry\nfrom helios.core import keys",
        "helios.embedded.prepared": "from helios.ignition.export import prepare_core",
        "helios.cli.serve_cmd": "from helios.server.serve import run\nfrom helios.embedded import prepared",
    }
    for module, source in cases.items():
        assert direction_violations(_synthetic(module, source)) == [], (module, source)


def test_checker_resolves_relative_imports_and_rejects_unknown_packages():
    relative = _synthetic("helios.runtime.records", "from ...frontend import session", is_package=True)
    assert [imp.target for imp in relative] == ["helios.frontend"]
    assert len(direction_violations(relative)) == 1
    assert direction_violations(_synthetic("helios.widgets.x", "from helios.core import keys")) == [
        "helios.widgets.x: package 'widgets' has no rule in the README's Layout"
    ]


def test_cycle_checker_finds_a_cycle_between_rooms_through_a_name_import():
    known = ("helios.runtime.cache.pages", "helios.runtime.scheduling.queues")
    imports = _synthetic("helios.runtime.cache.pages", "from helios.runtime.scheduling import queues", known=known)
    imports += _synthetic("helios.runtime.scheduling.steps", "from helios.runtime.cache.pages import Page")
    assert room_cycle(imports) == [
        "runtime.cache -> scheduling (helios.runtime.cache.pages:1)",
        "runtime.scheduling -> cache (helios.runtime.scheduling.steps:1)",
    ]
    assert room_cycle(imports[-1:]) == []
