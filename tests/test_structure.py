"""The package's shape: layers that import only downwards, no import cycles, every module named in the
layout in docs/architecture.md, and the paper's files free of speed machinery (docs/architecture.md, principle 1)."""

import ast
import re
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


def with_packages(name: str, deps: set[str], known: set[str]) -> set[str]:
    """deps, and the package (its __init__) of each dep in another package than `name`'s: importing
    torchbert.tasks.formats from torchbert.eval runs torchbert/tasks/__init__.py first, and whatever it
    imports."""
    out = set(deps)
    for dep in deps:
        parts = dep.split(".")
        for i in range(2, len(parts)):
            package = ".".join(parts[:i])
            if package in known and not (name + ".").startswith(package + "."):
                out.add(package)
    return out


def test_the_package_has_no_import_cycles():
    mods = modules()
    graph = {name: with_packages(name, imports(name, file, set(mods)), set(mods)) for name, file in mods.items()}
    # the package's lazy __init__ names everything; it is an entry point, not a dependency
    graph = {name: deps - {"torchbert"} for name, deps in graph.items()}
    assert "torchbert.data.masking" in graph["torchbert.data.shards"]  # the walk sees real imports
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_cycle_finder_finds_cycles():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    # through a package's __init__: eval.x imports tasks.y, and tasks/__init__ imports tasks.z, which imports eval.x
    known = {"t.eval.x", "t.tasks", "t.tasks.y", "t.tasks.z"}
    graph = {"t.eval.x": with_packages("t.eval.x", {"t.tasks.y"}, known), "t.tasks": {"t.tasks.z"},
             "t.tasks.y": set(), "t.tasks.z": with_packages("t.tasks.z", {"t.eval.x"}, known)}
    assert cycle(graph) == ["t.eval.x", "t.tasks", "t.tasks.z", "t.eval.x"]
    assert with_packages("t.tasks.z", {"t.tasks.y"}, known) == {"t.tasks.y"}  # a sibling: its package is running


@pytest.mark.parametrize("name", ["model.py", "heads.py"])
def test_the_papers_files_hold_no_speed_machinery(name):
    text = (SRC / "torchbert" / name).read_text(encoding="utf-8")
    for marker in ("autograd.Function", "device.type", "is_compiling", "is_autocast", "numpy", "setattr("):
        assert marker not in text, f"{name} uses {marker}"


# Bottom to top. A module may import its own layer and those below it, never one above: the paper's
# files never reach for data or training, the training loop never for an application.
LAYERS = [
    ("foundations", ["errors", "io", "config", "architectures", "settings", "hardware", "probe", "packing", "tokenizer",
                     "losses"]),
    ("models", ["model", "heads", "electra", "baselines", "features", "fast"]),
    ("data", ["data", "tasks", "eval"]),
    ("training", ["train"]),
    ("applications", ["apps"]),
    ("entry points", ["cli", "commands", "__main__"]),
]


def layer(module: str) -> int:
    """The layer of `torchbert.a.b...`: its first part's (the package itself is the top)."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS)
    for i, (_, names) in enumerate(LAYERS):
        if parts[1] in names:
            return i
    raise AssertionError(f"{module} is in no layer: add {parts[1]!r} to LAYERS")


def test_every_module_imports_only_its_own_layer_and_those_below():
    mods = modules()
    wrong = []
    for name, file in sorted(mods.items()):
        for dep in sorted(imports(name, file, set(mods)) - {"torchbert"}):
            if layer(dep) > layer(name):
                wrong.append(f"{name} ({LAYERS[layer(name)][0]}) imports {dep} ({LAYERS[layer(dep)][0]})")
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_sees_a_wrong_import():
    assert layer("torchbert.model") < layer("torchbert.tasks.families") < layer("torchbert.apps.serve")
    with pytest.raises(AssertionError, match="in no layer"):
        layer("torchbert.nowhere")


def test_the_documented_layout_names_every_module():
    """A newcomer finds any file from docs/architecture.md's layout in one guess: each module has its line, under
    its package's line."""
    readme = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = readme.split("**Layout.**", 1)[1].split("```", 2)[1]
    named, package = set(), ""
    for line in block.splitlines():
        if line.startswith("  ") and line[2] != " ":  # a top-level module or package
            word = line.split()[0]
            package = word if word.endswith("/") else ""
            named.add(word.rstrip("/"))
        elif line.startswith("    ") and line[4] != " " and package:  # a module of that package
            named.add(package + line.split()[0])
    files = {str(f.relative_to(SRC / "torchbert")) for f in (SRC / "torchbert").rglob("*.py")
             if f.name not in ("__init__.py", "__main__.py")}
    assert "apps/serve.py" in named and "model.py" in named  # the parse sees the layout
    assert not files - named, f"docs/architecture.md's layout does not name {sorted(files - named)}"
    assert not {n for n in named if n.endswith(".py")} - files, "docs/architecture.md's layout names files that do not exist"


MAX_LINES = 600


def test_no_module_is_longer_than_a_reader_holds():
    """The house rule: no module of src/ above 600 lines; a longer one is split where its parts meet
    (as data/compressed.py and data/plan.py came out of sources.py and pipeline.py)."""
    long = {str(f.relative_to(SRC)): n for f in SRC.rglob("*.py")
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_only_the_architecture_registry_asks_which_architecture_a_model_is():
    """architectures.py declares what differs between BERT, GPT and ELMo; nothing else asks a config's
    class (isinstance) or probes a model for an architecture's encoder (hasattr(model, "bert"))."""
    asks = re.compile(r"isinstance\(.*\b(BertConfig|GPTConfig|ELMoConfig)\b"
                      r"|hasattr\(\w+, \"(bert|transformer|elmo)\"\)")
    found = [f"{f.relative_to(SRC)}:{n}" for f in SRC.rglob("*.py") if f.name != "architectures.py"
             for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if asks.search(line)]
    assert not found, found
    assert asks.search('if isinstance(config, GPTConfig):') and asks.search('hasattr(model, "bert")')
    assert asks.search('bert = isinstance(load_config(model_dir), BertConfig)')
