"""The GPU matrix: the skill's configurations run through cache-dit's generate CLI with the plugin loaded.

Each row is one command. `integrate verify --gpu --print` prints them; `--gpu` runs them (when CUDA
GPUs are present), reads cache-dit's own latency and peak-memory lines, scores each output against
the baseline with PSNR and SSIM (verify/metrics.py) and fills the results table. Without a GPU it says
so and reports no figures.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from integrate.decisions.matrix import rows as matrix_rows
from integrate.decisions.records import Plan

from integrate.escape import dotted, ident
from integrate.records import OMIT
from integrate.workers import python_command

from .records import GPU_SCHEMA, GPU_SCHEMA_VERSION, GpuReport, GpuResult

# thresholds of the skill's results table: cache vs baseline, parallel vs baseline
CACHE_MIN_PSNR, PARALLEL_MIN_PSNR, MIN_SSIM = 30.0, 35.0, 0.90


@dataclass(frozen=True)
class Row:
    name: str
    gpus: int
    args: tuple[str, ...]
    output: str
    inputs: tuple[tuple[str, str], ...] = ()  # (flag, environment variable): what the pipeline requires

    def _launch(self, import_name: str, example: str) -> list[str]:
        return (["python", "-P", "-m", import_name, example] if self.gpus == 1 else
                ["torchrun", f"--nproc_per_node={self.gpus}", "-m", import_name, example])

    def argv(self, import_name: str, example: str, env: dict | None = None) -> list[str]:
        """The command as an argument list (run without a shell); each required input's value from `env`."""
        given = [x for flag, var in self.inputs for x in (flag, (env or {})[var])]
        return [*self._launch(import_name, example), *given, *self.args, "--track-memory", "--save-path", self.output]

    def command(self, import_name: str, example: str) -> str:
        """The same command as one shell line, every word quoted; a required input reads its variable."""
        given = "".join(f' {shlex.quote(flag)} "${ident(var)}"' for flag, var in self.inputs)
        rest = shlex.join([*self.args, "--track-memory", "--save-path", self.output])
        return f"{shlex.join(self._launch(import_name, example))}{given} {rest}"


def matrix(plan: Plan, out: str) -> list[Row]:
    """The plan's GPU matrix (decisions/matrix.py: the same rows test_matrix.sh and PR.md list), as commands."""
    video = "V" in (plan.model.example_type_guess or "")
    ext = "mp4" if video else "png"
    inputs = tuple((i.flag, i.env_var) for i in plan.example_inputs)  # every row takes what the pipeline requires
    return [Row(r.name, r.gpus, r.args, f"{out}/{r.stem}.{ext}", inputs) for r in matrix_rows(plan)]


def gpu_count() -> int:
    """CUDA devices visible, asked in a subprocess so this one never initialises CUDA."""
    try:
        done = subprocess.run(python_command("import torch; print(torch.cuda.device_count())"),
                              capture_output=True, text=True, timeout=120)
        return int(done.stdout.strip() or 0)
    except (subprocess.SubprocessError, ValueError, OSError):
        return 0


_TIME = re.compile(r"Inference Time:\s*([0-9.]+)s")
_MEMORY = re.compile(r"Memory Usage:\s*([0-9.]+)GiB")


def run_matrix(rows: list[Row], import_name: str, example: str, env: dict, progress, cwd: Path) -> list[GpuResult]:
    """Each row's command, run in `cwd` (the matrix's output folder: whatever the model's code writes to `./` lands
    beside the outputs, never in the user's folder; each row's output path is absolute)."""
    from .metrics import compare

    results = []
    base = None
    for row in rows:
        progress(f"gpu: {row.name}")
        done = subprocess.run(row.argv(import_name, example, env), capture_output=True, text=True, env=env, cwd=cwd)
        text = done.stdout + done.stderr
        t, m = _TIME.search(text), _MEMORY.search(text)
        res = {"name": row.name, "command": row.command(import_name, example), "exit": done.returncode,
               "latency_s": float(t.group(1)) if t else None, "peak_memory_gib": float(m.group(1)) if m else None}
        if done.returncode != 0:
            res["status"] = "error"
            res["why"] = (text.strip().splitlines() or ["no output"])[-1][:300]
        elif row.name == "baseline":
            base, res["status"] = row.output, "pass"
        elif base is not None and Path(row.output).exists():
            scores = compare(Path(base), Path(row.output))
            res.update(psnr=scores["psnr"], ssim=scores["ssim"], garbled=scores["garbled"])
            need = CACHE_MIN_PSNR if row.name == "cache" else PARALLEL_MIN_PSNR
            psnr = float("inf") if scores["psnr"] is None else scores["psnr"]
            res["status"] = "pass" if psnr > need and scores["ssim"] > MIN_SSIM and not scores["garbled"] else "fail"
        else:
            res["status"] = "error"
            res["why"] = "no baseline or no output to compare"
        results.append(GpuResult(**res))
    return results


def results_table(results: list[GpuResult]) -> str:
    """The skill's results table: configuration, latency, peak memory, PSNR, SSIM, verdict."""
    lines = ["| config | latency (s) | peak memory (GiB) | PSNR (dB) | SSIM | status |", "|---|---|---|---|---|---|"]

    def fmt(v, spec):
        return "n/a" if v is None or v is OMIT else format(v, spec)

    for r in results:
        psnr = "inf" if r.psnr is None and r.ssim is not OMIT else fmt(r.psnr, ".2f")
        lines.append(f"| {r.name} | {fmt(r.latency_s, '.2f')} | {fmt(r.peak_memory_gib, '.2f')} | {psnr} | "
                     f"{fmt(r.ssim, '.4f')} | {r.status} |")
    return "\n".join(lines)


def run_or_print(plan_dir: Path, generated: Path, *, out: str, print_only: bool, trust_code: bool = False,
                 progress) -> GpuReport:
    """The matrix's commands (`print_only`), or their results where CUDA GPUs are (skipped, with why, where
    there is none: no figure is ever made up)."""
    import os

    from .run import Verifier

    # printing the commands runs nothing of the model's: no --trust-code is needed for it (running them is another
    # matter: the matrix imports the model)
    v = Verifier(plan_dir, generated, trust_code=trust_code or print_only, progress=progress)
    m = v.plan.model
    dotted(v.import_name), ident(m.example_name)
    rows = matrix(v.plan, out)
    commands = tuple(r.command(v.import_name, m.example_name) for r in rows)
    inputs = v.plan.example_inputs
    # `python -m` puts the working directory first on sys.path (a cache_dit.py there would shadow the package): -P
    # and PYTHONSAFEPATH (torchrun's workers) keep it off; the plugin's folder goes on PYTHONPATH instead
    # the plugin, then where the model's code imports from (the plan's --source-root folders, a source checkout's
    # package root): the example imports the pipeline's module by name
    where = os.pathsep.join([str(v.generated.resolve()), *v.roots])
    setup = ("export PYTHONSAFEPATH=1",
             f"export PYTHONPATH={shlex.quote(where)}${{PYTHONPATH:+:$PYTHONPATH}}",
             (f"export {ident(m.env_var)}={shlex.quote(m.model_path)}" if m.model_path else
              f': "${{{ident(m.env_var)}:?set {ident(m.env_var)} to the model folder (the plan has none)}}"'),
             f"mkdir -p {shlex.quote(out)}",
             *(f': "${{{ident(i.env_var)}:?set {ident(i.env_var)} to the {ident(i.kind)} the pipeline requires as '
               f'{ident(i.name)}}}"' for i in inputs))
    head = dict(schema=GPU_SCHEMA, schema_version=GPU_SCHEMA_VERSION, setup=setup, commands=commands)
    if print_only:
        return GpuReport(**head)
    count = gpu_count()
    if count < 1:
        return GpuReport(**head, status="skipped",
                         why="no CUDA GPU on this machine: nothing was run, no figures reported")
    missing = [i.env_var for i in inputs if not os.environ.get(i.env_var)]
    if not m.model_path and not os.environ.get(m.env_var):
        missing.insert(0, m.env_var)
    if missing:
        return GpuReport(**head, status="skipped",
                         why=f"the example reads {', '.join('$' + x for x in missing)} (the model folder and the "
                             "inputs the pipeline requires): set them and run again")
    # no empty entry: Python would read it as the working directory
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join([str(v.generated.resolve()), *v.paths]),
               **({m.env_var: m.model_path} if m.model_path else {}))
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    runs = [dataclasses.replace(r, output=str(folder / Path(r.output).name)) for r in rows if r.gpus <= count]
    results = run_matrix(runs, v.import_name, m.example_name, env, progress, folder)
    results += [GpuResult(r.name, r.command(v.import_name, m.example_name), "skipped", None, None,
                          why=f"needs {r.gpus} GPUs, {count} present") for r in rows if r.gpus > count]
    return GpuReport(**head, results=tuple(results), table=results_table(results))
