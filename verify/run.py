"""`integrate verify`: the CPU proofs of a generated integration, each in processes of its own.

1. fixture  - a tiny config and forward inputs (derived, or the user's edited file): fixture.py
2. baseline - the plain model, one process, no plugin: the reference outputs and every module's output
3. the proofs in `proofs/` (state dict, cache, CP, TP, ...), each judged against the baseline (a paired proof on a
   tiny config of its own, hybrid's, against the plain model run on that config beside it)
A proof that fails is followed module by module against the baseline to the first divergent module.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from integrate.decisions.approval import require_approved

from integrate.errors import InputError
from integrate.resolve import Workspace
from integrate.workers import installed, model_roots, user_path, worker_env

from . import component, fixture, paired, processes
from . import proofs as registry
from .locate import Baseline
from .proofs import cache as cache_proof
from .records import (
    NOT_REQUESTED,
    VERIFY_SCHEMA,
    VERIFY_SCHEMA_VERSION,
    FixtureReport,
    PluginRef,
    VerifyModel,
)
from .report import VerifyReport


class Verifier:
    def __init__(self, plan_dir: Path, generated: Path, *, trust_code: bool = False,
                 proofs: tuple[str, ...] | None = None, fixture_only: bool = False, fixture_from: Path | None = None,
                 cache_dit_own: bool = False, progress: Callable[[str], None] | None = None,
                 baseline: Path | None = None, variants: tuple[str, ...] | None = None,
                 skip: tuple[str, ...] = (), fail_fast: bool = False) -> None:
        self.cache_dit_own = cache_dit_own  # prove cache-dit's own integration: the plugin is never imported
        # `integrate repair`'s trials: the plain model's run kept in `baseline` (made there by the first verify of
        # the same fixture, read back by the later ones) and only the named parallel `variants` run (none of those
        # in `skip`); `fail_fast`: a parallel proof's first variant runs alone, the rest only if it passes
        self.baseline, self.only = baseline, set(variants) if variants else None
        self.skip, self.fail_fast = set(skip), fail_fast
        self.plan_dir, self.generated = plan_dir, generated
        self.proofs = () if fixture_only else tuple(proofs or registry.DEFAULTS)
        self.trust_code = trust_code
        # proofs that run the model follow: their fork server starts with the fixture, which is forked from it too
        self._proofs_follow = bool(set(self.proofs) - set(_names("meta")) - set(_names("component")))
        # the transformer's fixture is needed by every proof but the component ones (a text encoder's, the VAE's)
        self._needs_fixture = fixture_only or bool(set(self.proofs) - set(_names("component")))
        self.progress = progress or (lambda message: None)
        self.plan, approval = require_approved(plan_dir)
        m = self.plan.model
        if not m.example_name:
            raise InputError("the plan names no example: nothing was generated for it")
        self.import_name = f"integrate_{m.example_name}"
        if not cache_dit_own and not (generated / self.import_name / "__init__.py").is_file():
            raise InputError(f"{generated}: no generated plugin `{self.import_name}` here; run "
                             f"`integrate generate {plan_dir} --out {generated}` first")
        transformer_file = Path(m.transformer_file)
        if not installed(transformer_file) and not trust_code:
            raise InputError(f"{transformer_file} is not part of an installed package: verify would run it; "
                             "pass --trust-code if you trust that code")
        if fixture_from is not None:
            if not fixture_from.is_file():
                raise InputError(f"--fixture-from {fixture_from}: no such file")
            if not trust_code:
                raise InputError(f"--fixture-from {fixture_from}: verify would import and run that file; pass "
                                 "--trust-code if you trust it")
        # the fixture's gate reads the same files: parsed once, from the bytes the reviewer approved
        self.ws = Workspace(expect=approval.sources, source_roots=m.roots)
        src = self.ws.load(transformer_file)
        self.module = src.dotted_name or src.path.stem
        root = src.package_root or src.path.parent
        # where the workers import the model from: the plan's --source-root folders and a source checkout's package
        # root (`roots`), then the user's PYTHONPATH (each checked to be a folder)
        self.roots = model_roots(None if installed(src.path) else root, m.roots, "--source-root (in plan.json)")
        self.paths = self.roots + tuple(p for p in user_path() if p not in self.roots)
        self.env = worker_env()
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.stub = None if cache_dit_own else _open_stub(generated / self.import_name)
        self.fixture = fixture.Maker(self.plan, self.ws, generated / fixture.FILENAME, self.module, self.paths,
                                     self.env, steps=cache_proof.STEPS, progress=self.progress,
                                     fixture_from=fixture_from, fork=self._proofs_follow)

    # ---- running ----------------------------------------------------------------------------------------

    def _job(self, kind: str, variants: list[dict], out: Path, plugin: bool = True) -> dict:
        job = {"mode": "run", "kind": kind, "variants": variants, "fixture": str(self.fixture.path.absolute()),
               "out": str(out.absolute()), "threshold": cache_proof.THRESHOLD}
        if plugin and not self.cache_dit_own:
            job["plugin"] = {"path": str(self.generated.resolve()), "import_name": self.import_name}
        return job

    def _single(self, kind: str, out: Path, plugin: bool, config: dict | None = None):
        out.mkdir(parents=True, exist_ok=True)
        variant = {"name": kind, **({"config": config} if config else {})}
        return processes.spawn(self._job(kind, [variant], out, plugin), self.env, self.paths)

    def _pair(self, variants: list[dict], out: Path) -> tuple[list, list]:
        out.mkdir(parents=True, exist_ok=True)
        port = processes.free_port()
        world = _world(variants)
        procs = []
        for rank in range(world):
            env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(processes.spawn(self._job("parallel", variants, out), env, self.paths))
        tails = processes.wait(procs)
        return [processes.load_rank(out, r) for r in range(world)], tails

    def _singles(self) -> list:
        """The requested proofs that run in one process of their own beside the baseline."""
        return [p for p in registry.ALL if p.KIND == "single" and p.NAME in self.proofs]

    def _reads_kept_baseline(self) -> bool:
        """A baseline kept by an earlier verify of this fixture serves (a single proof runs its own beside one)."""
        return self.baseline is not None and (self.baseline / "rank0.json").is_file() and not self._singles()

    def _first_runs(self, work: Path):
        """The baseline, and each single proof's process beside it (their stderr tails follow the baseline's). A
        baseline kept from an earlier verify of the same fixture (`self.baseline`) is read back instead of run; one
        run here is kept there."""
        if self._reads_kept_baseline():
            rep, arrays = processes.load_rank(self.baseline, 0)
            return rep, arrays, [""]
        procs = [self._single("baseline", work / "baseline", plugin=False)]
        if self.stub is None:
            procs += [self._single(p.NAME, work / p.NAME, plugin=True) for p in self._singles()]
        own = [(name, changes) for name, changes in self._own.items() if isinstance(changes, dict) and changes]
        procs += [self._single("baseline", work / f"baseline-{name}", plugin=False, config=_after(changes))
                  for name, changes in own]  # the plain model on a proof's own config, beside the plain run
        tails = processes.wait(procs, grace=processes.PROCESS_TIMEOUT)
        self._own_tails.update({name: tail for (name, _), tail in zip(own, tails[len(procs) - len(own):])})
        base_rep, base = processes.load_rank(work / "baseline", 0)
        if self.baseline is not None and base_rep is not None:
            shutil.copytree(work / "baseline", self.baseline, dirs_exist_ok=True)
        return base_rep, base, tails

    def _own_configs(self) -> dict[str, dict | str]:
        """{proof: the fixture config keys it changes (key -> (fixture's, its own)), or why it cannot} of each
        requested paired proof that runs on a tiny config of its own (`config(fixture_config)`: hybrid's heads)."""
        out: dict[str, dict | str] = {}
        for proof in registry.PAIRED:
            if proof.NAME not in self.proofs or not hasattr(proof, "config"):
                continue
            if not self.cache_dit_own and proof.not_planned(self.plan):
                continue
            config = fixture.constant(self.fixture.path, "CONFIG")
            out[proof.NAME] = (proof.config(config) if isinstance(config, dict) else
                               f"the fixture's CONFIG ({self.fixture.path}) is not a literal {proof.NAME} can change")
        return out

    def _own_baseline(self, name: str, changes: dict, work: Path) -> tuple[Baseline | None, str | None]:
        """The plain model's run on a proof's own config (run beside the plain run, or here when that was kept from
        an earlier verify), or why there is none."""
        out = work / f"baseline-{name}"
        if name not in self._own_tails:
            self._own_tails[name] = processes.wait([self._single("baseline", out, plugin=False,
                                                                 config=_after(changes))],
                                                   grace=processes.PROCESS_TIMEOUT)[0]
        rep, arrays = processes.load_rank(out, 0)
        said = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
        if rep is None or "error" in rep["variants"]["baseline"]:
            why = rep["variants"]["baseline"]["error"] if rep else {"message": self._own_tails[name]}
            return None, (f"the plain tiny model does not run on {name}'s config ({said}): {why.get('message')} "
                          f"(module {why.get('module')}): a fact of the fixture, not of the integration")
        return Baseline(rep["variants"]["baseline"], arrays, self.fixture.streams()), None

    def _pair_runs(self, variants: list[dict], work: Path) -> dict[str, tuple[list, list, list]]:
        """{variant: (per-rank report, per-rank arrays, stderr tails)}, in as few process pairs as possible:
        a pair that stops at a failure is followed by one for the variants left."""
        runs: dict[str, tuple[list, list, list]] = {}
        todo = list(variants)
        for attempt in range(len(variants)):
            if not todo:
                break
            ranks, tails = self._pair(todo, work / f"pair{attempt}")
            reached = []
            for v in todo:
                reps = [r[0]["variants"].get(v["name"]) if r[0] else None for r in ranks]
                if any(r is not None for r in reps):
                    runs[v["name"]] = (reps, [r[1] for r in ranks], tails)
                    reached.append(v)
            if not reached:  # the pair reported nothing at all: say why for every variant left
                for v in todo:
                    runs[v["name"]] = ([None] * _world(todo), [{}] * _world(todo), tails)
                break
            todo = todo[todo.index(reached[-1]) + 1:]
        return runs

    def run(self) -> VerifyReport:
        started = time.monotonic()
        head = dict(schema=VERIFY_SCHEMA, schema_version=VERIFY_SCHEMA_VERSION,
                    model=VerifyModel(self.plan.model.transformer_class, self.plan.model.pipeline_class),
                    plugin=PluginRef(str(self.generated.resolve()), self.import_name))
        if not self._needs_fixture:  # only pipeline parts other than the transformer are proved
            fx = FixtureReport(str(self.fixture.path), "skipped", errors=(
                "not needed: the proofs asked for build their own parts",))
            return self._report(head, fx, started, results=self._components())
        sizing = self._start_meta()  # runs beside the fixture's derivation: it needs no fixture
        self._own, self._own_tails = {}, {}
        try:
            fx = self.fixture.ensure()
        except InputError:  # the model cannot be imported here (a missing package): the meta proofs stop too
            for _, proc in sizing:
                proc.kill()
                proc.wait()
            raise
        results: dict = {proof.NAME: self._judge_meta(proof, proc) for proof, proc in sizing}
        if fx.status in ("error", "needs-edit"):
            why = f"no usable fixture: edit {fx.path}"
            return self._report(head, fx, started, error=why, results=results)
        if not (set(self.proofs) - set(_names("meta"))):
            # --fixture-only (or meta-device proofs alone): a derived fixture has run the plain model once; an
            # edited one runs here
            if fx.status == "edited":
                fx = self.fixture.check_edited()
            return self._report(head, fx, started, results=results)
        self._own = self._own_configs()
        with tempfile.TemporaryDirectory(prefix="integrate-verify-") as tmp:
            work = Path(tmp)
            self.progress("baseline: the plain model's run, kept from an earlier verify of this fixture"
                          if self._reads_kept_baseline() else
                          "baseline: the plain model, one process" + "".join(
                              f" | {p.NAME}: the adapter, one process" for p in self._singles()))
            base_rep, base, tails = self._first_runs(work)
            if base_rep is None or "error" in base_rep["variants"]["baseline"]:
                why = (base_rep["variants"]["baseline"]["error"] if base_rep else {"message": tails[0]})
                return self._report(head, fx, started, error=f"the plain tiny model does not run: "
                                    f"{why.get('message')} (module {why.get('module')}); fix {fx.path}",
                                    results=results)
            baseline = Baseline(base_rep["variants"]["baseline"], base, self.fixture.streams())
            for i, proof in enumerate(self._singles(), 1):
                if self.stub is not None:  # its process (and the proofs judged from it) would stop at the stub
                    results.update({p.NAME: p.RECORD("needs-code", why=self.stub) for p in registry.ALL
                                    if p is proof or getattr(p, "FROM", None) == proof.NAME})
                    continue
                rep, arrays = processes.load_rank(work / proof.NAME, 0)
                results.update(proof.judge(baseline, rep, arrays, tails[i]))
            # CP and TP run in separate process pairs: enabling one can patch classes the other then trips on
            for proof in registry.PAIRED:
                if proof.NAME not in self.proofs:
                    continue
                unplanned = None if self.cache_dit_own else proof.not_planned(self.plan)
                if unplanned:  # the plugin has nothing to prove here: said, not run into an error
                    results[proof.NAME] = proof.RECORD("skipped", why=unplanned)
                    continue
                changes, base = self._own.get(proof.NAME), baseline
                if isinstance(changes, str):  # a tiny config of its own is needed, and this fixture gives none
                    results[proof.NAME] = proof.RECORD("skipped", why=changes)
                    continue
                if changes:
                    base, why = self._own_baseline(proof.NAME, changes, work)
                    if why is not None:
                        results[proof.NAME] = proof.RECORD("skipped", why=why, config=changes)
                        continue
                planned = [{**v, "config": _after(changes)} if changes else v for v in proof.variants(self.plan)]
                # the named variants, or what they were retried from (`ulysses2+anything` of `ulysses2`); every
                # variant where none of them is this plan's (a revision changed its variants)
                named = [v for v in planned if self.only is None or v["name"] in self.only
                         or any(n.startswith(f"{v['name']}+") for n in self.only)]
                variants = [v for v in named or planned if v["name"] not in self.skip]
                waiting = [v for v in variants if v.get("cache") and self.stub is not None]
                variants = [v for v in variants if v not in waiting]  # the adapter calls the stub
                self.progress(proof.progress(variants))
                runs, ran, judged = {}, [], None
                for batch in [variants[:1], variants[1:]] if self.fail_fast else [variants]:
                    if not batch:
                        continue
                    got = self._pair_runs(batch, work / proof.NAME / f"batch{len(ran)}")
                    again = paired.uneven_retries(batch, got)
                    if again:  # an odd sequence on this fixture: cache-dit's uneven split is the way to run it
                        self.progress(f"{proof.NAME}: the fixture's sequence does not divide by 2: again with "
                                      "ulysses_anything")
                        got.update(self._pair_runs(again, work / proof.NAME / f"batch{len(ran)}-anything"))
                        batch = batch + again
                    runs.update(got)
                    ran += batch
                    judged = paired.judge(base, ran, runs) if self.fail_fast else None
                    if judged is not None and judged.status in ("fail", "error"):
                        break  # the variants after it are not run
                judged = judged or paired.judge(base, ran, runs)  # (fail-fast judged every variant run)
                judged = paired.with_stub(judged, waiting, self.stub)
                results[proof.NAME] = dataclasses.replace(judged, config=changes) if changes else judged
        results.update(self._components())
        return self._report(head, fx, started, results=results)

    def _components(self) -> dict:
        """The requested component proofs (TE-P, VAE-P): each part of the pipeline with a planner, in processes of
        its own; a proof with nothing to prove says why."""
        results = {}
        for proof in registry.ALL:
            if proof.KIND != "component" or proof.NAME not in self.proofs:
                continue
            unplanned = proof.not_planned(self.plan)
            if unplanned:
                results[proof.NAME] = proof.RECORD("skipped", why=unplanned)
                continue
            plugin = None if self.cache_dit_own else {"path": str(self.generated.resolve()),
                                                      "import_name": self.import_name}
            with tempfile.TemporaryDirectory(prefix="integrate-verify-") as tmp:
                results[proof.NAME] = component.run(proof, proof.parts(self.plan), self.plan.model.model_path,
                                                    plugin, self.trust_code, self.env, self.paths, Path(tmp),
                                                    self.progress)
        return results

    def _start_meta(self) -> list:
        """(proof, process) of each requested meta-device proof, started now: they need no fixture."""
        started = []
        config = self.fixture.real_config()[0]
        for proof in registry.ALL:
            if proof.KIND != "meta" or proof.NAME not in self.proofs:
                continue
            self.progress(f"{proof.NAME}: {proof.SUMMARY}")
            job = {**proof.job(self.plan), "transformer_module": self.module,
                   "transformer_class": self.plan.model.transformer_class, "config": config}
            started.append((proof, processes.spawn(job, self.env, self.paths, fork=self._proofs_follow)))
        return started

    @staticmethod
    def _judge_meta(proof, proc):
        import json

        proc.wait()
        out, err = processes.finish(proc)
        if proc.returncode != 0 or not out.strip():
            return proof.judge(None, (err.strip().splitlines() or ["no output"])[-1])
        return proof.judge(json.loads(out), None)

    def _report(self, head: dict, fx: FixtureReport, started: float, *, results: dict | None = None,
                error: str | None = None) -> VerifyReport:
        results = results or {}
        for proof in registry.ALL:
            if proof.NAME not in results:
                results[proof.NAME] = (proof.RECORD("error", why=error) if error is not None else
                                       proof.RECORD("skipped", why=NOT_REQUESTED))
        return VerifyReport(**head, fixture=fx, **results, seconds=round(time.monotonic() - started, 1))


def _names(kind: str) -> tuple[str, ...]:
    return tuple(p.NAME for p in registry.ALL if p.KIND == kind)


def _open_stub(plugin: Path) -> str | None:
    """Why the proofs through the adapter wait (`needs-code`): the plugin's hand-written part is still the
    generated stub. None when there is none, or it is filled in."""
    from integrate.templates import MANUAL_MODULE, is_stub

    path = plugin / f"{MANUAL_MODULE}.py"
    if path.is_file() and is_stub(path.read_text()):
        return (f"{path.name} is a stub: write apply_manual as its contract says (the changes integrate could not "
                "write), then delete NEEDS_CODE")
    return None


def _after(changes: dict) -> dict:
    """{key: its new value} of {key: (before, after)}."""
    return {k: after for k, (_, after) in changes.items()}


def _world(variants: list[dict]) -> int:
    """How many processes a set of paired variants runs on: 2, or the `world` they declare (one for them all)."""
    return max((v.get("world", 2) for v in variants), default=2)
