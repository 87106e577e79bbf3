"""The packages form a pipeline: each imports only packages below it (lazy imports
inside functions included), so there are no cycles and any stage can be understood
and tested with the ones beneath it alone. A new package must be given its layer."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A unit may import units of lower layers only; units of one layer are
# independent of each other.
LAYERS = [
    {"jgraph.progress", "jgraph.config", "jgraph.hashing", "jgraph.mesh", "jgraph.cost",
     "jgraph.atomic", "jgraph.segments", "jgraph.memory", "jgraph.npy"},
    {"jgraph.data"},
    {"jgraph.partition", "jgraph.ingest"},
    {"jgraph.exchange", "jgraph.target", "jgraph.kernels"},
    {"jgraph.sharded"},
    {"jgraph.sampling", "jgraph.models"},
    {"jgraph.jobs"},
    {"jgraph.train", "jgraph.planner"},
    {"jgraph.bench"},
    {"jgraph.cli"},
    {"jgraph.launch"},
    {"jgraph"},                 # the package's own __init__: the public facade
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def unit(module: str) -> str | None:
    """The package (or top-level module) of jgraph a module belongs to."""
    parts = module.split(".")
    if parts[0] != "jgraph":
        return None
    return "jgraph" if len(parts) == 1 else f"jgraph.{parts[1]}"


def source_files():
    """(module name, path) of every source file: jgraph/ and kernels/ (jgraph.kernels)."""
    for folder, package in (("jgraph", "jgraph"), ("kernels", "jgraph.kernels")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path


def imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_every_package_has_a_layer():
    units = {unit(module) for module, _ in source_files()}
    assert units <= set(LAYER), f"give these a layer in LAYERS: {sorted(units - set(LAYER))}"


def test_no_package_imports_one_above_it_or_beside_it():
    wrong = []
    for module, path in source_files():
        mine = unit(module)
        for line, target in imports(path):
            theirs = unit(target)
            if theirs is None or theirs == mine:
                continue
            if LAYER[theirs] >= LAYER[mine]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target}")
    assert not wrong, "\n".join(wrong)
