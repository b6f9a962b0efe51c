"""The package's shape: one import name, layers (import-linter, in pyproject.toml), no cycles.

Layers say who may import whom; a cycle is refused even inside one layer, function-level imports
included (grimp reads every import statement of a module, wherever it stands).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_around_a_cycle() -> None:
    graph = grimp.build_graph("jetcrawl", include_external_packages=False)
    assert "jetcrawl.worker.politeness" in graph.modules, "the linked service folders are seen"
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    assert cycles(graph) == []
    graph.add_import(importer="a.z", imported="a.x")
    assert cycles(graph) == [["a.x", "a.y", "a.z"]]


def test_the_service_folders_are_subpackages_of_the_one_import_name() -> None:
    for name in ("dispatcher", "worker", "registry", "otel"):
        link = ROOT / "jetcrawl" / name
        assert link.is_symlink() and link.resolve() == ROOT / name, name
    assert not (ROOT / "nats" / "__init__.py").exists(), "nats/ holds configs: no package"


def test_the_wheel_installs_one_import_name(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp_path, ROOT],
        check=True,
    )
    [wheel] = tmp_path.glob("jetcrawl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"jetcrawl"}
    assert "jetcrawl/worker/politeness.py" in names, "the links' targets, as files"
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-t", target, wheel],
        check=True,
    )
    probe = (
        "import sys, importlib.util; sys.path.insert(0, sys.argv[1]);"
        "import jetcrawl.worker.politeness as p; print(p.__file__);"
        "print(importlib.util.find_spec('worker'), importlib.util.find_spec('registry'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(target)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert out[0].startswith(str(target)), out
    assert out[1] == "None None", "no top-level worker or registry"
