"""The proof registry is what every reader of a proof goes by: the report's keys, a survey row's verify keys, the
CLI's choices, the text and PR.md, repair's proofs and the audit's defaults."""

from __future__ import annotations

from dataclasses import fields

from click.testing import CliRunner
from integrate.verify import proofs
from integrate.verify.records import FixtureReport, PluginRef, VerifyModel
from integrate.verify.report import VerifyReport

from integrate.cli import main
from integrate.records import to_json
from integrate.render import markdown, terminal
from integrate.survey.records import RowVerify


def _report(status: str = "error") -> VerifyReport:
    records = {p.NAME: p.RECORD(status, why=f"{p.NAME} said so") for p in proofs.ALL}
    return VerifyReport("integrate.verify", "1.7", VerifyModel("T", "P"), PluginRef("/x", "integrate_x"),
                        FixtureReport("/x/verify_fixture.py", "derived", ()), **records)


def test_the_reports_keys_are_the_registrys_in_its_order():
    keys = [f.name for f in fields(VerifyReport)]
    assert keys[5:-1] == list(proofs.REPORTED) == [p.NAME for p in sorted(proofs.ALL, key=lambda p: p.ORDER)]
    row = [f.name for f in fields(RowVerify)]
    assert row[2:2 + len(proofs.REPORTED)] == list(proofs.REPORTED)


def test_every_proof_declares_a_kind_the_verifier_runs():
    for p in proofs.ALL:
        assert p.KIND in proofs.KINDS and p.__doc__, p.NAME
        assert p.KIND != "derived" or p.FROM in proofs.BY_NAME, p.NAME
    assert proofs.REPAIRABLE == tuple(p.NAME for p in proofs.ALL if p.REPAIRS)


def test_a_failed_proof_fails_the_report_whichever_it_is():
    for p in proofs.ALL:
        records = {q.NAME: q.RECORD("pass") for q in proofs.ALL}
        records[p.NAME] = p.RECORD("vacuous", why="nothing engaged")
        report = VerifyReport("s", "v", VerifyModel("T", "P"), PluginRef("/x", "i"),
                              FixtureReport("/x/f.py", "derived", ()), **records)
        assert report.failed, p.NAME
    assert not VerifyReport("s", "v", VerifyModel("T", "P"), PluginRef("/x", "i"),
                            FixtureReport("/x/f.py", "derived", ()),
                            **{q.NAME: q.RECORD("pass") for q in proofs.ALL}).failed


def test_the_text_and_pr_md_show_every_proof():
    data = to_json(_report())
    text = terminal.verify(data)
    rows = markdown.proof_rows(data)["rows"]
    for p in proofs.ALL:
        assert f"{p.NAME}: ERROR - {p.NAME} said so" in text
        assert any(r["name"] == p.NAME and f"{p.NAME} said so" in r["detail"] for r in rows)


def test_the_clis_proof_choices_are_the_registrys():
    runner = CliRunner()
    for command, allowed in (("verify", proofs.CHOICES), ("repair", proofs.REPAIRABLE), ("audit", proofs.CHOICES)):
        out = runner.invoke(main, [command, "--help"]).output
        assert all(name in out for name in allowed), (command, out)
        bad = runner.invoke(main, [command, "p", "--generated", "g", "--proof", "nonesuch"] if command != "audit"
                            else [command, "--proof", "nonesuch"])
        assert bad.exit_code == 2 and "nonesuch" in bad.output


def test_a_proof_run_only_when_asked_is_a_choice_but_no_default_nor_audited():
    """hybrid (4 processes) declares BY_DEFAULT = False: `verify` with no --proof, the survey's and the audit's runs
    leave it out; `--proof hybrid` asks for it."""
    assert proofs.DEFAULTS == tuple(p.NAME for p in proofs.ALL if p.REQUESTABLE and getattr(p, "BY_DEFAULT", True))
    assert "hybrid" in proofs.CHOICES and "hybrid" not in proofs.DEFAULTS and "hybrid" not in proofs.AUDITED
    assert {"cache", "cp", "tp"} <= set(proofs.AUDITED) <= set(proofs.DEFAULTS)
