"""The rule examples' fixes, applied the way generate applies them (a test helper: the analysers may not import
the templates, so this half of the harness lives with the tests).

`apply_fix(rule, example, tmp)` analyses the example, hands its findings' fix records to the real rewrite
(`templates.forward_patch.patch_forward`), renders the real PatchFunctor module from it
(`patch_functor.py.j2`), and returns what came out: the rewritten functions' code, which records were
applied, and a way to run the example's model with and without the functor.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
from integrate.analyzers.analysis import analyze_transformer
from integrate.analyzers.records import Finding
from integrate.analyzers.rules import Example, Rule
from integrate.templates import functor_imports, render
from integrate.templates.forward_patch import ForwardPatch, patch_forward

from integrate import escape
from integrate.resolve import Workspace


@dataclass
class Fixed:
    findings: list[Finding]  # the rule's findings on the example, each with its fix record
    patch: ForwardPatch
    module: object  # the example, imported
    cls: str  # the transformer class's name
    functor: object  # the rendered PatchFunctor module, imported

    @property
    def applied(self) -> bool:
        """Every finding's fix record was applied by the rewrite."""
        done = {c.fix for c in self.patch.changes}
        return bool(self.findings) and all(f.fix in done for f in self.findings)

    @property
    def code(self) -> str:
        """The rewritten functions as generate writes them: the patched forward, then each patched block forward."""
        parts = ([self.patch.code] if self.patch.forward_changed else []) + [b.code for b in self.patch.blocks]
        return "\n\n\n".join(p.strip() for p in parts)

    def outputs(self, seed: int = 0):
        """(the model's output, the patched model's output) on the same random inputs and weights."""
        import torch

        torch.manual_seed(seed)
        model = getattr(self.module, self.cls)().eval()
        patched = copy.deepcopy(model)
        self.functor.ExamplePatchFunctor()._apply(patched)
        params = [p for p in inspect.signature(model.forward).parameters.values() if p.default is p.empty]
        inputs = {p.name: torch.randn(2, 8) for p in params}
        with torch.no_grad():
            want = model(**{k: v.clone() for k, v in inputs.items()})
            got = patched(**{k: v.clone() for k, v in inputs.items()})
        return want, got


def normalised(code: str) -> str:
    """`code` dedented and read back through libcst (no other normalisation)."""
    return cst.parse_module(textwrap.dedent(code).strip() + "\n").code


def apply_fix(rule: type[Rule], example: Example, tmp: Path) -> Fixed:
    """The example analysed and its findings' fixes applied, as generate applies them."""
    name = f"rule_example_{rule.code.replace('-', '_')}_{abs(hash(example.code))}"
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(example.code).lstrip())
    ws = Workspace()
    src = ws.load(path)
    cls_name = example.cls or next(n for n, c in src.classes.items() if "ModuleList" in src.code(c))
    cls = src.classes[cls_name]
    facts = analyze_transformer(ws, src, cls)
    found = [f for f in facts.findings if f.rule == rule.code]
    patch = patch_forward(ws, src, cls, facts.block_lists, tuple(dict.fromkeys(f.fix for f in found)))
    functor = render("patch_functor.py.j2", patch=patch, functor={"cls": "ExamplePatchFunctor"},
                     imports=functor_imports(patch), fwd_line=src.line(cls), from_diffusers=False,
                     m={"transformer_class": cls_name, "transformer_file": str(path)},
                     plan_sha=escape.Code("0" * 12))
    (tmp / f"{name}_functor.py").write_text(functor)
    return Fixed(found, patch, _imported(name, path), cls_name, _imported(f"{name}_functor", tmp / f"{name}_functor.py"))


def _imported(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
