"""Find what a name is bound to, across files, without importing anything.

A `Workspace` parses each file once and follows `from x import y` chains inside a package
(diffusers re-exports every public class through `__init__.py` files under
`if TYPE_CHECKING:`). Installed packages are located with `importlib.util.find_spec` on the
top-level name only, which reads the file system and never executes the package.
A name that cannot be traced resolves to an `Unresolved` with the reason: unknown, not clean.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from integrate.errors import InputError
from integrate.inputs import installed_root
from integrate.source import SourceFile, dotted, parse_source, read_text

MAX_DEPTH = 24
STAR_BUDGET = 16  # files a star-import search for a followed name may read
NAMESPACE_UP = 8  # folders above a file searched for the namespace package (no __init__.py) it belongs to


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
    file outside it is refused too (the approval does not bind it). `source_roots` (`--source-root`): folders that
    hold top-level packages of the model's code; a file under one is named from it (see `_root_for`), and a
    top-level package found in one is the model's, not an installed one."""

    def __init__(self, expect: dict[str, str] | None = None, source_roots=()) -> None:
        self._files: dict[Path, SourceFile] = {}
        self._hashes: dict[Path, str] = {}
        self._roots: dict[str, Path | None] = {}
        self._expect = {Path(p).resolve(): sha for p, sha in expect.items()} if expect is not None else None
        self.source_roots: tuple[Path, ...] = tuple(Path(r).resolve() for r in source_roots)
        self._in_source: dict[str, Path] = {}  # top-level packages found in a source root (the flags decide them)
        # what else the answers depend on (`dependencies`): files read without parsing them, paths looked for
        # and not found, folders listed
        self._read: dict[Path, str] = {}
        self._absent: dict[Path, None] = {}
        self._listed: dict[tuple[Path, str], tuple[str, ...]] = {}

    def use_source_roots(self, roots) -> None:
        """Name modules from `roots` from now on; a workspace that has read files under other roots is not reused
        for these (their names would be the old roots')."""
        roots = tuple(Path(r).resolve() for r in roots)
        if roots == self.source_roots:
            return
        if self._files:
            raise ValueError("a workspace that has read files is not given other source roots")
        self.source_roots, self._roots, self._in_source = roots, {}, {}

    @property
    def files_read(self) -> list[str]:
        return [str(p) for p in self._files]

    @property
    def hashes(self) -> dict[str, str]:
        """{file: SHA-256 of the bytes parsed} for every file read."""
        return {str(p): sha for p, sha in self._hashes.items()}

    def dependencies(self) -> dict:
        """Everything this workspace's answers were read from, as the result cache checks it before it answers
        again (`integrate.cache.store`): `files` {path: SHA-256 of the bytes read: parsed, or read whole by
        `read_bytes`}, `absent` [paths looked for that were not files: a module an import names, the
        `__init__.py` that would make a folder a package], `packages` {top-level name: the folder it is installed
        in, or None}, `listings` [[folder, pattern, [names]]]."""
        files = {**{str(p): sha for p, sha in self._read.items()}, **self.hashes}
        return {"files": files, "absent": [str(p) for p in self._absent],
                "packages": {top: str(root) if root is not None else None for top, root in self._roots.items()},
                "listings": [[str(folder), pattern, list(names)] for (folder, pattern), names in self._listed.items()]}

    def read_bytes(self, path: Path) -> bytes:
        """A file's bytes, for a reader that does not parse it with libcst (cache-dit's registries, read with
        `ast`); recorded among the workspace's dependencies."""
        path = path.resolve()
        data = path.read_bytes()
        self._read[path] = hashlib.sha256(data).hexdigest()
        return data

    def listing(self, folder: Path, pattern: str) -> list[Path]:
        """The files in `folder` matching `pattern`, sorted; the listing is one of the workspace's dependencies (a
        file added there later changes what a reader of the folder finds)."""
        folder = folder.resolve()
        found = sorted(p for p in folder.glob(pattern) if p.is_file())
        self._listed[(folder, pattern)] = tuple(p.name for p in found)
        return found

    def _is_file(self, path: Path) -> bool:
        """Whether `path` is a file; a path looked for and not found is one of the workspace's dependencies."""
        if path.is_file():
            return True
        self._absent[path.absolute()] = None
        return False

    # -- loading -------------------------------------------------------------------------

    def load(self, path: Path, package_root: Path | None = None) -> SourceFile:
        path = path.resolve()
        src = self._files.get(path)
        if src is None:
            if package_root is not None and not path.is_relative_to(package_root.resolve()):
                package_root = None  # a root the file is not under names no module of it
            if package_root is None:
                package_root = self._root_for(path)
            if self._expect is not None and path not in self._expect:
                raise InputError(f"{path} was not read when the plan was made, so its approval does not bind it: "
                                 "make the plan again and have it approved")
            text = read_text(path, self._expect.get(path) if self._expect is not None else None)
            src = parse_source(path, text, package_root)
            if src.package_root is None:  # no regular package: a namespace package's, if its imports say so
                src.package_root = self._namespace_root_of(src)
            self._files[path] = src
            self._hashes[path] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return src

    def _guess_root(self, path: Path) -> Path | None:
        """The directory above the outermost package (a folder with __init__.py) holding path."""
        root = None
        parent = path.parent
        while self._is_file(parent / "__init__.py"):
            root = parent.parent
            if parent.parent == parent:
                break
            parent = parent.parent
        return root

    def _namespace_root(self, path: Path, module: str) -> Path | None:
        """The folder an absolute import `module` (`pkg.sub.mod`) of the file at `path` resolves from when `pkg` is
        a namespace package (PEP 420: folders without __init__.py) the file itself lies in: the parent of the
        nearest of the file's own folders named `pkg` (at most NAMESPACE_UP above it) under which the module's file
        exists. Only the file's own ancestors are candidates, so a repository's `import torch` never lands in
        another folder's `torch/` (nor in site-packages, unless the file itself is there); None: no such folder."""
        top = module.split(".")[0]
        if not top.isidentifier():
            return None
        folder = path.parent
        for _ in range(NAMESPACE_UP):
            if folder.parent == folder:
                break
            if folder.name == top and self.module_file(folder.parent, module) is not None:
                return folder.parent
            folder = folder.parent
        return None

    def _namespace_root_of(self, src: SourceFile) -> Path | None:
        """The root of the namespace package `src` lies in, found from its own absolute imports of that package
        (`from allegro.models.block import X` in allegro/models/model.py, no __init__.py on the way); None: none."""
        for imp in src.imports.values():
            if not imp.module.startswith("."):
                root = self._namespace_root(src.path, imp.module)
                if root is not None:
                    return root
        return None

    def root_of(self, path: Path) -> Path | None:
        """The folder that holds the top-level package of `path`'s module (None: a loose file), as `load` names
        it; the file is not read."""
        return self._root_for(Path(path).resolve())

    def _root_for(self, path: Path) -> Path | None:
        """The folder `path`'s module is named from: the deepest source root that holds it (every folder between a
        name: `src/genmo/mochi_preview/dit/joint_model/x.py` under `src` is `genmo.mochi_preview.dit.joint_model.x`,
        namespace packages included), else the folder above its outermost package (`_guess_root`)."""
        for root in sorted(self.source_roots, key=lambda r: len(r.parts), reverse=True):
            if path.is_relative_to(root) and all(p.isidentifier()
                                                 for p in path.relative_to(root).with_suffix("").parts):
                return root
        return self._guess_root(path)

    def package_root(self, top: str) -> Path | None:
        """Directory holding the top-level package `top`: a source root that has it (the model's own code), else
        the installed one (found, not imported). Only a plain top-level name is looked up: `find_spec` of a dotted
        name imports its parent packages."""
        if not top.isidentifier():
            return None
        if top not in self._roots:
            if top not in self._in_source:
                found = next((r for r in self.source_roots if (r / top).is_dir() or (r / f"{top}.py").is_file()),
                             None)
                if found is not None:
                    self._in_source[top] = found
            if top in self._in_source:
                return self._in_source[top]
            self._roots[top] = installed_root(top)
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
            if self._is_file(candidate):
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
            if "." in module and self.package_root(top) is None:
                # folders without __init__.py (namespace packages) imported from the repository's root, where its
                # scripts run: the nearest folder above that holds the whole module path as a file (never for a
                # name an installed package answers: a repository's own `torch/` does not stand for torch)
                for folder in src.path.parent.parents:
                    found = self.module_file(folder, module)
                    if found is not None:
                        return found
        root = self._namespace_root(src.path, module)
        if root is not None:  # a namespace package the file lies in, above its regular package if it has one
            return self.module_file(root, module)
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
            if name in other.imports:  # re-exported by name there (`from .transformer import TransformerEncoderLayer`)
                try:
                    found = self._resolve(other, name, "", seen=(), chain=(str(src.path),))
                except CircularImport:
                    found = None
                if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                    return found
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
