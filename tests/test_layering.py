"""The house: packages are the pipeline (docs/architecture.md), and the code keeps to it.

Each package imports only the packages below it in docs/architecture.md's table; no modules
import each other in a loop (imports inside functions count; ``if TYPE_CHECKING:`` ones, never
run, do not); the table's jax column is what the imports say; the pure core (the packages that
column marks "no") imports without jax; the module map lists exactly the modules there are; and
no function in jaxpar/ is longer than 80 lines.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

pytestmark = pytest.mark.api

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxpar"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_FUNCTION_LINES = 80


def layer_table() -> list[tuple[str, bool]]:
    """(package, imports jax) per row of the architecture page's table, top layer first."""
    rows = re.findall(r"^\| \d+ \| `(\w+)` \| (yes|no) \|", ARCHITECTURE.read_text(), re.M)
    return [(name, jax == "yes") for name, jax in rows]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


class _Imports(ast.NodeVisitor):
    """Every import a module runs (at any depth), resolved to absolute module names."""

    def __init__(self, name: str, is_package: bool, known: set[str]):
        self.base = name.split(".") if is_package else name.split(".")[:-1]
        self.known = known
        self.internal: set[str] = set()
        self.external: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.base[: len(self.base) - (node.level - 1)]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        for alias in node.names:
            sub = f"{module}.{alias.name}"
            self._add(sub if sub in self.known else module)

    def _add(self, module: str) -> None:
        if module == "jaxpar" or module.startswith("jaxpar."):
            self.internal.add(module)
        else:
            self.external.add(module.split(".")[0])


def imports_of(name: str, path: Path, known: set[str]) -> _Imports:
    found = _Imports(name, path.name == "__init__.py", known)
    found.visit(ast.parse(path.read_text()))
    return found


def package_of(module: str) -> str | None:
    """The stage package a module belongs to (None: the package root's own modules)."""
    parts = module.split(".")
    return (
        parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None
    )


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    """Module -> the jaxpar modules it imports, each node tagged with its external imports."""
    mods = modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        found = imports_of(name, path, set(mods))
        g.add_node(name, external=found.external)
        g.add_edges_from((name, m) for m in found.internal if m != name)
    return g


def test_the_table_names_every_package_once():
    names = [name for name, _ in layer_table()]
    on_disk = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert len(names) == len(set(names))
    assert sorted(names) == on_disk


def test_each_package_imports_only_packages_below_it(graph):
    rank = {name: k for k, (name, _) in enumerate(layer_table())}  # 0 = top
    upward = []
    for a, b in graph.edges:
        pa, pb = package_of(a), package_of(b)
        if pa is None or pa == pb:
            continue  # the public face (__init__, __main__) sits above everything
        if pb is None:
            # the version is a leaf any layer may read; the commands use the public face
            if b != "jaxpar._version" and (b, pa) != ("jaxpar", "cli"):
                upward.append(f"{a} -> {b}")
        elif rank[pb] <= rank[pa]:
            upward.append(f"{a} -> {b}")
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_no_import_cycles(graph):
    package_imports = nx.DiGraph(
        (package_of(a), package_of(b))
        for a, b in graph.edges
        if package_of(a) and package_of(b) and package_of(a) != package_of(b)
    )
    for g in (graph, package_imports):
        cycles = list(nx.simple_cycles(g))
        assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_jax_column_is_what_the_imports_say(graph):
    direct = {package_of(m) for m, data in graph.nodes(data=True) if "jax" in data["external"]} - {
        None
    }
    package_imports = nx.DiGraph(
        (package_of(a), package_of(b)) for a, b in graph.edges if package_of(a) and package_of(b)
    )
    uses_jax = set(direct)
    for p in direct:
        uses_jax |= nx.ancestors(package_imports, p)
    declared = {name for name, jax in layer_table() if jax}
    assert declared == uses_jax


def test_the_pure_core_imports_without_jax():
    """Every module of every package the table marks pure, imported in a fresh interpreter."""
    pure = {name for name, jax in layer_table() if not jax}
    names = sorted(m for m in modules() if package_of(m) in pure)
    code = "import sys\n" + "".join(f"import {m}\n" for m in names)
    code += "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert len(names) > 40  # the pure core is most of the planner


def test_the_module_map_lists_every_module():
    listed = set(re.findall(r"^- `(jaxpar/[\w/]+\.py)`", ARCHITECTURE.read_text(), re.M))
    present = {
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and p.parent != PACKAGE
    }
    assert listed == present, (
        f"missing from docs/architecture.md: {sorted(present - listed)}; "
        f"listed but gone: {sorted(listed - present)}"
    )


def test_no_function_over_80_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, "functions over 80 lines:\n" + "\n".join(sorted(long))


def test_the_install_lists_every_package():
    """pyproject.toml names each package (so that the zoo in models/ installs as `jaxpar_zoo`
    beside them): every folder of jaxpar/ with an __init__.py is there, nothing else."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r"^packages = \[(.*?)\]", text, re.M | re.S).group(1)
    names = set(re.findall(r'"([\w.]+)"', listed))
    on_disk = {module_name(p.parent) for p in PACKAGE.rglob("__init__.py")}
    assert names == on_disk | {"jaxpar_zoo"}
    assert re.search(r'^jaxpar_zoo = "models"$', text, re.M)
