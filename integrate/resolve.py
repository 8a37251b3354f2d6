"""Find what a name is bound to, across files, without importing anything.

A `Workspace` parses each file once and follows `from x import y` chains inside a package
(diffusers re-exports every public class through `__init__.py` files under
`if TYPE_CHECKING:`). Installed packages are located with `importlib.util.find_spec` on the
top-level name only, which reads the file system and never executes the package.
A name that cannot be traced resolves to an `Unresolved` with the reason: unknown, not clean.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from integrate.errors import InputError
from integrate.source import SourceFile, dotted, parse_source, read_text

MAX_DEPTH = 24
STAR_BUDGET = 16  # files a star-import search for a followed name may read


@dataclass(frozen=True)
class Resolved:
    src: SourceFile
    name: str
    node: cst.ClassDef | cst.FunctionDef | None  # None for a module
    chain: tuple[str, ...]  # files visited, for the gate's report


@dataclass(frozen=True)
class External:
    """A name bound to a package outside the analysed one (torch, transformers, ...)."""

    qualname: str


@dataclass(frozen=True)
class Unresolved:
    name: str
    reason: str


class CircularImport(Exception):
    pass


class Workspace:
    """Parses each file once. `expect` ({path: SHA-256}) pins files to the bytes a reviewer approved: such a
    file is parsed from the bytes whose hash matched, and refused (InputError) when it changed; with `expect`, a
    file outside it is refused too (the approval does not bind it)."""

    def __init__(self, expect: dict[str, str] | None = None) -> None:
        self._files: dict[Path, SourceFile] = {}
        self._hashes: dict[Path, str] = {}
        self._roots: dict[str, Path | None] = {}
        self._expect = {Path(p).resolve(): sha for p, sha in expect.items()} if expect is not None else None

    @property
    def files_read(self) -> list[str]:
        return [str(p) for p in self._files]

    @property
    def hashes(self) -> dict[str, str]:
        """{file: SHA-256 of the bytes parsed} for every file read."""
        return {str(p): sha for p, sha in self._hashes.items()}

    # -- loading -------------------------------------------------------------------------

    def load(self, path: Path, package_root: Path | None = None) -> SourceFile:
        path = path.resolve()
        src = self._files.get(path)
        if src is None:
            if package_root is None:
                package_root = self._guess_root(path)
            if self._expect is not None and path not in self._expect:
                raise InputError(f"{path} was not read when the plan was made, so its approval does not bind it: "
                                 "make the plan again and have it approved")
            text = read_text(path, self._expect.get(path) if self._expect is not None else None)
            src = parse_source(path, text, package_root)
            self._files[path] = src
            self._hashes[path] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return src

    @staticmethod
    def _guess_root(path: Path) -> Path | None:
        """The directory above the outermost package (a folder with __init__.py) holding path."""
        root = None
        parent = path.parent
        while (parent / "__init__.py").is_file():
            root = parent.parent
            if parent.parent == parent:
                break
            parent = parent.parent
        return root

    def package_root(self, top: str) -> Path | None:
        """Directory holding the installed top-level package `top` (found, not imported). Only a plain
        top-level name is looked up: `find_spec` of a dotted name imports its parent packages."""
        if not top.isidentifier():
            return None
        if top not in self._roots:
            root = None
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.submodule_search_locations:
                locations = list(spec.submodule_search_locations)
                if locations:
                    root = Path(locations[0]).parent
            elif spec is not None and spec.origin and spec.origin.endswith(".py"):
                root = Path(spec.origin).parent
            self._roots[top] = root
        return self._roots[top]

    def locate(self, qualname: str) -> tuple[Path | None, str]:
        """The file of the module an external name lives in (`sat.model.base_model.BaseModel` ->
        .../sat/model/base_model.py), found on this machine without importing, or None; and what was found, in
        words. A top-level name found as a folder that lacks the module (a repository's own `sat/` folder on the
        path, shadowing the SwissArmyTransformer package `sat`) is not that package: None, saying where it led."""
        module = qualname.rpartition(".")[0] or qualname
        top = module.split(".")[0]
        root = self.package_root(top)
        if root is None:
            return None, "is not installed here"
        path = self.module_file(root, module)
        if path is None:
            wanted = "/".join(module.split("."))
            return None, (f"is not installed here: `{top}` resolves to {root / top}, which holds no {wanted}.py "
                          "(a folder of the same name, not that package)")
        return path, f"is read from {path}"

    def module_file(self, root: Path, dotted_name: str) -> Path | None:
        base = root.joinpath(*dotted_name.split(".")) if dotted_name else root
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def _module_path(self, src: SourceFile, module: str) -> Path | None | str:
        """The file for `module` as imported from `src`; a str marks an external package."""
        if module.startswith("."):
            level = len(module) - len(module.lstrip("."))
            rest = module[level:]
            base = src.path.parent
            for _ in range(level - 1):
                base = base.parent
            return self.module_file(base, rest) if rest else self.module_file(base, "")
        top = module.split(".")[0]
        own_top = (src.dotted_name or "").split(".")[0]
        if src.package_root is not None and top == own_top:
            return self.module_file(src.package_root, module)
        if src.package_root is None:
            sibling = self.module_file(src.path.parent, module)
            if sibling is not None:
                return sibling
            if "." in module:  # folders without __init__.py (namespace packages) imported from the repository's root,
                # where its scripts run: the nearest folder above that holds the whole module path as a file
                for folder in src.path.parent.parents:
                    found = self.module_file(folder, module)
                    if found is not None:
                        return found
        return module  # another package: reported as external, not followed

    # -- resolution ----------------------------------------------------------------------

    def resolve(self, src: SourceFile, name: str) -> Resolved | External | Unresolved:
        """What `name` (possibly dotted, e.g. `nn.ModuleList`) is bound to in `src`."""
        head, _, tail = name.partition(".")
        try:
            return self._resolve(src, head, tail, seen=(), chain=())
        except CircularImport as exc:
            return Unresolved(name, f"circular import: {exc}")

    def _resolve(self, src, head, tail, seen, chain):
        key = (str(src.path), head)
        if key in seen:
            raise CircularImport(" -> ".join(f"{Path(p).name}:{n}" for p, n in (*seen, key)))
        if len(seen) > MAX_DEPTH:
            return Unresolved(head, "import chain too long")
        seen = (*seen, key)
        chain = (*chain, str(src.path))
        if not tail:
            if head in src.classes:
                return Resolved(src, head, src.classes[head], chain)
            if head in src.functions:
                return Resolved(src, head, src.functions[head], chain)
        imp = src.imports.get(head)
        if imp is None:
            if head in src.assigns:
                alias = dotted(src.assigns[head])
                if alias and alias != head:
                    return self._resolve_dotted(src, alias + ("." + tail if tail else ""), seen, chain)
            return Unresolved(head, f"`{head}` is not defined or imported in {src.path.name}")
        if imp.name is None:  # import pkg[.sub] [as alias]
            full = imp.module + ("." + tail if tail else "")
            return self._resolve_absolute(src, full, seen, chain)
        target = self._module_path(src, imp.module)
        if isinstance(target, str) or target is None:
            qual = (target if isinstance(target, str) else imp.module) + "." + imp.name
            if target is None:
                return Unresolved(head, f"module {imp.module} imported in {src.path.name} was not found")
            return External(qual + ("." + tail if tail else ""))
        other = self.load(target, src.package_root)
        # `from .pkg import submodule` binds a module
        if imp.name not in other.classes and imp.name not in other.functions and imp.name not in other.imports:
            sub = self.module_file(target.parent, imp.name) if target.name == "__init__.py" else None
            if sub is not None:
                module = self.load(sub, src.package_root)
                if not tail:
                    return Resolved(module, imp.name, None, chain)
                t_head, _, t_tail = tail.partition(".")
                return self._resolve(module, t_head, t_tail, seen, chain)
        return self._resolve(other, imp.name, tail, seen, chain)

    def _resolve_dotted(self, src, name, seen, chain):
        head, _, tail = name.partition(".")
        return self._resolve(src, head, tail, seen, chain)

    def _resolve_absolute(self, src, full: str, seen, chain):
        """`pkg.sub.Name` reached through `import pkg`: follow it only inside our package."""
        target = self._module_path(src, full.rsplit(".", 1)[0]) if "." in full else None
        if isinstance(target, Path):
            other = self.load(target, src.package_root)
            return self._resolve(other, full.rsplit(".", 1)[1], "", seen, chain)
        return External(full)

    def follow(self, ext: External) -> Resolved | External:
        """An external name read from its installed package's source (found, never imported): a class another
        library defines (`transformers...Qwen2Model`). The name is followed only to a module file that defines it;
        anything else stays External."""
        module, _, name = ext.qualname.rpartition(".")
        root = self.package_root(module.split(".")[0]) if module else None
        path = self.module_file(root, module) if root is not None else None
        if path is None:
            return ext
        src = self.load(path, root)
        if name in src.classes:
            return Resolved(src, name, src.classes[name], (str(path),))
        if name in src.imports:  # re-exported by name (`from .modeling import Name`)
            try:
                found = self._resolve(src, name, "", seen=(), chain=())
            except CircularImport:
                return ext
            return found if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef) else ext
        return self._through_stars(src, name, root) or ext

    def _through_stars(self, src: SourceFile, name: str, root: Path) -> Resolved | None:
        """`name` defined in a module `src` re-exports whole (`from .models import *`, as a lazily importing
        package declares its names for type checkers), searched best first: modules a part of whose name the class
        name contains (`phi3`, `modeling_phi3` for `Phi3Model`) before the others, at most STAR_BUDGET files read.
        None: not found within the budget (the name stays external: unknown, never guessed)."""
        key = name.lower()

        def score(module: str) -> int:  # the longest `_`-separated part of the module's name in the class name
            return max((len(p) for p in module.rsplit(".", 1)[-1].lower().split("_") if p and p in key), default=0)

        todo = [(-score(m), i, src, m) for i, m in enumerate(src.stars)]
        seen: set[Path] = {src.path}
        loaded = 0
        while todo and loaded < STAR_BUDGET:
            todo.sort(key=lambda t: (t[0], t[1]))
            _, _, owner, module = todo.pop(0)
            path = self._module_path(owner, module)
            if not isinstance(path, Path) or path in seen:
                continue
            seen.add(path)
            other = self.load(path, root)
            loaded += 1
            if name in other.classes:
                return Resolved(other, name, other.classes[name], (str(src.path), str(path)))
            todo += [(-score(m), len(todo) + i, other, m) for i, m in enumerate(other.stars)]
        return None

    def qualname(self, src: SourceFile, expr: cst.BaseExpression) -> str | None:
        """Fully qualified dotted name of an expression like `nn.ModuleList`, from imports only."""
        name = dotted(expr)
        if name is None:
            return None
        head, _, tail = name.partition(".")
        imp = src.imports.get(head)
        if imp is None:
            if head in src.classes or head in src.functions:
                mod = src.dotted_name or src.path.stem
                return f"{mod}.{name}"
            return name
        if imp.name is None:
            base = imp.module
        else:
            module = imp.module
            if module.startswith(".") and src.dotted_name:
                level = len(module) - len(module.lstrip("."))
                package = src.dotted_name.split(".")
                if src.path.name != "__init__.py":
                    package = package[:-1]
                package = package[: len(package) - (level - 1)] if level > 1 else package
                module = ".".join([*package, module[level:]]).strip(".")
            base = f"{module}.{imp.name}"
        return base + ("." + tail if tail else "")

    # -- locating a class in an installed package ------------------------------------------

    def locate_class(self, package: str, name: str) -> Resolved:
        """Find where installed package `package` defines `name`, through its __init__ files. A dotted
        `package` is found by its top-level name and followed on disk, never imported."""
        if not all(part.isidentifier() for part in package.split(".")):
            raise InputError(f"{package[:80]!r} is not a package name (dotted identifiers)")
        root = self.package_root(package.split(".")[0])
        if root is None:
            raise InputError(f"package `{package}` is not installed (cannot locate {name})")
        init = self.module_file(root, package)
        if init is None:
            raise InputError(f"package `{package}` has no __init__.py under {root}")
        src = self.load(init, root)
        try:
            found = self._resolve(src, name, "", seen=(), chain=())
        except CircularImport as exc:
            raise InputError(f"circular import while locating {name} in {package}: {exc}") from None
        if not isinstance(found, Resolved) or not isinstance(found.node, (cst.ClassDef, cst.FunctionDef)):
            raise InputError(f"`{name}` is not exported by the installed package `{package}`")
        return found
