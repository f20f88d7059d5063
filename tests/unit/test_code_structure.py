"""House rules checked from the source itself (no imports of the code under test):

* the first-party import graph has no cycles, built from every module's own import statements
  (parsed with ast, function-local imports included: a cycle broken only by importing late is
  still a cycle a reader has to hold in their head);
* no hand-written .py outside tests/ is over MAX_LINES lines (the generated specdec/v1/*_pb2*.py
  are excluded: they come from protos/ by `make protos`).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specdec", "orchestrator", "draft_service", "target_service", "http_gateway", "deploy_tools")
MAX_LINES = 450
GENERATED = "specdec/v1/"


def hand_written_sources() -> list[Path]:
    """Every tracked (or new, not ignored) .py outside tests/, minus the generated protobuf modules."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        ROOT / p
        for p in listed
        if not p.startswith("tests/") and not (p.startswith(GENERATED) and "_pb2" in p) and (ROOT / p).is_file()
    ]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def first_party_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported dotted name lands in: itself, else its nearest first-party parent."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imported_names(path: Path, module: str) -> set[str]:
    """Dotted names a module imports, anywhere in its body (functions included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the first-party modules it imports."""
    modules = first_party_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {_resolve(n, modules) for n in imported_names(path, name)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_function_local_imports(tmp_path: Path) -> None:
    """The checker itself: a late (function-local) import that closes a circle is still reported."""
    a = tmp_path / "a.py"
    a.write_text("import b\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from a import x\n    return x\n")
    graph = {"a": {"b"} & set(imported_names(a, "a")), "b": {"a"} & set(imported_names(b, "b"))}
    assert cycles(graph) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_relative_imports_resolve_to_the_package(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "m.py").write_text("from . import n\nfrom .q import r\n")
    assert imported_names(pkg / "m.py", "p.m") >= {"p", "p.n", "p.q", "p.q.r"}


def test_the_first_party_import_graph_has_no_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 50 and graph["orchestrator.generation"], "the graph was not built"
    found = cycles(graph)
    assert not found, "import cycles (make the dependency one-way):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_orchestrator_does_not_import_the_model_engine() -> None:
    """The orchestrator runs no model: what it needs in-process (the n-gram proposer) is pure core."""
    graph = import_graph()
    offenders = {
        m: sorted(t for t in targets if t.startswith("specdec.engine"))
        for m, targets in graph.items()
        if m.startswith("orchestrator")
    }
    assert not {m: t for m, t in offenders.items() if t}


def test_no_hand_written_module_is_over_the_line_limit() -> None:
    sources = hand_written_sources()
    assert any(p.name == "generation.py" for p in sources) and not any("_pb2" in p.name for p in sources)
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in sources
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"over {MAX_LINES} lines (split by responsibility): {too_long}"


@pytest.mark.parametrize("lines,ok", [(MAX_LINES, True), (MAX_LINES + 1, False)])
def test_the_line_limit_counts_lines(tmp_path: Path, lines: int, ok: bool) -> None:
    path = tmp_path / "m.py"
    path.write_text("x = 1\n" * lines)
    assert (len(path.read_text().splitlines()) <= MAX_LINES) is ok
