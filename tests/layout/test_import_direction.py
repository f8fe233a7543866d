"""The layout's import rule (DESIGN.md): rlmm <- rsm <- tierlog.audit <- tierlog.agent (which hosts the audit
loop), rsm <- tierlog.pipeline, all <- tierlog.cli. Nothing imports the CLI, only tests, bench and the demo import
dev, and no package imports one above it or forms a cycle. Every import counts, including those inside functions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Each layer may import only layers listed before it (and itself).
LAYERS = ["rlmm", "rsm", "tierlog.audit", "tierlog.migration", "tierlog.agent", "tierlog.pipeline", "tierlog.cli"]
ALLOWED = {
    "tierlog": set(),  # the namespace's own __init__ imports nothing of ours
    "rlmm": {"rlmm"},
    "rsm": {"rlmm", "rsm"},
    "tierlog.agent": {"rlmm", "rsm", "tierlog.audit", "tierlog.migration", "tierlog.agent"},
    "tierlog.audit": {"rlmm", "rsm", "tierlog.audit"},
    "tierlog.migration": {"rlmm", "tierlog.migration"},
    "tierlog.pipeline": {"rlmm", "rsm", "tierlog.pipeline"},
    "tierlog.cli": {"rlmm", "rsm", "tierlog.agent", "tierlog.audit", "tierlog.migration", "tierlog.pipeline",
                    "tierlog.cli"},
}
OURS = ("rlmm", "rsm", "tierlog", "dev")


def layer_of(module: str) -> str | None:
    for layer in sorted(LAYERS, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    if module == "tierlog":
        return "tierlog"
    return module.split(".")[0] if module.split(".")[0] in OURS else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield node.lineno, target
            # `from tierlog import cli` imports tierlog.cli
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def library_files() -> list[Path]:
    return sorted(p for root in ("rlmm", "rsm", "tierlog") for p in (REPO / root).rglob("*.py")
                  if "proto" not in p.relative_to(REPO).parts)


def test_the_packages_exist_where_the_layout_says() -> None:
    for package in ("rlmm", "rsm", "tierlog/agent", "tierlog/audit", "tierlog/cli", "tierlog/pipeline", "dev"):
        assert (REPO / package).is_dir(), package
    # The generic top-level names must not come back: installed, they would shadow other projects.
    assert not (REPO / "agent").exists() and not (REPO / "pipeline").exists()


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_flow_one_way(path: Path) -> None:
    importer = layer_of(module_name(path))
    assert importer in ALLOWED, f"{path} is outside the layered packages"
    wrong = []
    for line, target in imports_of(path):
        layer = layer_of(target)
        if layer is None or layer == "tierlog":
            continue
        if layer == "dev":
            wrong.append(f"line {line}: {target} (only tests, bench and the demo import dev)")
        elif layer not in ALLOWED[importer]:
            wrong.append(f"line {line}: {target} ({importer} must not import {layer})")
    assert not wrong, f"{path.relative_to(REPO)} imports upward or sideways:\n" + "\n".join(wrong)


def test_nothing_outside_the_cli_imports_it() -> None:
    importers = [
        f"{p.relative_to(REPO)}:{line}"
        for root in ("rlmm", "rsm", "tierlog", "bench", "dev")
        for p in (REPO / root).rglob("*.py")
        if "cli" not in p.relative_to(REPO).parts[:2]
        for line, target in imports_of(p)
        if layer_of(target) == "tierlog.cli"
    ]
    assert not importers, f"these import the CLI: {importers}"


def test_no_import_cycles_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    files = library_files()
    known = {module_name(p) for p in files}
    for path in files:
        graph[module_name(path)] = {t for _, t in imports_of(path) if t in known and t != module_name(path)}
    # A package's __init__ re-exporting its modules is not a cycle of meaning; ignore edges into a parent.
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    visiting: set[str] = set()
    done: set[str] = set()
    trail: list[str] = []

    def visit(node: str) -> None:
        if node in done:
            return
        if node in visiting:
            cycle = [*trail[trail.index(node):], node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        visiting.add(node)
        trail.append(node)
        for target in sorted(graph.get(node, ())):
            visit(target)
        trail.pop()
        visiting.discard(node)
        done.add(node)

    for node in sorted(graph):
        visit(node)
