"""The package's shape: no import cycles, and the paper's files free of speed machinery (STYLE.md)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def modules() -> dict[str, Path]:
    out = {}
    for file in (SRC / "torchbert").rglob("*.py"):
        parts = list(file.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = file
    return out


def imports(name: str, file: Path, known: set[str]) -> set[str]:
    """Every torchbert module `name` imports, at the top or inside a function."""
    package = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = {f"{target}.{a.name}" for a in node.names} & known
            found |= names or ({target} & known)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & known
    return found - {name}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_package_has_no_import_cycles():
    mods = modules()
    graph = {name: imports(name, file, set(mods)) for name, file in mods.items()}
    # the package's lazy __init__ names everything; it is an entry point, not a dependency
    graph = {name: deps - {"torchbert"} for name, deps in graph.items()}
    assert "torchbert.data.masking" in graph["torchbert.data.shards"]  # the walk sees real imports
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_cycle_finder_finds_cycles():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", ["model.py", "heads.py"])
def test_the_papers_files_hold_no_speed_machinery(name):
    text = (SRC / "torchbert" / name).read_text(encoding="utf-8")
    for marker in ("autograd.Function", "device.type", "is_compiling", "is_autocast", "numpy", "setattr("):
        assert marker not in text, f"{name} uses {marker}"
