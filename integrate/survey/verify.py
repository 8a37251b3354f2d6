"""`integrate survey --verify`: the CPU proof for survey rows, one model after another.

Each row's class gets a config-only model directory, then what a user would run, through
`integrate.api` in this process: the plan (no probe), then `api.automatic_chain` (an approval recorded as
automatic: the survey's own scratch plan, never a human review; generate and verify). Rows of classes outside
the installed diffusers, or without a pipeline, are skipped with the reason. A verify run takes about half a minute on
2 cores; `--only` picks rows.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from integrate import api
from integrate.errors import InputError
from integrate.records import OMIT
from integrate.verify.proofs import REPORTED

from .records import RowVerify, SurveyReport, SurveyRow


def verify_row(row: SurveyRow, diffusers_version: str | None, work: Path, *, fixture_only: bool = False,
               fixture_from: Path | None = None, separate_cfg: bool | None = None) -> RowVerify:
    """The verify summary for one survey row: each proof's status, or why the row was not verified.
    `separate_cfg`: a row no pipeline uses is planned transformer-only (`--no-pipeline`) with this CFG style
    declared; None skips such rows (the survey cannot know it)."""
    pipe = row.analysed_pipeline
    if row.status != "ok":
        return RowVerify("skipped", why="the row's analysis failed")
    if not pipe and separate_cfg is None:
        return RowVerify("skipped", why="no pipeline uses the class: nothing to build a plan for")
    if "site-packages" not in row.file and "dist-packages" not in row.file:
        return RowVerify("skipped", why="not an installed package's class (run verify --trust-code yourself)")
    base = work / row.transformer_class
    model = base / "model"
    model.mkdir(parents=True)
    if pipe:
        index = {"_class_name": pipe, "_diffusers_version": diffusers_version or "0", "transformer":
                 ["diffusers", row.transformer_class]}
        (model / "model_index.json").write_text(json.dumps(index))
        flags = api.flags_for(str(model))
    else:  # transformer-only: a config naming the class is all the model folder has
        (model / "transformer").mkdir()
        config = {"_class_name": row.transformer_class, "_diffusers_version": diffusers_version or "0"}
        (model / "transformer" / "config.json").write_text(json.dumps(config))
        flags = api.flags_for(str(model), no_pipeline=True, separate_cfg=separate_cfg)
    steps = ["plan"]
    try:
        api.write_plan(api.plan(flags, probe=False), base / "plan")
        report = api.automatic_chain(base / "plan", base / "out", command="integrate survey --verify",
                                     why="a scratch plan for the survey", step=steps.append,
                                     verifies={"verify": {"fixture_only": fixture_only, "fixture_from": fixture_from,
                                                          "trust_code": fixture_from is not None}})["verify"]
    except InputError as exc:
        return RowVerify("error", why=f"{steps[-1]}: {exc}")
    except Exception as exc:  # noqa: BLE001 - one row failing never stops the survey
        return RowVerify("error", why=f"{steps[-1]}: {type(exc).__name__}: {exc}")
    statuses = {name: getattr(report, name).status for name in REPORTED}
    firsts = {name: getattr(report, name).first_divergence.module for name in REPORTED
              if getattr(report, name).first_divergence}
    if firsts:
        statuses["first_divergence"] = firsts
    fx = report.fixture
    if fx.errors:
        statuses["why"] = f"fixture: {fx.errors[0]}"
    if fx.source is not OMIT:
        statuses["fixture_source"] = fx.source
    return RowVerify("fail" if report.failed else "pass", fixture=fx.status, seconds=report.seconds, **statuses)


def verify_rows(report: SurveyReport, only: tuple[str, ...], progress: Callable[[str], None]) -> SurveyReport:
    """The survey with `verify` added to the rows asked for (`only`; empty: every row)."""
    asked = [r for r in report.rows if not only or r.transformer_class in only]
    done: dict[int, RowVerify] = {}
    with tempfile.TemporaryDirectory(prefix="integrate-survey-verify-") as tmp:
        for i, row in enumerate(asked, 1):
            progress(f"verify [{i}/{len(asked)}] {row.transformer_class}")
            done[id(row)] = verify_row(row, report.diffusers.version, Path(tmp))
    rows = tuple(dataclasses.replace(r, verify=done[id(r)]) if id(r) in done else r for r in report.rows)
    return dataclasses.replace(report, rows=rows)
