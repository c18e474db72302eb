"""The house rules of nostall/ that a green test run would not otherwise show: layers point down
as the design draws them (no module imports one above it, not even inside a function), no
import cycle, and no file past 450 lines."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nostall"

# Top to bottom; a module may import its own layer and those below it.
LAYERS = [
    {"cli", "eval_command", "config_flags", "__main__"},
    {"algos"},
    {"train"},
    {"agents"},
    {"lm"},
    {"runtime"},
    {"optim"},
    {"envs"},
    {"ops"},
    {
        "__init__",
        "_native",
        "_autograd_fallback",
        "_decoder_train",
        "decoder_weights",
        "build_info",
        "_build_info",
        "_build_plan",
        "user_code",
        "files",
    },
    {"profiler"},
]
RANK = {name: len(LAYERS) - i for i, names in enumerate(LAYERS) for name in names}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "nostall":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    """Every nostall module a file imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if _layer(m) is not None}


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {_module(f) for f in FILES}
GRAPH = {_module(f): {m for m in _imports(f) if m in MODULES} - {_module(f)} for f in FILES}


def test_every_part_of_the_package_has_a_layer():
    assert {_layer(m) for m in MODULES} <= set(RANK)


def test_layers_point_down():
    upward = [
        (m, other)
        for m, imported in GRAPH.items()
        for other in imported
        if RANK[_layer(other)] > RANK[_layer(m)]
    ]
    assert not upward, upward


def test_no_import_cycle():
    # A package's __init__ re-exporting its modules is not a cycle of theirs: a module's
    # dependence on its package counts only through what the package imports.
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(GRAPH[module]):
            if state.get(other) == 1 and not module.startswith(other + "."):
                cycles.append([*path[path.index(other) :], other])
            elif other not in state:
                visit(other, [*path, other])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_no_file_is_past_450_lines():
    long = {
        str(f.relative_to(PACKAGE)): n
        for f in FILES
        if (n := len(f.read_text().splitlines())) > 450
    }
    assert not long, long
