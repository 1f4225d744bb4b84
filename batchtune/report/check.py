"""`batchtune check` for people and for CI: a rich table, a JSON-ready dict, JUnit XML (which every CI
renders), a GitHub step-summary table and GitHub workflow-command annotations that point at the
config file and line."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.analysis.decide.check import FAIL, INSUFFICIENT, PASS, SKIPPED, WARN, CheckResult
from batchtune.errors import BatchtuneError
from batchtune.integrations.trainer_configs import TrainerConfig
from batchtune.records.files import naming
from batchtune.report.json import num

STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIPPED: "dim", INSUFFICIENT: "magenta"}
ICON = {PASS: "✅", WARN: "⚠️", FAIL: "❌", SKIPPED: "➖", INSUFFICIENT: "❔"}


def _where(tc: TrainerConfig, role: str) -> str:
    line = tc.line_of(role)
    return f"{tc.name_of(role)} ({tc.path}:{line})" if line else tc.name_of(role)


def _headline(tc: TrainerConfig) -> str:
    lr = f", lr {tc.lr:.3g}" if tc.lr is not None else ""
    return (
        f"{tc.path} ({tc.trainer}): {tc.prompts} prompts x {tc.group_size} = {tc.batch_responses} "
        f"responses per step{lr}"
    )


def render_check(console: Console, tc: TrainerConfig, result: CheckResult) -> None:
    console.print(_headline(tc))
    table = Table(title=f"batchtune check: {result.status}")
    for col in ("check", "status", "configured", "expected", "why"):
        table.add_column(col, overflow="fold")
    for it in result.items:
        table.add_row(it.name, f"[{STYLE[it.status]}]{it.status}[/]", it.configured, it.expected, it.message)
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)


def check_to_dict(tc: TrainerConfig, result: CheckResult) -> dict[str, Any]:
    """The JSON of `check --json`; its ``predicted_time_to_target`` is what ``--baseline`` reads."""
    return {
        "status": result.status,
        "exit_code": result.exit_code,
        "config": {
            "path": tc.path,
            "trainer": tc.trainer,
            "prompts": tc.prompts,
            "group_size": tc.group_size,
            "batch_responses": tc.batch_responses,
            "lr": num(tc.lr),
            "generation_concurrency": tc.generation_concurrency,
            "settings": {
                k: {"name": s.name, "value": s.value, "line": s.line} for k, s in tc.settings.items()
            },
        },
        "checks": [
            {
                "name": it.name,
                "status": it.status,
                "configured": it.configured,
                "expected": it.expected,
                "message": it.message,
                "setting": tc.name_of(it.role),
                "line": tc.line_of(it.role),
            }
            for it in result.items
        ],
        "predicted_time_to_target": {
            "value": num(result.predicted_time),
            "unit": result.time_unit,
            "target": result.target,
        },
        "notes": list(result.notes),
    }


def junit_xml(tc: TrainerConfig, result: CheckResult) -> str:
    """One <testsuite>, one <testcase> per check: fail -> <failure>, insufficient -> <error>,
    skipped -> <skipped>; a warning passes with its message in <system-out>."""
    count = {s: sum(1 for i in result.items if i.status == s) for s in (FAIL, INSUFFICIENT, SKIPPED)}
    suite = ET.Element(
        "testsuite",
        name="batchtune check",
        tests=str(len(result.items)),
        failures=str(count[FAIL]),
        errors=str(count[INSUFFICIENT]),
        skipped=str(count[SKIPPED]),
    )
    for it in result.items:
        case = ET.SubElement(suite, "testcase", classname=f"batchtune.check.{tc.trainer}", name=it.name)
        case.set("file", tc.path)
        if tc.line_of(it.role):
            case.set("line", str(tc.line_of(it.role)))
        text = f"{_where(tc, it.role)}: {it.message} (configured {it.configured}; expected {it.expected})"
        if it.status == FAIL:
            ET.SubElement(case, "failure", message=it.message, type="batchtune.check").text = text
        elif it.status == INSUFFICIENT:
            ET.SubElement(
                case, "error", message=it.message, type="batchtune.insufficient_evidence"
            ).text = text
        elif it.status == SKIPPED:
            ET.SubElement(case, "skipped", message=it.message)
        elif it.status == WARN:
            ET.SubElement(case, "system-out").text = f"warning: {text}"
    return _document(suite)


def _document(suite: ET.Element) -> str:
    testsuites = ET.Element("testsuites", name="batchtune")
    testsuites.append(suite)
    ET.indent(testsuites)
    return ET.tostring(testsuites, encoding="unicode", xml_declaration=True) + "\n"


def junit_error_xml(config: str, exc: BatchtuneError) -> str:
    """The JUnit report of a check that could not run (bad input, exit 2; no evidence, exit 3): one
    <testcase> with an <error>, so that a CI job reads this run's outcome, not an earlier report."""
    suite = ET.Element("testsuite", name="batchtune check", tests="1", failures="0", errors="1", skipped="0")
    case = ET.SubElement(suite, "testcase", classname="batchtune.check", name="check")
    case.set("file", config)
    kind = "batchtune.bad_input" if exc.exit_code == 2 else f"batchtune.exit_{exc.exit_code}"
    ET.SubElement(case, "error", message=str(exc), type=kind).text = str(exc)
    return _document(suite)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def summary_markdown(tc: TrainerConfig, result: CheckResult) -> str:
    """A GitHub-flavoured Markdown table for $GITHUB_STEP_SUMMARY (GitLab renders it too)."""
    lines = [
        f"### batchtune check: {ICON[result.status]} {result.status}",
        "",
        _md(_headline(tc)),
        "",
        "| check | status | configured | expected | why |",
        "|---|---|---|---|---|",
    ]
    for it in result.items:
        lines.append(
            f"| {it.name} | {ICON[it.status]} {it.status} | {_md(it.configured)} | {_md(it.expected)} | "
            f"{_md(it.message)} |"
        )
    lines += [""] + [f"- {_md(n)}" for n in result.notes] + [""]
    return "\n".join(lines)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(tc: TrainerConfig, result: CheckResult) -> list[str]:
    """``::error file=...,line=...,title=...::message`` for failures and missing evidence,
    ``::warning`` for warnings (GitHub workflow commands)."""
    out = []
    for it in result.items:
        level = {FAIL: "error", INSUFFICIENT: "error", WARN: "warning"}.get(it.status)
        if level is None:
            continue
        props = [f"file={_escape_prop(tc.path)}"]
        if tc.line_of(it.role):
            props.append(f"line={tc.line_of(it.role)}")
        props.append(f"title={_escape_prop(f'batchtune check: {it.name}')}")
        out.append(f"::{level} {','.join(props)}::{_escape_data(f'{tc.name_of(it.role)}: {it.message}')}")
    return out


def write_step_summary(tc: TrainerConfig, result: CheckResult) -> Path | None:
    """Append the Markdown summary to $GITHUB_STEP_SUMMARY when it is set; the path written or None."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with naming(path), path.open("a", encoding="utf-8") as fh:
        fh.write(summary_markdown(tc, result))
    return path
