"""`integrate audit --only X --fix --cache-dit-src PATH --out DIR`: a fix cache-dit can merge, for a finding.

One class, audited as `integrate audit` does (its plan, automatic approval, generate, cache-dit's proofs and ours on
the same fixture). Where cache-dit's own cache integration fails the cache proof and ours passes it (a `finding`):

1. the regression test is written from the audit's own fixture, in cache-dit's `tests/` layout
   (`templates/regression.py`): the tiny model, its inputs, the proof's assertions in cache-dit's public API;
2. it is run against the checkout as it is: it must fail there (else it does not show the defect);
3. our integration is written over the built-in adapter in place (`templates/builtin.py`: the keyword arguments of
   its returned `BlockAdapter(...)` that differ) in a scratch copy of the checkout's package, and the test run
   against that copy: it must pass;
4. only then is the checkout itself rewritten (all files or none, as `generate --mode checkout` writes), and
   `PR.md`, the test and `fix.diff` written under `--out`.

A test that does not fail before, or does not pass after, leaves the checkout untouched (status `not-fixed`, exit 1).
A TP finding is fixed the same way with the built-in planner class replaced by ours where it stands (same name and
decorator) and a regression test of 2 gloo processes. Each finding is fixed on its own; one whose test does not fail
before and pass after, a cache fix that needs a PatchFunctor, a CP finding, and a registration that also answers
another installed model class (a fix proved on one class would change the other unproved) are listed under `manual`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from integrate import __version__
from integrate.errors import InputError
from integrate.records import OMIT, to_json

from .records import FIX_SCHEMA, FIX_SCHEMA_VERSION, FixReport, TestRun

TEST_TIMEOUT = 600
_RUNNER = ("import sys, cache_dit, pytest\n"
           "where = cache_dit.__file__\n"
           "if not where.startswith(sys.argv[1]):\n"
           "    sys.exit(f'cache_dit imported from {where}, not from the tree under test {sys.argv[1]}')\n"
           "sys.exit(pytest.main(sys.argv[2:]))\n")


def run_test(test: Path, package: Path, tree: str, proof: str) -> TestRun:
    """pytest on `test` with cache_dit imported from `package` (checked), in a scratch folder (no conftest of the
    checkout's applies; nothing is cached)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(package.parent)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the checkout gets no __pycache__ from being tested
    with tempfile.TemporaryDirectory(prefix="integrate-fix-run-") as cwd:
        try:
            proc = subprocess.run([sys.executable, "-P", "-c", _RUNNER, str(package) + os.sep, "-q", "-rf",
                                   "--tb=line", "--show-capture=no", "-p", "no:cacheprovider", "-p", "no:warnings", "--rootdir", cwd, str(test)], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=TEST_TIMEOUT)
        except subprocess.TimeoutExpired:
            return TestRun(proof, tree, "fail", f"timed out after {TEST_TIMEOUT} s")
    tail = (proc.stdout + proc.stderr).strip()[-3000:]
    return TestRun(proof, tree, "pass" if proc.returncode == 0 else "fail", tail)


def describe_fixture(fixture: Path) -> dict:
    """The fixture's config and inputs as data (`integrate.verify.describe`, in a worker: loading it runs it)."""
    from integrate.workers import import_path, run_worker

    proc = run_worker("integrate.verify.describe", import_path(), str(Path(fixture).absolute()), capture_output=True,
                      text=True, timeout=TEST_TIMEOUT)
    if proc.returncode != 0:
        raise InputError(f"{fixture}: the fixture could not be described: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def _rewrite_for(plan):
    """Our adapter as the plan has it, as an in-place rewrite of cache-dit's; or why it cannot be one."""
    from integrate.templates.builtin import AdapterRewrite

    cache = plan.cache
    if cache.needs_patch_functor:
        return None, ("our integration needs a PatchFunctor (" + "; ".join(cache.patch_functor_reasons[:2]) +
                      "): writing it into a built-in adapter in place is not done; use generate --mode checkout")
    lists = list(cache.block_lists)
    if not lists or any(b.forward_pattern is None for b in lists):
        return None, "our plan has a block list without a ForwardPattern"
    lookup = tuple(n for n in ((plan.model.pipeline_class or "").split(".")[0], plan.model.transformer_class) if n)
    return AdapterRewrite(lookup=lookup, blocks=tuple(b.attr for b in lists),
                          patterns=tuple(b.forward_pattern for b in lists),
                          has_separate_cfg=bool(cache.has_separate_cfg),
                          check_forward_pattern=all(b.check_forward_pattern for b in lists)), None


def _finding_text(p, what: str) -> str:
    why = p.cache_dit_why if p.cache_dit_why is not OMIT else "it fails"
    where = (f" (first divergent module: {p.cache_dit_first_divergence})"
             if p.cache_dit_first_divergence not in (None, OMIT) else "")
    return f"integrate audit, {p.name} proof: cache-dit's integration: {why}{where}; ours ({what}) passes the same proof."


def _our_planner(base: Path, kind: str):
    """(text, class) of our planner of `kind` as a checkout module (decorated, registered natively)."""
    from integrate.decisions.approval import require_approved
    from integrate.templates.generate import built

    gen, _ = built(*require_approved(base / "plan"), replace_builtin=True, checkout=True)
    piece = next((p for p in gen.pieces if p.role == f"{kind}_planner"), None)
    return (piece.text, piece.symbol) if piece is not None else (None, None)


def run_fix(only: tuple[str, ...], src: Path, out: Path, proofs: tuple[str, ...],
            progress: Callable[[str], None] | None = None) -> FixReport:
    from integrate.decisions.approval import require_approved
    from integrate.files import write_tree
    from integrate.render.markdown import fix_markdown
    from integrate.templates.builtin import (ADAPTERS, PLANNER_REGISTRIES, PLANNERS, REGISTRY, PlannerRewrite,
                                             also_answers, package_files, registered_keys,
                                             rewrite_adapter)
    from integrate.templates.checkout import apply_checkout, find_package, formatted, yapf_style
    from integrate.templates.regression import cache_test, tp_test
    from integrate.verify.proofs import cache as cache_proof

    from . import class_names, model_class_names, run_survey
    from .audit import audit_row

    progress = progress or (lambda line: None)
    if len(only) != 1:
        raise InputError("--fix writes one fix: name one class with --only CLASS")
    package = find_package(src)
    survey = run_survey([], classes=tuple(only), progress=lambda line: None)
    rows = [r for r in survey.rows if r.status == "ok" and r.transformer_class == only[0] and r.already_supported
            and r.already_supported.registered]
    if not rows:
        raise InputError(f"--only {only[0]}: not a transformer class the installed cache-dit registers")
    row = rows[0]
    head = {"schema": FIX_SCHEMA, "schema_version": FIX_SCHEMA_VERSION, "tool_version": __version__,
            "transformer_class": row.transformer_class, "package": str(package)}
    with tempfile.TemporaryDirectory(prefix="integrate-fix-") as tmp:
        work = Path(tmp)
        progress(f"auditing {row.transformer_class} (cache-dit's integration and ours, proofs: {', '.join(proofs)})")
        audited = audit_row(row, survey.diffusers.version, work / "audit", proofs, class_names())
        findings = [p for p in audited.proofs if p.status == "finding"]
        if audited.status == "error" or not findings:
            return FixReport(**head, status="nothing-to-fix", audit=audited,
                             why=audited.why if audited.status == "error" else
                             f"the audit labels {row.transformer_class} {audited.status}: no finding to fix")
        base = work / "audit" / row.transformer_class
        plan, _ = require_approved(base / "plan")
        name = plan.model.example_name or row.transformer_class.lower()
        lookup = " / ".join(n for n in ((plan.model.pipeline_class or "").split(".")[0],
                                        plan.model.transformer_class) if n)
        manual: list[str] = []
        candidates = []  # (proof, rewrite, test relpath, test text)
        description = None

        def read(rel: str) -> str | None:
            path = package / rel
            return path.read_text(encoding="utf-8") if path.is_file() else None

        installed = model_class_names()

        def unproved_others(key: str, folder: str, registry: str) -> str | None:
            keys = registered_keys(read, package_files(package, folder), registry)
            others = also_answers(key, row.transformer_class, installed, keys)
            return None if not others else (
                f"cache-dit's registration '{key}' also answers {', '.join(others)} (installed diffusers); the fix is "
                f"proved on {row.transformer_class} alone, so it is not written over it in place")

        for p in findings:
            try:
                if p.name == "cache":
                    rewrite, why = _rewrite_for(plan)
                    if rewrite is None:
                        manual.append(f"cache: {why}")
                        continue
                    planned = rewrite_adapter(read, rewrite)
                    wider = unproved_others(planned.key, ADAPTERS, REGISTRY)
                    if wider:
                        manual.append(f"cache: {wider}")
                        continue
                    what = ", ".join(f"{a}: {pat}" for a, pat in zip(rewrite.blocks, rewrite.patterns))
                elif p.name == "tp" and isinstance(p.cache_dit_registers, str):
                    text, symbol = _our_planner(base, "tp")
                    if text is None:
                        manual.append("tp: our integration writes no TP planner for it")
                        continue
                    key = p.cache_dit_registers.split(" -> ")[0]
                    wider = unproved_others(key, PLANNERS, PLANNER_REGISTRIES["tp"])
                    if wider:
                        manual.append(f"tp: {wider}")
                        continue
                    rewrite = PlannerRewrite("tp", key, text, symbol)
                    planned = None
                    what = f"the planner {symbol}"
                else:
                    manual.append(f"{p.name}: a fix for a {p.name} finding is not written in place yet (generate "
                                  "--replace-builtin gives ours as a plugin)")
                    continue
            except InputError as exc:
                manual.append(f"{p.name}: {exc}")
                continue
            if description is None:
                progress("describing the audit's fixture for the regression tests")
                description = describe_fixture(base / "out" / "verify_fixture.py")
            finding = _finding_text(p, what)
            if p.name == "cache":
                rel, text = cache_test(description, name=name, lookup=lookup, key=planned.key,
                                       where=f"cache_dit/{planned.relpath}:{planned.line}", finding=finding,
                                       threshold=cache_proof.THRESHOLD, slack=cache_proof.CACHED_SLACK,
                                       floor=cache_proof.CACHED_FLOOR)
            else:
                rel, text = tp_test(description, name=name, lookup=lookup, key=rewrite.key,
                                    where=p.cache_dit_registers.split(" -> ")[-1], finding=finding)
            candidates.append((p.name, rewrite, rel, formatted(text, yapf_style(package), rel)))
        runs: list[TestRun] = []
        kept = []
        for proof, rewrite, rel, text in candidates:
            test = work / "tests" / proof / Path(rel).name
            test.parent.mkdir(parents=True)
            test.write_text(text, encoding="utf-8")
            progress(f"{proof}: running the regression test against {package} as it is (it must fail)")
            before = run_test(test, package, "before", proof)
            scratch = work / "after" / proof / package.name
            shutil.copytree(package, scratch, ignore=shutil.ignore_patterns("__pycache__"))
            apply_checkout(scratch, [], [], rewrites=[rewrite])
            progress(f"{proof}: running it against a copy with the fix written in (it must pass)")
            after = run_test(test, scratch, "after", proof)
            runs += [before, after]
            if before.status == "fail" and after.status == "pass":
                kept.append((proof, rewrite, rel, text))
            else:
                manual.append(f"{proof}: " + ("its regression test passes on the checkout as it is: it does not show "
                                              "the defect" if before.status == "pass" else
                                              "its regression test fails with our fix written in")
                              + ": not written")
        if not kept:
            return FixReport(**head, status="not-fixed", audit=audited, runs=tuple(runs), manual=tuple(manual),
                             why="no fix both failed its regression test before and passed it after: the checkout is "
                                 "left as it was")
        # everything is rendered before anything is written: a failure leaves the checkout and --out as they were
        planned = apply_checkout(package, [], [], rewrites=[k[1] for k in kept], dry_run=True)
        report = FixReport(**head, status="fixed" if not manual else "partly-fixed", audit=audited,
                           rewritten=tuple(planned["rewritten"]), tests=tuple(k[2] for k in kept), runs=tuple(runs),
                           changed=tuple(planned["changed"]), diff=planned["diff"], manual=tuple(manual))
        files = {k[2]: k[3] for k in kept} | {"PR.md": fix_markdown(to_json(report)), "fix.diff": planned["diff"]}
        progress(f"writing the fix into {package}")
        result = apply_checkout(package, [], [], rewrites=[k[1] for k in kept])
        if result["diff"] != planned["diff"]:  # the checkout changed under us between the two
            raise InputError(f"{package} changed while the fix was being written: run again")
        written = write_tree(out, files)
        return FixReport(**{**{k: getattr(report, k) for k in report.__dataclass_fields__}, "files": tuple(written)})
