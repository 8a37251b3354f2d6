"""What the survey looks at: pipeline classes that name a transformer (a syntax-tree index of every
pipeline file) and whether a class is a diffusers model (its bases lead to ModelMixin)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import libcst as cst

from integrate.analyzers.bases import model_mixin
from integrate.resolve import Workspace


class TrackingWorkspace(Workspace):
    """A Workspace shared by every row a worker surveys, noting the files each task reads."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: dict[str, None] = {}

    def load(self, path: Path, package_root: Path | None = None):
        src = super().load(path, package_root)
        self.touched[str(src.path)] = None
        return src

    @property
    def files_read(self) -> list[str]:
        return list(self.touched)


class PipelineIndex:
    """Pipeline classes in pipeline_*.py files and the names their `__init__` uses (read with `ast`)."""

    def __init__(self, pipelines: list[str]) -> None:
        self.pipeline_files = pipelines
        self._texts: dict[str, str] | None = None
        self._index: dict[str, dict[str, tuple[int, frozenset[str], bool]] | None] = {}

    def texts(self) -> dict[str, str]:
        if self._texts is None:
            self._texts = {}
            for p in self.pipeline_files:
                try:
                    self._texts[p] = Path(p).read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
        return self._texts

    def classes_in(self, path: str) -> dict[str, tuple[int, frozenset[str], bool]] | None:
        """{class: (line, names its __init__ uses, defines __call__)} of one pipeline file (ast)."""
        if path not in self._index:
            try:
                tree = ast.parse(self.texts()[path], filename=path)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self._index[path] = None
                return None
            found = {}
            for node in _top_level(tree.body):
                if not isinstance(node, ast.ClassDef):
                    continue
                methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                init = methods.get("__init__")
                names = frozenset()
                if init is not None:
                    names = frozenset(n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(init)
                                      if isinstance(n, (ast.Name, ast.Attribute)))
                found[node.name] = (node.lineno, names, "__call__" in methods)
            self._index[path] = found
        return self._index[path]

    def pipelines_for(self, name: str) -> tuple[list[dict], list[str]]:
        """Pipeline classes whose __init__ names `name`, and the files looked into."""
        word = re.compile(rf"\b{re.escape(name)}\b")
        out, read = [], []
        for path, text in self.texts().items():
            if name not in text or not word.search(text):
                continue
            read.append(path)
            for cls, (line, names, has_call) in (self.classes_in(path) or {}).items():
                if name in names:
                    out.append({"class": cls, "file": path, "line": line, "defines_call": has_call})
        return out, read


def _top_level(body):
    """Top-level statements, including those inside `if`/`try` blocks (as the libcst index does)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _top_level(block)


def is_model(ws: Workspace, src, cls: cst.ClassDef) -> bool:
    """Do the class's bases lead to ModelMixin (through imports, within the analysed packages)?"""
    return model_mixin(ws, src, cls)[0] is True


