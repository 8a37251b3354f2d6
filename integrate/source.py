"""Reading Python source with libcst: parsing, line numbers, and a module's symbol table.

Nothing here imports or executes the code it reads.
"""

from __future__ import annotations

import ast
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import libcst as cst
from libcst._nodes.internal import CodegenState

from integrate.errors import InputError

MAX_SOURCE_BYTES = 1024 * 1024  # the largest file an analysis reads today (transformers' modeling_utils) is 280 KB
MAX_DEPTH = 200  # nesting of a file's syntax tree, counted as libcst nests it (real files: at most 53)


class _LineTracker(CodegenState):
    """Regenerates the module once and notes the line of each node's first real token.

    libcst's PositionProvider does the same with full ranges but costs several times the
    parse; evidence only needs start lines.
    """

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.line = 1
        self.starts: dict[int, int] = {}
        self._pending: list[cst.CSTNode] = []

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._pending.append(node)

    def add_token(self, value: str) -> None:
        pending = self._pending
        if pending and value.strip() and not value.lstrip().startswith("#"):
            starts, line = self.starts, self.line
            keep = []
            for node in pending:
                # A decorated def starts at its keyword, not at the first decorator.
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node.decorators and value not in (
                    "def",
                    "class",
                    "async",
                ):
                    keep.append(node)
                else:
                    starts[id(node)] = line
            pending[:] = keep
        self.line += value.count("\n")


@dataclass(frozen=True)
class Import:
    """`from <module> import <name> as <local>` or `import <module> as <local>`."""

    local: str
    module: str  # dotted, with leading dots for relative imports
    name: str | None  # None for `import module`
    node: cst.CSTNode


@dataclass
class SourceFile:
    path: Path
    text: str
    module: cst.Module
    package_root: Path | None = None  # directory that holds the top-level package
    parsed: _Parsed | None = field(default=None, repr=False, compare=False)  # shared by files with this text
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    functions: dict[str, cst.FunctionDef] = field(default_factory=dict)
    assigns: dict[str, cst.BaseExpression] = field(default_factory=dict)
    imports: dict[str, Import] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)  # modules re-exported whole (`from .models import *`)

    @cached_property
    def _starts(self) -> dict[int, int]:
        return self.parsed.starts if self.parsed is not None else _line_starts(self.module)

    def line(self, node: cst.CSTNode | None) -> int:
        if node is None:
            return 0
        return self._starts.get(id(node), 0)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node).strip()

    def last_line(self, node: cst.CSTNode) -> int:
        """The line `node` ends on (its comment lines above it left out)."""
        bare = node.with_changes(leading_lines=()) if hasattr(node, "leading_lines") else node
        return self.line(node) + self.code(bare).count("\n")

    @property
    def dotted_name(self) -> str | None:
        """The module's import name, when the file lives inside a known package root."""
        if self.package_root is None:
            return None
        rel = self.path.resolve().relative_to(self.package_root.resolve()).with_suffix("")
        parts = list(rel.parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)


def read_text(path: Path, expect_sha256: str | None = None) -> str:
    """A source file's text, refused when it is too large, binary, not UTF-8, or (with `expect_sha256`) not
    the bytes a reviewer approved."""
    try:
        if not path.exists():
            raise InputError(f"{path}: no such file")
        if not path.is_file():
            raise InputError(f"{path}: not a regular file")
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            raise InputError(f"{path}: {size} bytes is too large to be a model source file (limit "
                             f"{MAX_SOURCE_BYTES // 1024} KiB): refused before parsing")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if expect_sha256 is not None and hashlib.sha256(data).hexdigest() != expect_sha256:
        raise InputError(f"{path} changed after the plan was approved: run `integrate plan` again and have it "
                         "approved")
    if b"\x00" in data:
        raise InputError(f"{path}: binary file, not Python source")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_shape(path: Path, text: str) -> None:
    """Refuse, before libcst sees it, source whose shape would take libcst's native parser or the analysers'
    recursive walks past their limits (libcst crashes the process on ~1,500 nested brackets or a chain of
    ~10,000 `and`s). Python's own parser reads it first (it refuses brackets nested past 200, and reports a
    syntax error as Python does); then the depth of its tree is measured the way libcst nests it (a chain
    of `and`s or comparisons is one level per link there). The deepest file of diffusers, transformers and
    cache-dit measures 53."""
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise InputError(f"{path}:{exc.lineno or '?'}: syntax error: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise InputError(f"{path}: cannot be parsed: {type(exc).__name__}") from None
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{path}:{getattr(node, 'lineno', '?')}: code nested more than {MAX_DEPTH} levels deep: "
                             "refused before parsing")
        links = (len(node.values) - 1 if isinstance(node, ast.BoolOp) else
                 len(node.ops) - 1 if isinstance(node, ast.Compare) else 0)
        stack.extend((child, depth + 1 + links) for child in ast.iter_child_nodes(node))


def _line_starts(module: cst.Module) -> dict[int, int]:
    tracker = _LineTracker(module)
    module._codegen(tracker)
    return tracker.starts


class _Parsed:
    """One parse of one text, shared by every SourceFile with that text (libcst trees are immutable)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module

    @cached_property
    def starts(self) -> dict[int, int]:
        return _line_starts(self.module)


_PARSED: OrderedDict[str, _Parsed] = OrderedDict()
# One plan of a diffusers model reads about 50-80 files (the model, its pipeline, the modules its layers come
# from, the package __init__ chains); fewer kept than that and an LRU misses on every file of the next plan. A
# tree takes about 3 MB on average (216 MB held after plans of five models, 76 files), so 256 stay under 1 GB.
_PARSED_KEEP = 256


def _parse(path: Path, text: str) -> _Parsed:
    """libcst's tree for `text`, parsed once per process: the bytes decide, not the path (a workspace that
    checks approved hashes has read and checked the bytes before they get here)."""
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    parsed = _PARSED.get(key)
    if parsed is not None:
        _PARSED.move_to_end(key)
        return parsed
    check_shape(path, text)
    try:
        parsed = _Parsed(cst.parse_module(text))
    except cst.ParserSyntaxError as exc:
        raise InputError(f"{path}:{exc.raw_line}: syntax error: {exc.message}") from None
    except (RecursionError, MemoryError):
        raise InputError(f"{path}: source nests too deeply to parse") from None
    _PARSED[key] = parsed
    while len(_PARSED) > _PARSED_KEEP:
        _PARSED.popitem(last=False)
    return parsed


def parse_source(path: Path, text: str, package_root: Path | None = None) -> SourceFile:
    parsed = _parse(path, text)
    src = SourceFile(path=path, text=text, module=parsed.module, package_root=package_root, parsed=parsed)
    _index_module(src)
    return src


def _index_module(src: SourceFile) -> None:
    """Top-level classes, functions, simple assignments and imports, including those in
    `if`/`try` blocks (diffusers declares its public names under `if TYPE_CHECKING:`)."""

    def walk(stmts) -> None:
        for stmt in stmts:
            if isinstance(stmt, cst.ClassDef):
                src.classes.setdefault(stmt.name.value, stmt)
            elif isinstance(stmt, cst.FunctionDef):
                src.functions.setdefault(stmt.name.value, stmt)
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    _index_small(src, small)
            elif isinstance(stmt, cst.If):
                walk(stmt.body.body)
                orelse = stmt.orelse
                while orelse is not None:
                    walk(orelse.body.body)
                    orelse = getattr(orelse, "orelse", None)
            elif isinstance(stmt, cst.Try):
                walk(stmt.body.body)
                for handler in stmt.handlers:
                    walk(handler.body.body)
                if stmt.orelse is not None:
                    walk(stmt.orelse.body.body)

    walk(src.module.body)


def dotted(node: cst.BaseExpression | None) -> str | None:
    """`a.b.c` for a pure Name/Attribute chain, else None.

    Stricter than libcst's `get_full_name_for_node` on purpose: that helper names calls and subscripts by
    what they call or index (`self.blocks[0]` -> "self.blocks", `f().x` -> "f.x"), which would read the
    first block as the list and a call's result as the function."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def _module_name(node: cst.ImportFrom) -> str:
    dots = "".join("." for _ in node.relative)
    name = dotted(node.module) if node.module is not None else ""
    return dots + (name or "")


def _index_small(src: SourceFile, small: cst.BaseSmallStatement) -> None:
    if isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar):
        src.stars.append(_module_name(small))
    elif isinstance(small, cst.ImportFrom):
        module = _module_name(small)
        for alias in small.names:
            name = dotted(alias.name) or ""
            local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
            src.imports.setdefault(local, Import(local=local, module=module, name=name, node=small))
    elif isinstance(small, cst.Import):
        for alias in small.names:
            name = dotted(alias.name) or ""
            if alias.asname and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            else:
                local = name.split(".")[0]
                name = local
            src.imports.setdefault(local, Import(local=local, module=name, name=None, node=small))
    elif isinstance(small, (cst.Assign, cst.AnnAssign)):
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        for target in targets:
            if isinstance(target, cst.Name) and small.value is not None:
                src.assigns.setdefault(target.value, small.value)


def iter_methods(cls: cst.ClassDef):
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    for stmt in body:
        if isinstance(stmt, cst.FunctionDef):
            yield stmt


def find_method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    """The method `name` the class defines; for `forward` with no `def forward`, the method `__init__` assigns
    to `self.forward` on the branch the constructor's defaults take (`assigned_forward`)."""
    for fn in iter_methods(cls):
        if fn.name.value == name:
            return fn
    if name == "forward":
        chosen = assigned_forward(cls)
        return chosen[0] if chosen is not None else None
    return None


def assigned_forward(cls: cst.ClassDef) -> tuple[cst.FunctionDef, cst.Assign, str] | None:
    """`self.forward = self._a if flag else self._b` at the top of `__init__`: (the method chosen, the assignment,
    why) where the constructor's defaults decide it (a parameter's literal default, `not`, `is None`, `==` a
    literal); None where forward is not assigned there or the defaults do not decide it."""
    init = next((fn for fn in iter_methods(cls) if fn.name.value == "__init__"), None)
    if init is None:
        return None
    defaults = {p.name.value: p.default for p in (*init.params.params, *init.params.kwonly_params)
                if p.default is not None}
    for stmt in init.body.body:
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                and dotted(small.targets[0].target) == "self.forward"):
            continue
        value, why = small.value, "assigned in __init__"
        if isinstance(value, cst.IfExp):
            test = default_truth(value.test, defaults)
            if test is None:
                return None
            value = value.body if test else value.orelse
            why = f"assigned in __init__; `{cst.Module([]).code_for_node(small.value.test)}` is {test} by default"
        name = dotted(value) or ""
        method = next((fn for fn in iter_methods(cls) if f"self.{fn.name.value}" == name), None)
        return (method, small, why) if method is not None else None
    return None


def default_truth(test: cst.BaseExpression, defaults: dict[str, cst.BaseExpression]) -> bool | None:
    """The truth of a condition on a function's parameters with their literal defaults (None: not decided)."""
    def literal(expr):
        try:
            return True, ast.literal_eval(cst.Module([]).code_for_node(expr))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return False, None

    if isinstance(test, cst.Name) and test.value in defaults:
        ok, v = literal(defaults[test.value])
        return bool(v) if ok else None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = default_truth(test.expression, defaults)
        return None if inner is None else not inner
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name) \
            and test.left.value in defaults:
        ok, left = literal(defaults[test.left.value])
        comp = test.comparisons[0]
        okr, right = literal(comp.comparator)
        if not (ok and okr):
            return None
        ops = {cst.Is: lambda a, b: a is b, cst.IsNot: lambda a, b: a is not b, cst.Equal: lambda a, b: a == b,
               cst.NotEqual: lambda a, b: a != b}
        op = ops.get(type(comp.operator))
        return op(left, right) if op is not None else None
    return None


def base_names(cls: cst.ClassDef) -> list[str]:
    return [d for d in (dotted(arg.value) for arg in cls.bases if arg.keyword is None) if d]
