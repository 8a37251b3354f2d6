"""Third-party repositories, judged against a labelled corpus (../shared/thirdparty/corpus.json by default).

For each case: analyze with the gate flags a user would give, then judge as the corpus README says — every
labelled list found, with its block class, a (ForwardPattern, needs a PatchFunctor) pair the label accepts (the
PatchFunctor counts for a list only when one of its reasons names that list), roles that agree, and the CFG style
equal to the label; then plan, approve and generate: is a BlockAdapter written, and (with --import) does the
plugin import wherever the repository's own module imports on this CPU.

The repositories are not shipped: lay each out as ROOT/<dir>/ (its files at the pinned commit) and
ROOT/<dir>-model/ (empty, or the case's `model_config` as config.json), then

    python bench/bench_thirdparty.py ROOT [--corpus corpus.json] [--import] [--source-roots] [--json]

`--import` runs the repository's code (its transformer module is imported in a subprocess): only for code you
trust. `--source-roots` passes each case's `pkg_root` as `--source-root` (the flag a user of a repository whose
package root is not the transformer file's folder gives). Prints one line per case and the totals ("analysis right
k/n, adapter written j/n").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "thirdparty" / "corpus.json"


SOURCE_ROOTS = False  # --source-roots


def flags(case: dict, root: Path):
    from integrate import api

    src, entry = root / case["dir"], case["pipeline_entry"]
    pipeline = entry.get("function") or f"{entry['class']}.{entry['method']}"
    return api.flags_for(str(src / case["transformer_file"]), model_path=str(root / f"{case['dir']}-model"),
                         transformer_class=case["transformer_class"], pipeline_class=pipeline,
                         pipeline_file=str(src / entry["file"]),
                         source_root=(str(src / case.get("pkg_root", "")),) if SOURCE_ROOTS else ())


def judge_analysis(case: dict, data: dict) -> list[str]:
    """What the analysis got wrong against the case's labels (empty: right)."""
    wrong = []
    t = data["transformer"]
    found = {b["attr"]: b for b in t["block_lists"]}
    reasons = t.get("patch_functor_reasons") or []
    for want in case["expected"]["block_lists"]:
        attr = want["attr"]
        got = found.get(attr)
        if got is None or not got.get("is_blocks"):
            wrong.append(f"{attr}: not found as blocks" + (f" ({got.get('why')})" if got else ""))
            continue
        if got.get("block_class") != want["block_class"]:
            wrong.append(f"{attr}: block class {got.get('block_class')}, labelled {want['block_class']}")
        functor = any(r.startswith(f"{attr}:") or f"`{attr}`" in r for r in reasons)
        if [got.get("forward_pattern"), functor] not in [list(a) for a in want["accept"]]:
            wrong.append(f"{attr}: {got.get('forward_pattern')} with{'' if functor else 'out'} a PatchFunctor, "
                         f"labelled one of {want['accept']}")
        roles = {param: role for role, param in (got.get("roles") or {}).items()}
        if roles != want["roles"]:
            wrong.append(f"{attr}: roles {roles}, labelled {want['roles']}")
        if "check_forward_pattern" in want and got.get("check_forward_pattern") != want["check_forward_pattern"]:
            wrong.append(f"{attr}: check_forward_pattern {got.get('check_forward_pattern')}")
    cfg = data["pipeline"].get("has_separate_cfg")
    if cfg != case["expected"]["has_separate_cfg"]:
        wrong.append(f"has_separate_cfg {cfg}, labelled {case['expected']['has_separate_cfg']}")
    return wrong


def generate(case: dict, root: Path, work: Path) -> tuple[bool, str, Path | None]:
    """(a BlockAdapter written, why not, the plugin folder)."""
    from integrate import api
    from integrate.errors import InputError

    try:
        api.write_plan(api.plan(flags(case, root), probe=False), work / "plan")
        api.approve(work / "plan", "bench_thirdparty (automatic: a scratch plan for the benchmark)")
        report = api.generate(work / "plan", out=work / "out")
    except InputError as exc:
        return False, str(exc).splitlines()[0], None
    plugin = work / "out" / report.plugin.import_name
    if (plugin / "adapter.py").is_file():
        return True, "", plugin
    manual = [m for m in report.manual if "BlockAdapter" in m or "ForwardPattern" in m]
    return False, (manual or report.manual or ["no adapter.py"])[0], plugin


def imports(case: dict, root: Path, plugin: Path) -> str:
    """"ok", "repository does not import here: ..." or "plugin fails: ..." (runs the repository's code)."""
    src = root / case["dir"]
    path = [str(src / case.get("pkg_root", "")), str(src), str(plugin.parent)]
    module = Path(case["transformer_file"]).relative_to(case.get("pkg_root", "") or ".").with_suffix("")
    code = (f"import sys; sys.path[:0] = {path!r}\n"
            f"try:\n    import {'.'.join(module.parts)}\n"
            f"except Exception as e:\n    print('REPO', type(e).__name__, str(e).splitlines()[0] if str(e) else '')"
            f"\n    raise SystemExit(0)\n"
            f"import {plugin.name}\nprint('OK')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    out = proc.stdout.strip().splitlines()
    if out and out[-1] == "OK":
        return "ok"
    if out and out[-1].startswith("REPO"):
        return "repository does not import here: " + out[-1][5:]
    return "plugin fails: " + ((proc.stderr.strip().splitlines() or ["?"])[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--import", dest="run_imports", action="store_true")
    ap.add_argument("--source-roots", action="store_true", help="pass each case's pkg_root as --source-root")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    global SOURCE_ROOTS
    SOURCE_ROOTS = args.source_roots
    from integrate import api

    cases = json.loads(args.corpus.read_text())["cases"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-thirdparty-") as tmp:
        for case in cases:
            row: dict = {"case": case["dir"]}
            try:
                data = api.analysis_json(flags(case, args.root), use_cache=False)
                row["wrong"] = judge_analysis(case, data)
            except Exception as exc:  # noqa: BLE001 - a case that crashes the tool is a result, not a stop
                row["wrong"] = [f"analyze: {type(exc).__name__}: {exc}"]
            row["adapter"], row["why_no_adapter"], plugin = generate(case, args.root, Path(tmp) / case["dir"])
            if args.run_imports and plugin is not None and row["adapter"]:
                row["imports"] = imports(case, args.root, plugin)
            rows.append(row)
            print(f"{case['dir']:<18} analysis {'right' if not row['wrong'] else 'WRONG'}"
                  f"{'' if not row['wrong'] else ': ' + '; '.join(row['wrong'])}"
                  f" | adapter {'written' if row['adapter'] else 'NOT written: ' + row['why_no_adapter']}"
                  + (f" | imports: {row['imports']}" if "imports" in row else ""), file=sys.stderr)
    right = sum(not r["wrong"] for r in rows)
    written = sum(r["adapter"] for r in rows)
    summary = {"cases": len(rows), "analysis_right": right, "adapter_written": written, "rows": rows}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"analysis right {right}/{len(rows)}, adapter written {written}/{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
