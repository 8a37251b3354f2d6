"""`integrate verify`: the CPU proofs of a generated integration, each in processes of its own.

1. fixture  - a tiny config and forward inputs (derived, or the user's edited file)
2. baseline - the plain model, one process, no plugin: the reference outputs and every module's output
3. cache    - the plugin's adapter: state dict kept, block contracts observed, caching off bit-identical,
              caching on actually caches with finite residual diffs and stays close
4. cp       - Ulysses (and ring / Ulysses-anything when the plan calls for them) over 2 gloo processes
5. tp       - 2 gloo processes, the device mesh on "cpu"
A proof that fails is followed module by module against the baseline to the first divergent module.
"""

from __future__ import annotations

import json
import os
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from integrate.approval import require_approved
from integrate.errors import InputError
from integrate.probe import _worker_env
from integrate.resolve import Workspace
from integrate.verify import compare, fixture

SCHEMA_VERSION = "1.0"
WORKER = "integrate.verify._worker"
PROOFS = ("cache", "cp", "tp")
CACHE_THRESHOLD = 0.8  # permissive: tiny random models change a lot between steps
CACHED_SLACK, CACHED_FLOOR = 3.0, 0.02  # a cached step may be off by a few times the step's own move
STEPS = 4
PROCESS_TIMEOUT = 300


def _installed(path: Path) -> bool:
    roots = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages(),
                                         sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]}
    path = path.resolve()
    return any(path.is_relative_to(r) for r in roots)


def _module_of(src) -> tuple[str, str | None]:
    """(dotted module name, folder to put on sys.path when not installed) for a parsed source file."""
    name = src.dotted_name or src.path.stem
    root = src.package_root or src.path.parent
    return name, None if _installed(src.path) else str(root)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(job: dict, env: dict) -> subprocess.Popen:
    """A worker whose stdout and stderr go to files (a pipe nobody reads until the end can fill and stall it)."""
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", WORKER], stdin=subprocess.PIPE, stdout=out, stderr=err, text=True,
                            env=env)
    proc.out_file, proc.err_file = out, err
    proc.stdin.write(json.dumps(job))
    proc.stdin.close()
    return proc


def _read(f) -> str:
    f.seek(0)
    text = f.read()
    f.close()
    return text


def _wait(procs: list[subprocess.Popen], grace: float = 15.0) -> list[str | None]:
    """Wait for all; once one has finished and the rest have not within `grace` seconds (a peer stuck in
    a collective after a failure), kill them. Returns the stderr tail of each failed process."""
    start, first_done = time.monotonic(), None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if first_done is None and any(p.poll() is not None for p in procs):
            first_done = now
        if (first_done is not None and now - first_done > grace) or now - start > PROCESS_TIMEOUT:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    tails = []
    for p in procs:
        _read(p.out_file)
        err = _read(p.err_file)
        tails.append(None if p.returncode == 0 else ("\n".join(err.strip().splitlines()[-5:]) or
                                                     f"killed (exit {p.returncode})"))
    return tails


def _load_rank(out: Path, rank: int) -> tuple[dict | None, dict[str, np.ndarray]]:
    js, npz = out / f"rank{rank}.json", out / f"rank{rank}.npz"
    if not js.is_file():
        return None, {}
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads(js.read_text()), arrays


def _acts(arrays: dict[str, np.ndarray], variant: str) -> dict[str, list[np.ndarray]]:
    prefix = f"{variant}/act/"
    out: dict[str, list[np.ndarray]] = {}
    for key in sorted((k for k in arrays if k.startswith(prefix)), key=lambda k: int(k.rsplit("#", 1)[1])):
        out.setdefault(key[len(prefix):].rsplit("#", 1)[0], []).append(arrays[key])
    return out


class Verifier:
    def __init__(self, plan_dir: Path, generated: Path, *, trust_code: bool = False,
                 proofs: tuple[str, ...] = PROOFS, progress: Callable[[str], None] | None = None) -> None:
        self.plan_dir, self.generated, self.proofs = plan_dir, generated, proofs
        self.progress = progress or (lambda message: None)
        self.plan = require_approved(plan_dir)
        m = self.plan["model"]
        if not m.get("example_name"):
            raise InputError("the plan names no example: nothing was generated for it")
        self.import_name = f"integrate_{m['example_name']}"
        if not (generated / self.import_name / "__init__.py").is_file():
            raise InputError(f"{generated}: no generated plugin `{self.import_name}` here; run "
                             f"`integrate generate {plan_dir} --out {generated}` first")
        self.transformer_file = Path(m["transformer_file"])
        if not _installed(self.transformer_file) and not trust_code:
            raise InputError(f"{self.transformer_file} is not part of an installed package: verify would run it; "
                             "pass --trust-code if you trust that code")
        self.ws = Workspace()  # the gate below reads the same files: parsed once
        self.module, self.search_path = _module_of(self.ws.load(self.transformer_file))
        self.env = _worker_env(Path(self.search_path) if self.search_path else None)
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.fixture_path = generated / fixture.FILENAME

    # ---- the fixture ------------------------------------------------------------------------------------

    def _passed(self) -> dict[str, int | None]:
        from integrate.analyzers.structure import pipeline_arg_ndims, pipeline_call_keywords
        from integrate.gate import GateFlags, run_gate

        ws = self.ws
        gate = run_gate(GateFlags.of_plan(self.plan["model"]), ws)
        ndims = {k: v[0] for k, v in pipeline_arg_ndims(ws, gate).items()}
        passed = {k: ndims.get(k) for k in pipeline_call_keywords(ws, gate)}
        # masks the forward takes: pipelines often pass them through `**kwargs`, and they are what a CP
        # mask reorder is about, so the fixture always has them
        seq = self.plan["facts"].get("sequence") or {}
        for mask in seq.get("masks", []):
            if mask["name"] in seq.get("forward_params", []):
                passed.setdefault(mask["name"], None)
        return passed

    def ensure_fixture(self) -> dict:
        from integrate.analyzers.structure import load_config

        path = self.fixture_path
        if fixture.edited(path):
            fixture.load(path)  # a broken edit is the user's input error: say so now
            return {"path": str(path), "status": "edited", "errors": []}
        self.progress("deriving the tiny fixture")
        m = self.plan["model"]
        config = load_config(m["model_path"])
        job = {"mode": "derive", "transformer_module": self.module, "transformer_class": m["transformer_class"],
               "search_path": self.search_path, "config": config, "passed": self._passed()}
        proc = _spawn(job, self.env)
        proc.wait()
        out, err = _read(proc.out_file), _read(proc.err_file)
        if proc.returncode != 0 or not out.strip():
            tail = (err.strip().splitlines() or ["no output"])[-1]
            return {"path": str(path), "status": "error", "errors": [f"deriving the fixture failed: {tail}"]}
        d = json.loads(out)
        source = f"{m['model_path']}/transformer/config.json" if config else "the class defaults"
        self._derived = (d, source)
        self._write_fixture(d, source)
        errors = [f"`{s['name']}`: {s['error']}" for s in d["slots"] if s.get("error")]
        if d.get("error"):
            return {"path": str(path), "status": "needs-edit", "errors": [f"CONFIG: {d['error']}"],
                    "parameters": d["parameters"], "changes": d["changes"]}
        return {"path": str(path), "status": "needs-edit" if errors else "derived", "errors": errors,
                "parameters": d["parameters"], "changes": {k: v for k, v in d["changes"].items()},
                "image_tokens": d["image_tokens"], "text_tokens": d["text_tokens"]}

    def _write_fixture(self, d: dict, source: str, mask_dtype: str | None = None) -> None:
        slots = d["slots"]
        if mask_dtype:  # masks as the model wants them, found by running it
            slots = [{**x, "expr": f"{x['expr']}.to(torch.{mask_dtype})"} if (x.get("expr") or "").startswith("_mask(")
                     else x for x in slots]
        text = fixture.render(transformer_class=self.plan["model"]["transformer_class"], transformer_module=self.module,
                              config=d["config"], changes=d["changes"], slots=slots,
                              image_tokens=d.get("image_tokens"), text_tokens=d.get("text_tokens", 0), steps=STEPS,
                              config_source=source, problems=[d["error"]] if d.get("error") else [])
        tmp = self.fixture_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.fixture_path)

    def _has_masks(self) -> bool:
        d = getattr(self, "_derived", (None,))[0]
        return bool(d) and any((x.get("expr") or "").startswith("_mask(") for x in d["slots"])

    # ---- running the proofs -----------------------------------------------------------------------------

    def _job(self, kind: str, variants: list[dict], out: Path, plugin: bool = True) -> dict:
        job = {"mode": "run", "kind": kind, "variants": variants, "fixture": str(self.fixture_path),
               "out": str(out), "search_path": self.search_path, "threshold": CACHE_THRESHOLD}
        if plugin:
            job["plugin"] = {"path": str(self.generated.resolve()), "import_name": self.import_name}
        return job

    def _single(self, kind: str, out: Path, plugin: bool) -> subprocess.Popen:
        out.mkdir(parents=True, exist_ok=True)
        return _spawn(self._job(kind, [{"name": kind}], out, plugin), self.env)

    def _parallel(self, variants: list[dict], out: Path) -> tuple[list, list]:
        out.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        procs = []
        for rank in range(2):
            env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(_spawn(self._job("parallel", variants, out), env))
        tails = _wait(procs)
        ranks = [_load_rank(out, r) for r in range(2)]
        return ranks, tails

    def run(self) -> dict:
        started = time.monotonic()
        report: dict = {"schema": "integrate.verify", "schema_version": SCHEMA_VERSION,
                        "model": {k: self.plan["model"][k] for k in ("transformer_class", "pipeline_class")},
                        "plugin": {"path": str(self.generated.resolve()), "import_name": self.import_name}}
        fx = report["fixture"] = self.ensure_fixture()
        empty = {"status": "skipped", "why": "not requested", "first_divergence": None}
        for name in ("state_dict", *PROOFS):
            report[name] = dict(empty)
        if fx["status"] in ("error", "needs-edit"):
            for name in ("state_dict", *PROOFS):
                report[name] = {"status": "error", "why": f"no usable fixture: edit {fx['path']}",
                                "first_divergence": None}
            report["seconds"] = round(time.monotonic() - started, 1)
            return report
        with tempfile.TemporaryDirectory(prefix="integrate-verify-") as tmp:
            work = Path(tmp)
            self.progress("baseline: the plain model, one process" + (" | cache: the adapter, one process"
                                                                      if "cache" in self.proofs else ""))
            base_rep, base, tails = self._first_runs(work)
            for dtype in (("bool", "float32") if self._has_masks() else ()):
                if base_rep is not None and "error" not in base_rep["variants"]["baseline"]:
                    break
                self.progress(f"the plain model rejects the fixture; trying masks as {dtype}")
                self._write_fixture(*self._derived, mask_dtype=dtype)
                fx["masks"] = dtype
                base_rep, base, tails = self._first_runs(work / dtype)
            if base_rep is None or "error" in base_rep["variants"]["baseline"]:
                why = (base_rep["variants"]["baseline"]["error"] if base_rep else {"message": tails[0]})
                for name in ("state_dict", *PROOFS):
                    report[name] = {"status": "error", "why": f"the plain tiny model does not run: {why.get('message')}"
                                    f" (module {why.get('module')}); fix {fx['path']}", "first_divergence": None}
                report["seconds"] = round(time.monotonic() - started, 1)
                return report
            self.base_rep, self.base = base_rep["variants"]["baseline"], base
            if "cache" in self.proofs:
                cache_rep, cache = _load_rank(self._cache_dir, 0)
                report["state_dict"], report["cache"] = self._cache(cache_rep, cache, tails[1])
            cp = self._cp_variants() if "cp" in self.proofs else []
            tp = [{"name": "tp2", "tp": 2}, {"name": "tp2+cache", "tp": 2, "cache": True}] if "tp" in self.proofs else []
            # CP and TP run in separate process pairs: enabling one can patch classes the other then trips
            # on. Within a pair, a pair that stops at a failure is followed by one for the variants left.
            if cp:
                self.progress("cp: Ulysses over 2 gloo processes" + (", then ring" if any("ring" in v for v in cp)
                                                                      else ""))
                report["cp"] = self._parallel_proof(cp, self._parallel_runs(cp, work / "cp"))
            if tp:
                self.progress("tp: 2 gloo processes, device mesh on cpu")
                report["tp"] = self._parallel_proof(tp, self._parallel_runs(tp, work / "tp"))
        report["seconds"] = round(time.monotonic() - started, 1)
        return report

    # ---- judging ----------------------------------------------------------------------------------------

    def _streams(self) -> tuple[int, int] | None:
        fx = fixture.load(self.fixture_path)
        img, txt = getattr(fx, "IMAGE_TOKENS", None), getattr(fx, "TEXT_TOKENS", None)
        return (txt, img) if img and txt else None

    def _locate(self, arrays_per_rank: list[dict[str, np.ndarray]], variant: str, error: dict | None) -> dict | None:
        div = compare.divergence(_acts(self.base, "baseline"), self.base_rep["order"],
                                 [_acts(a, variant) for a in arrays_per_rank], self._streams())
        if div["first"] is None and error is None:
            return None
        found = {"module": None, "table": div["table"], "compared": div["compared"],
                 "not_comparable": div["not_comparable"]}
        if div["first"] is not None:
            found.update(module=div["first"]["module"], max_abs=div["first"]["max_abs"],
                         cosine=div["first"]["cosine"])
        if error is not None:
            found["error"] = error
            if found["module"] is None:
                found["module"] = error.get("module") or error.get("after")
                if not error.get("module") and error.get("after"):
                    found["raised"] = (f"outside the model's modules ({error.get('at')}), right after "
                                       f"`{error['after']}` returned")
                elif error.get("module"):
                    found["raised"] = f"inside `{error['module']}` ({error.get('at')})"
        return found

    def _reference(self, steps: int, calls: int) -> np.ndarray:
        ref = self.base["baseline/out"]
        return np.repeat(ref, calls, axis=0)[: steps * calls]

    def _cache(self, rep: dict | None, arrays: dict, tail: str | None) -> tuple[dict, dict]:
        if rep is None:
            err = {"stage": "start", "module": None, "message": tail}
            return ({"status": "error", "why": tail, "first_divergence": None},
                    {"status": "error", "why": tail, "first_divergence": None, "error": err})
        v = rep["variants"]["cache"]
        sd = self._state_dict(v)
        out: dict = {"status": "pass", "first_divergence": None}
        problems = []
        if "error" in v and "patterns" not in v:
            out.update(status="error", error=v["error"], why=f"{v['error']['type']}: {v['error']['message']}")
            out["first_divergence"] = self._locate([arrays], "cache", v["error"])
            return sd, out
        out["block_counts"] = v.get("block_counts")
        out["has_separate_cfg"] = v.get("has_separate_cfg")
        out["patterns"] = [_pattern_verdict(p) for p in v.get("patterns", [])]
        problems += [f"list {p['list']}: {p['why']}" for p in out["patterns"] if p["status"] == "fail"]
        base = self.base["baseline/out"]
        if "cache/patched" in arrays:
            f = compare.figures(base, arrays["cache/patched"], rtol=0, atol=0)
            out["patched_forward"] = {"bitwise": f.max_abs == 0, **f.as_dict()}
        if "error" in v:
            e = v["error"]
            place = e["module"] or (f"cache-dit's code after `{e['after']}`" if e.get("after") else e["stage"])
            out.update(status="error", error=e, why=f"{e['type']} in {place}: {e['message']}")
            out["first_divergence"] = self._locate([arrays], "cache", v["error"])
            return sd, out
        calls = v.get("calls_per_step", 1)
        ref = self._reference(STEPS, calls)
        off = compare.figures(ref, arrays["cache/out"], rtol=0, atol=0)
        out["caching_off"] = {"bitwise": off.max_abs == 0, **off.as_dict()}
        if off.max_abs != 0:
            problems.append(f"with caching off the output differs from the plain model (max-abs {off.max_abs:.3g})")
        stats = v.get("stats", {})
        cached = arrays.get("cache/cached")
        on: dict = {"threshold": CACHE_THRESHOLD, "cached_steps": stats.get("cached_steps", []),
                    "residual_diffs": [round(d, 6) for d in stats.get("residual_diffs", [])],
                    "finite": stats.get("finite", True)}
        if cached is not None:
            warm = compare.figures(ref[:calls], cached[:calls], rtol=0, atol=0)
            on["warmup_bitwise"] = warm.max_abs == 0
            if warm.max_abs != 0:
                problems.append("a warm-up step with caching on differs from the plain model")
            rels = [compare.figures(ref[i], cached[i]).rel_l2 for i in range(len(ref))]
            # how far the plain model's output moves from one step to the next: a cached step reuses the last
            # step's residual, so its error is of that order; a wrong residual is far beyond it
            moves = [0.0] + [compare.figures(base[s - 1], base[s]).rel_l2 for s in range(1, len(base))]
            allowed = [CACHED_SLACK * moves[i // calls] + CACHED_FLOOR for i in range(len(ref))]
            on["rel_l2_per_call"] = [round(r, 6) for r in rels]
            on["step_move_rel_l2"] = [round(m, 6) for m in moves]
            on["max_rel_l2"] = round(max(rels), 6)
            on["finite_output"] = bool(np.isfinite(cached).all())
            worst = max(range(len(rels)), key=lambda i: rels[i] - allowed[i])
            if not on["finite_output"] or not on["finite"]:
                problems.append("non-finite values with caching on (an in-place write into a block input?)")
            elif rels[worst] > allowed[worst]:
                problems.append(f"with caching on, call {worst} is {rels[worst]:.3f} (relative L2) from the plain model, "
                                f"beyond {allowed[worst]:.3f} ({CACHED_SLACK:g} x the step's own move + "
                                f"{CACHED_FLOOR:g}): the cached residual is wrong")
        if not on["cached_steps"]:
            problems.append(f"no step was cached at threshold {CACHE_THRESHOLD}: the cache is not engaged")
        out["caching_on"] = on
        if problems:
            out["status"] = "fail"
            out["why"] = "; ".join(problems)
            out["first_divergence"] = self._locate([arrays], "cache", None)
        return sd, out

    def _state_dict(self, v: dict) -> dict:
        base = self.base_rep.get("state_dict", {})
        res: dict = {"status": "pass", "first_divergence": None, "keys": len(base)}
        problems = []
        imported = v.get("state_dict_import")
        if imported is not None and imported != base:
            problems.append(f"importing the plugin changes the state dict ({_sd_diff(base, imported)})")
        patched = v.get("state_dict_patched")
        if patched is not None and patched != base:
            same_tensors = sorted(map(tuple, ((s, d) for s, d in base.values()))) == sorted(
                map(tuple, ((s, d) for s, d in patched.values())))
            res["renamed_by_patch_functor"] = _sd_diff(base, patched)
            if not same_tensors:
                problems.append(f"the PatchFunctor changes parameter shapes or dtypes ({_sd_diff(base, patched)})")
            else:
                res["note"] = ("the PatchFunctor moves blocks between lists (keys renamed, tensors unchanged); "
                               "checkpoints load before cache-dit applies it")
        if problems:
            res.update(status="fail", why="; ".join(problems))
        return res

    def _cp_variants(self) -> list[dict]:
        cp = self.plan["parallelism"]["cp"]
        anything = bool((cp.get("ulysses_anything") or {}).get("2", {}).get("needed"))
        variants = [{"name": "ulysses2", "ulysses": 2, "anything": anything},
                    {"name": "ulysses2+cache", "ulysses": 2, "anything": anything, "cache": True}]
        if not (cp.get("mask_reorder") or {}).get("needed"):
            variants.append({"name": "ring2", "ring": 2})
        return variants

    def _first_runs(self, work: Path):
        procs = [self._single("baseline", work / "baseline", plugin=False)]
        if "cache" in self.proofs:
            procs.append(self._single("cache", work / "cache", plugin=True))
        tails = _wait(procs, grace=PROCESS_TIMEOUT)
        self._cache_dir = work / "cache"
        base_rep, base = _load_rank(work / "baseline", 0)
        return base_rep, base, tails

    def _parallel_runs(self, variants: list[dict], work: Path) -> dict[str, tuple[list, list, list]]:
        """{variant: (per-rank report, per-rank arrays, stderr tails)}, in as few process pairs as possible."""
        runs: dict[str, tuple[list, list, list]] = {}
        todo = list(variants)
        for attempt in range(len(variants)):
            if not todo:
                break
            ranks, tails = self._parallel(todo, work / f"pair{attempt}")
            reached = []
            for v in todo:
                reps = [r[0]["variants"].get(v["name"]) if r[0] else None for r in ranks]
                if any(r is not None for r in reps):
                    runs[v["name"]] = (reps, [r[1] for r in ranks], tails)
                    reached.append(v)
            if not reached:  # the pair reported nothing at all: say why for every variant left
                for v in todo:
                    runs[v["name"]] = ([None, None], [{}, {}], tails)
                break
            last = todo.index(reached[-1])
            todo = todo[last + 1:]
        return runs

    def _parallel_proof(self, variants: list[dict], runs: dict[str, tuple[list, list, list]]) -> dict:
        res: dict = {"status": "pass", "variants": {}, "first_divergence": None}
        base = self.base["baseline/out"]
        for variant in variants:
            key = variant["name"]
            reps, arrays, tails = runs[key]
            if any(r is None for r in reps) and not any(r is not None and "error" in r for r in reps):
                why = "; ".join(t for t in tails if t) or "a rank did not report"
                res["variants"][key] = {"status": "error", "why": why, "first_divergence": None}
                continue
            errors = [r["error"] for r in reps if r is not None and "error" in r]
            # a rank that lost its peer ("connection closed") reports the consequence; the other, the cause
            errors.sort(key=lambda e: "closed by peer" in e["message"] or "Connection reset" in e["message"])
            err = errors[0] if errors else None
            if err is not None:
                row = {"status": "error", "why": f"{err['type']} in {err['module'] or err['stage']}: {err['message']}",
                       "error": err}
                cpu_only = _cpu_only(err)
                if cpu_only:  # a limit of this machine, not a verdict on the integration
                    row["status"] = "skipped"
                    row["why"] = f"{cpu_only}: run this configuration on GPUs"
                else:
                    row["first_divergence"] = self._locate(
                        [a for a, r in zip(arrays, reps) if r is not None and "error" not in r] or arrays[:1], key, err)
                res["variants"][key] = row
                continue
            f = [compare.figures(base, a[f"{key}/out"]) for a in arrays]
            worst = max(f, key=lambda x: x.max_abs)
            row = {"status": "pass" if worst.ok else "fail", **worst.as_dict()}
            if not worst.ok:
                row["first_divergence"] = self._locate(arrays, key, None)
            res["variants"][key] = row
        statuses = [v["status"] for v in res["variants"].values()]
        res["status"] = ("error" if "error" in statuses else "fail" if "fail" in statuses else
                         "skipped" if all(x == "skipped" for x in statuses) else "pass")
        if res["status"] == "skipped":
            res["why"] = next(v["why"] for v in res["variants"].values())
        bad = next((v for v in res["variants"].values() if v["status"] in ("fail", "error")), None)
        if bad is not None:
            res["first_divergence"] = bad.get("first_divergence")
            res["why"] = bad.get("why") or f"differs from the 1-process run (max-abs {bad.get('max_abs'):.3g})"
        return res


def _cpu_only(err: dict) -> str | None:
    """Why an error is the CPU's, not the integration's: a kernel with no CPU implementation, or a
    library's own assertion that refuses CPU tensors."""
    if err["type"] == "NotImplementedError" and "'CPU' backend" in err["message"]:
        return "the attention kernel has no CPU implementation in this torch"
    last = " ".join(err.get("trace", [])[-4:])
    if err["type"] == "AssertionError" and "cpu" in last and "site-packages" in (err.get("at") or ""):
        return f"library code refuses CPU tensors ({err.get('at')})"
    return None


def _sd_diff(a: dict, b: dict) -> str:
    gone, new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    parts = []
    if gone:
        parts.append(f"{len(gone)} keys gone, e.g. {gone[0]}")
    if new:
        parts.append(f"{len(new)} new, e.g. {new[0]}")
    if changed:
        parts.append(f"{len(changed)} changed, e.g. {changed[0]}: {a[changed[0]]} -> {b[changed[0]]}")
    return "; ".join(parts) or "same"


def _pattern_verdict(p: dict) -> dict:
    """Does the first block of a list return its streams in the order the declared pattern says?"""
    from cache_dit.caching.forward_pattern import ForwardPattern

    pattern = ForwardPattern[p["pattern"]]
    seen_in, seen_out = p.get("in"), p.get("out")
    row = {"list": p["list"], "pattern": p["pattern"], "in": seen_in, "out": seen_out}
    if seen_in is None or seen_out is None:
        return {**row, "status": "unknown", "why": "the first block was not called"}
    shapes = {"hidden_states": seen_in[0], "encoder_hidden_states": seen_in[1]}
    if shapes["hidden_states"] == shapes["encoder_hidden_states"]:
        return {**row, "status": "unknown", "why": "both streams have the same shape: order not observable"}
    if len(seen_out) < len(pattern.Out):
        return {**row, "status": "fail", "why": f"{p['pattern']} returns {len(pattern.Out)} tensors, the block "
                                                f"returned {len(seen_out)}"}
    for i, name in enumerate(pattern.Out):
        want = shapes.get(name)
        if want is not None and seen_out[i] != want:
            other = next((n for n, s in shapes.items() if s == seen_out[i]), "neither stream")
            return {**row, "status": "fail", "why": f"{p['pattern']} says output {i} is `{name}` {want}, the block "
                                                    f"returned {seen_out[i]} (`{other}`)"}
    return {**row, "status": "pass", "why": "outputs come back in the declared order (shapes differ)"}


def exit_code(report: dict) -> int:
    statuses = [report[k]["status"] for k in ("state_dict", *PROOFS) if k in report]
    return 1 if any(s in ("fail", "error") for s in statuses) else 0
