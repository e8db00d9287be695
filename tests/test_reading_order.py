"""The notebooks are read in order: the layer folders of `nbs/` by their numbers (`00_foundations`, `01_model`, ...),
and in each folder the notebooks by theirs. A notebook may import a module exported by itself or by a notebook
before it, never by one after it; the package's modules follow the same rule through the notebooks that export
them, so no module imports one of a later layer. The guides, the experiments and the home page read the finished
package and are not in the order."""
import ast
import json
import re
from pathlib import Path

NBS = Path(__file__).resolve().parent.parent / "nbs"
NUMBERED = re.compile(r"^(\d\d)_\w+$")


def reading_order(nbs: Path = NBS) -> list[Path]:
    "The layer folders' notebooks in reading order (paths relative to `nbs`)."
    folders = sorted(d for d in nbs.iterdir() if d.is_dir() and NUMBERED.match(d.name))
    return [nb.relative_to(nbs) for d in folders for nb in sorted(d.glob("[0-9]*.ipynb"))]  # index.ipynb: the folder's page


def code_cells(path: Path) -> list[str]:
    "A notebook's code cells, their IPython magics and shell lines left out."
    cells = json.loads(path.read_text())["cells"]
    return ["\n".join(l for l in "".join(c["source"]).splitlines() if not l.lstrip().startswith(("%", "!")))
            for c in cells if c["cell_type"] == "code"]


def exported_module(path: Path) -> str | None:
    "The module a notebook exports (`#| default_exp cli.__init__` exports the package `depthnb.cli`)."
    for source in code_cells(path):
        if m := re.search(r"^#\s*\|\s*default_exp\s+([\w.]+)", source, re.M):
            return "depthnb." + re.sub(r"\.__init__$", "", m.group(1))
    return None


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
        return True
    except SyntaxError:
        return False


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    "The package's modules a notebook imports anywhere in its code (`from depthnb.x import y` names y when a module)."
    found = set()
    for source in code_cells(path):
        if re.search(r"^#\s*\|\s*eval:\s*false", source, re.M) and not _parses(source):
            continue  # a shell example shown, never run
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
    return found


def forward_imports(nbs: Path = NBS) -> list[str]:
    "Every import of a module whose notebook comes later in the reading order, as 'reader -> module (exporter)'."
    order = reading_order(nbs)
    exporter = {m: i for i, nb in enumerate(order) if (m := exported_module(nbs / nb))}
    found = []
    for i, nb in enumerate(order):
        for module in sorted(imported_modules(nbs / nb, set(exporter))):
            if exporter[module] > i:
                found.append(f"{nb} -> {module} ({order[exporter[module]]})")
    return found


def test_reading_order_is_read():
    order = [nb.as_posix() for nb in reading_order()]
    assert order[0] == "00_foundations/00_config.ipynb"
    assert order.index("01_model/02_model.ipynb") < order.index("04_training/04_train.ipynb")
    assert "guides/01_running.ipynb" not in order and "index.ipynb" not in order


def test_forward_import_is_found(tmp_path):
    for folder, name, source in [("00_a", "00_low.ipynb", "#| default_exp low\nfrom depthnb.high import f"),
                                 ("01_b", "00_high.ipynb", "#| default_exp high\nimport depthnb.low")]:
        (tmp_path / folder).mkdir()
        cell = {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
        (tmp_path / folder / name).write_text(json.dumps({"cells": [cell]}))
    assert forward_imports(tmp_path) == ["00_a/00_low.ipynb -> depthnb.high (01_b/00_high.ipynb)"]


def test_no_notebook_imports_a_later_one():
    found = forward_imports()
    assert not found, "imports of a later notebook's module:\n" + "\n".join(found)


def test_numbers_are_unique_within_a_folder():
    for folder in sorted(d for d in NBS.iterdir() if d.is_dir() and NUMBERED.match(d.name)):
        numbers = [nb.name[:2] for nb in sorted(folder.glob("*.ipynb")) if nb.name != "index.ipynb"]  # the folder's page
        assert all(n.isdigit() for n in numbers), (folder.name, numbers)
        assert len(numbers) == len(set(numbers)), (folder.name, sorted(numbers))


def test_every_module_has_its_notebook_in_a_layer_folder():
    package = NBS.parent / "depthnb"
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in package.rglob("*.py") if p.name != "_modidx.py"}
    exported = {exported_module(NBS / nb) for nb in reading_order()}
    packages = {m for m in modules if (package.parent / m.replace(".", "/") / "__init__.py").is_file()}
    assert modules - exported - packages == set()


def test_no_module_imports_a_later_layer():
    from test_import_graph import import_graph

    order = reading_order()
    layer = {m: nb.parts[0] for nb in order if (m := exported_module(NBS / nb))}
    upward = sorted(f"{m} ({layer[m]}) -> {n} ({layer[n]})" for m, imported in import_graph().items() if m in layer
                    for n in imported if n in layer and layer[n] > layer[m])
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)
