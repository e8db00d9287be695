"""The package's import graph has no cycle: every `from .x import`, `from ..x import`, `from depthnb.x import` and
`import depthnb.x` in every module of the package (subpackages included), read with `ast` (imports inside functions included), is an
edge from the importing module to the imported one; a cycle fails the test, named module by module."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "depthnb"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    "The package's modules that one import statement names (`from .x import y` names y too when y is a module)."
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [target] + [f"{target}.{a.name}" for a in node.names]
    else:
        return set()
    found = set()
    for name in names:
        while name and name not in modules:  # `import depthnb.tools.docs` reaches depthnb.tools.docs
            name = name.rpartition(".")[0]
        if name and name != module and name.startswith("depthnb"):
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = sorted(f for f in PACKAGE.rglob("*.py") if f.name != "_modidx.py")
    modules = {module_name(f) for f in files}
    graph = {}
    for f in files:
        m = module_name(f)
        tree = ast.parse(f.read_text(), filename=str(f))
        graph[m] = set().union(*(imported(n, m, f.name == "__init__.py", modules) for n in ast.walk(tree)))
        graph[m] -= {"depthnb", "depthnb.tools", "depthnb.attention"}  # packages: a docstring at most
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    "One cycle of `graph` as the modules along it, the first repeated at the end; None when it has none."
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_graph_is_read():
    graph = import_graph()
    assert "depthnb.tools.docs" in graph["depthnb.tools.docs_cli"]  # the command line imports its tooling
    assert "depthnb.config" in graph["depthnb.model"]


def test_find_cycle_names_it():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
