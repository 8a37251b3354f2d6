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
Findings of the CP and TP proofs are listed under `manual` with the planner that answered: writing a planner over a
built-in one in place is not done yet. A fix that needs a PatchFunctor or a hand-written patch is `manual` too.
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

from integrate import __version__, api
from integrate.errors import InputError
from integrate.records import OMIT, to_json

from .records import FIX_SCHEMA, FIX_SCHEMA_VERSION, FixReport, TestRun

TEST_TIMEOUT = 600
_RUNNER = ("import sys, cache_dit, pytest\n"
           "where = cache_dit.__file__\n"
           "if not where.startswith(sys.argv[1]):\n"
           "    sys.exit(f'cache_dit imported from {where}, not from the tree under test {sys.argv[1]}')\n"
           "sys.exit(pytest.main(sys.argv[2:]))\n")


def run_test(test: Path, package: Path, tree: str) -> TestRun:
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
            return TestRun(tree, "fail", f"timed out after {TEST_TIMEOUT} s")
    tail = (proc.stdout + proc.stderr).strip()[-3000:]
    return TestRun(tree, "pass" if proc.returncode == 0 else "fail", tail)


def describe_fixture(fixture: Path) -> dict:
    """The fixture's config and inputs as data (`integrate.verify.describe`, in a worker: loading it runs it)."""
    from integrate.workers import worker_command

    proc = subprocess.run(worker_command("integrate.verify.describe", None, str(fixture)), capture_output=True,
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


def run_fix(only: tuple[str, ...], src: Path, out: Path, proofs: tuple[str, ...],
            progress: Callable[[str], None] | None = None) -> FixReport:
    from integrate.decisions.approval import require_approved
    from integrate.files import write_tree
    from integrate.render.markdown import fix_markdown
    from integrate.templates.checkout import apply_checkout, find_package, formatted, yapf_style
    from integrate.templates.regression import cache_test
    from integrate.verify.proofs import cache as cache_proof

    from . import class_names
    from .audit import audit_row

    progress = progress or (lambda line: None)
    if len(only) != 1:
        raise InputError("--fix writes one fix: name one class with --only CLASS")
    package = find_package(src)
    survey = api.survey(classes=tuple(only), progress=lambda line: None)
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
        manual = [f"{p.name}: cache-dit's planner ({p.cache_dit_registers if p.cache_dit_registers is not OMIT else '?'})"
                  " fails where ours passes; writing a planner over a built-in one in place is not done yet "
                  "(generate --replace-builtin gives ours as a plugin)" for p in findings if p.name != "cache"]
        cache = next((p for p in findings if p.name == "cache"), None)
        if cache is None:
            return FixReport(**head, status="not-fixed", audit=audited, manual=tuple(manual),
                             why="no fix written: the findings are of planners only")
        base = work / "audit" / row.transformer_class
        plan, _ = require_approved(base / "plan")
        rewrite, why = _rewrite_for(plan)
        if rewrite is None:
            return FixReport(**head, status="not-fixed", audit=audited, manual=(f"cache: {why}", *manual), why=why)
        progress("writing the regression test from the audit's fixture")
        description = describe_fixture(base / "out" / "verify_fixture.py")
        finding = (f"integrate audit: {cache.cache_dit_why if cache.cache_dit_why is not OMIT else 'it fails'}"
                   + (f" (first divergent module: {cache.cache_dit_first_divergence})"
                      if cache.cache_dit_first_divergence not in (None, OMIT) else "")
                   + "; our integration ("
                   + ", ".join(f"{a}: {p}" for a, p in zip(rewrite.blocks, rewrite.patterns))
                   + ") passes the same proof.")
        name = plan.model.example_name or row.transformer_class.lower()
        # the key and file cache-dit answers with, read from the checkout (its adapter may differ from the installed)
        from integrate.templates.builtin import rewrite_adapter

        def read(rel: str) -> str | None:
            path = package / rel
            return path.read_text(encoding="utf-8") if path.is_file() else None

        try:
            planned = rewrite_adapter(read, rewrite)
        except InputError as exc:
            return FixReport(**head, status="not-fixed", audit=audited, manual=(f"cache: {exc}", *manual),
                             why=str(exc))
        rel, text = cache_test(description, name=name, lookup=" / ".join(rewrite.lookup), key=planned.key,
                               where=f"cache_dit/{planned.relpath}:{planned.line}", finding=finding,
                               threshold=cache_proof.THRESHOLD, slack=cache_proof.CACHED_SLACK,
                               floor=cache_proof.CACHED_FLOOR)
        text = formatted(text, yapf_style(package), rel)
        test = work / "test" / Path(rel).name
        test.parent.mkdir()
        test.write_text(text, encoding="utf-8")
        progress(f"running the regression test against {package} as it is (it must fail)")
        before = run_test(test, package, "before")
        scratch = work / "after" / package.name
        shutil.copytree(package, scratch, ignore=shutil.ignore_patterns("__pycache__"))
        applied = apply_checkout(scratch, [], [], rewrites=[rewrite])
        progress("running it against a copy with the fix written in (it must pass)")
        after = run_test(test, scratch, "after")
        runs = (before, after)
        rewritten = tuple(applied["rewritten"])
        if before.status != "fail" or after.status != "pass":
            why = ("the regression test passes on the checkout as it is: it does not show the defect"
                   if before.status == "pass" else "the regression test fails with the fix written in")
            return FixReport(**head, status="not-fixed", audit=audited, rewritten=rewritten, runs=runs,
                             manual=tuple(manual), diff=applied["diff"], why=why + ": the checkout is left as it was")
        progress(f"writing the fix into {package}")
        result = apply_checkout(package, [], [], rewrites=[rewrite])
        report = FixReport(**head, status="fixed", audit=audited, rewritten=rewritten, test=rel, runs=runs,
                           changed=tuple(result["changed"]), diff=result["diff"], manual=tuple(manual))
        pr = fix_markdown(to_json(report), text_of_test=text)
        written = write_tree(out, {rel: text, "PR.md": pr, "fix.diff": result["diff"]})
        return FixReport(**{**{k: getattr(report, k) for k in report.__dataclass_fields__}, "files": tuple(written)})
