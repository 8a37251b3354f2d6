"""The tree keeps its shape: data flows one way through the stages, and private names stay private.

Stages, in pipeline order: gate -> analyzers -> decisions -> templates -> verify. The core
(`integrate/*.py`: records, source reading, name resolution, the def-use index, the cache) serves every
stage and imports none; the front ends (`integrate.api`, `cli`, `render`, `survey`, `repair`) may import anything and
no stage imports them. No module imports itself back through others (`survey` and `repair` are built on `api`, which
imports neither). Read with libcst, like every other source in this project.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from conftest import ROOT

from integrate.source import dotted

STAGES = ["gate", "analyzers", "decisions", "templates", "verify"]
FRONT = ["api", "cli", "render", "survey", "repair"]
PACKAGES = {"integrate": ROOT / "integrate", **{f"integrate.{s}": ROOT / s for s in STAGES}}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("").parts
            if package == "integrate" and rel[0] in STAGES:
                continue
            name = ".".join((package, *rel))
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _layer(module: str) -> tuple[str, int]:
    """("core" | "front" | stage, rank in the pipeline)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return parts[1], STAGES.index(parts[1])
    if len(parts) > 1 and parts[1] in FRONT:
        return "front", len(STAGES)
    return "core", -1


def _imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in the file, relative ones resolved."""
    tree = cst.parse_module(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    class V(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                found.append((dotted(alias.name) or "", [], 0))

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            base = dotted(node.module) if node.module is not None else ""
            if node.relative:
                parts = package.split(".")
                parts = parts[: len(parts) - (len(node.relative) - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [] if isinstance(node.names, cst.ImportStar) else [dotted(a.name) or "" for a in node.names]
            found.append((base, names, 0))

    tree.visit(V())
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_stage_imports_a_later_one_or_a_front_end(module):
    layer, rank = _layer(module)
    if layer == "front":
        return
    for target, names, _ in _imports(module, MODULES[module]):
        candidates = [target] + [f"{target}.{n}" for n in names]
        for name in candidates:
            if not name.startswith("integrate."):
                continue
            other, other_rank = _layer(name)
            assert other != "front", f"{module} imports the front end {name}"
            if layer == "core":
                assert other == "core", f"core module {module} imports the stage module {name}"
            else:
                assert other_rank <= rank, f"{module} ({layer}) imports {name} from a later stage ({other})"


# An import cycle allowed for now, as (importer, imported); the test below says when an entry is no longer needed.
KNOWN_CYCLES: set[tuple[str, str]] = set()  # (importer, imported) edges allowed for now: none


def _import_graph() -> dict[str, set[str]]:
    """Each module of integrate (this checkout, which conftest checks is the installed one) -> the modules of integrate
    it imports, wherever the import stands (module level, inside a function, under TYPE_CHECKING). `from P import
    m` imports the module P.m where there is one, else P; a package's own `__init__` is not counted for its
    submodules (Python runs it first, but it is what imports them, not the other way round)."""
    graph = {}
    for module, path in MODULES.items():
        edges = set()
        for target, names, _ in _imports(module, path):
            for name in names or [None]:
                taken = f"{target}.{name}" if name and f"{target}.{name}" in MODULES else target
                if taken in MODULES and taken != module:
                    edges.add(taken)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A cycle for each back edge a depth-first walk meets, as the modules in import order (first one last again)."""
    found: list[list[str]] = []
    state: dict[str, str] = {}
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for other in sorted(graph.get(module, ())):
            if state.get(other) == "open":
                found.append(path[path.index(other):] + [other])
            elif other not in state:
                walk(other)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return found


def test_cycles_are_found_and_named():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_integrates_modules():
    graph = _import_graph()
    for importer, imported in KNOWN_CYCLES:
        assert imported in graph[importer], f"{importer} no longer imports {imported}: delete it from KNOWN_CYCLES"
        graph[importer] = graph[importer] - {imported}
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# Size limits in the stages that read, decide and write (a reader's steps, a chart's questions, a template's parts: one function each).
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 80, 300
# A function or class allowed over the limits for now (the test below says when an entry is no longer needed).
KNOWN_LONG: set[str] = set()  # functions and classes allowed over the limits for now: none


def _sizes(module: str, path: Path) -> dict[str, tuple[int, int]]:
    """`module.name` (`module.Class.method`) -> (its lines, the limit on them), for every function and class in the
    file, nested ones too."""
    wrapper = cst.metadata.MetadataWrapper(cst.parse_module(path.read_text()))
    where = wrapper.resolve(cst.metadata.PositionProvider)
    sizes: dict[str, tuple[int, int]] = {}
    names = [module]

    class V(cst.CSTVisitor):
        def _enter(self, node) -> None:
            names.append(node.name.value)
            limit = MAX_CLASS_LINES if isinstance(node, cst.ClassDef) else MAX_FUNCTION_LINES
            sizes[".".join(names)] = (where[node].end.line - where[node].start.line + 1, limit)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            self._enter(node)

        def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
            names.pop()

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            self._enter(node)

        def leave_ClassDef(self, node: cst.ClassDef) -> None:
            names.pop()

    wrapper.visit(V())
    return sizes


def test_no_function_or_class_over_the_size_limits_in_analyzers_decisions_and_templates():
    over = []
    for module, path in MODULES.items():
        if _layer(module)[0] not in ("analyzers", "decisions", "templates"):
            continue
        over += [(name, lines) for name, (lines, limit) in _sizes(module, path).items() if lines > limit]
    long = {name for name, _ in over}
    assert KNOWN_LONG <= long, f"{sorted(KNOWN_LONG - long)} within the limits now: delete from KNOWN_LONG"
    assert long <= KNOWN_LONG, "over the size limits: " + ", ".join(f"{n} ({k} lines)" for n, k in over
                                                                       if n not in KNOWN_LONG)


@pytest.mark.parametrize("path", sorted({*MODULES.values(), *(ROOT / "tests").glob("*.py"),
                                         *(ROOT / "bench").glob("*.py")}), ids=lambda p: p.name)
def test_nothing_outside_a_module_imports_its_private_names(path):
    module = next((m for m, p in MODULES.items() if p == path), f"tests.{path.stem}")
    for target, names, _ in _imports(module, path):
        if not target.startswith("integrate"):
            continue
        for name in names:
            assert not (name.startswith("_") and not name.startswith("__")), \
                f"{path.relative_to(ROOT)} imports the private name {name} from {target}"
        assert not any(part.startswith("_") and not part.startswith("__") for part in target.split(".")), \
            f"{path.relative_to(ROOT)} imports the private module {target}"


def test_every_stage_is_imported_from_this_checkout_and_the_guard_says_so_otherwise(tmp_path):
    """The session guard (conftest's pytest_configure): every stage resolves inside this checkout; measured against
    another folder, every stage is named with where it comes from."""
    from conftest import ROOT, STAGES, stages_outside

    assert stages_outside(ROOT) == []
    outside = stages_outside(tmp_path)
    assert [x.split(" -> ")[0] for x in outside] == list(STAGES)
    assert all(str(ROOT.resolve()) in x for x in outside)


def test_a_session_from_another_checkout_stops_at_start(tmp_path):
    """A second checkout run with this environment (installed from this one): its session must not start."""
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    other = tmp_path / "other"
    (other / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", other / "tests" / "conftest.py")
    (other / "tests" / "test_x.py").write_text("def test_x():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(other / "tests")], cwd=other, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stdout[-1000:] + proc.stderr[-1000:]  # pytest's usage error
    assert "is not installed from this checkout" in proc.stdout + proc.stderr
    assert "1 passed" not in proc.stdout
