"""The report's verdicts: the banner says the format's and the data's apart (amber when only
the data has a concern), and the findings chart draws the data-quality rates."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyze"))

from test_validate import plant, record
from test_verdicts import near_duplicate_run

from workbench.analyze import explore
from workbench.analyze.validate import validate_run
from workbench.report import plots
from workbench.report.plots.blocks import REPORT_CSS


def test_a_run_of_near_duplicates_is_not_a_green_pass(tmp_path: Path) -> None:
    report = validate_run(near_duplicate_run(tmp_path), workers=1, cache=False)
    banner = plots.validation_banner(report)
    assert 'class="wb-banner concern"' in banner.html and "PASSED" not in banner.html
    assert "format passed; data: 1 concern" in banner.html
    assert "data: 40% of a&#x27;s replies are near duplicates" in banner.html
    assert banner.data == report.to_builtins()
    assert ".wb-banner.concern{" in REPORT_CSS


def test_a_clean_run_is_green_and_says_the_data_is_clean(tmp_path: Path) -> None:
    plant(tmp_path, "ds", [record(i) for i in range(3)], [0, 1, 2])
    banner = plots.validation_banner(validate_run(tmp_path, workers=1, cache=False)).html
    assert 'class="wb-banner pass"' in banner and "data: no concern" in banner
    assert "contamination" not in banner


def _row(rule: str, severity: str, rate: float, unit: str = "records") -> dict[str, object]:
    return {"dataset": "a", "rule": rule, "severity": severity, "count": int(rate * 300),
            "rate": rate, "records": 300, "default_severity": severity, "base": 300, "unit": unit}


def test_the_findings_chart_draws_the_data_quality_rates() -> None:
    table = pd.DataFrame([_row("truncated", "warning", 0.013),
                          _row("near_duplicate_reply", "info", 0.5),
                          _row("near_duplicate_prompt", "info", 0.057, "prompts"),
                          _row("duplicate_reply", "warning", 0.003),
                          _row("unsent_budget", "info", 0.69, "prompts")])
    table["dataset"] = pd.Categorical(table["dataset"], categories=["a"])
    fig = plots.findings_figure(table)
    drawn = {rule: x for t in fig.data for rule, x in zip(t.y, t.x, strict=True)}
    assert set(drawn) == {"truncated", "near_duplicate_reply", "near_duplicate_prompt", "duplicate_reply"}
    assert drawn["near_duplicate_reply"] == 50.0
    note = " ".join(a.text for a in fig.layout.annotations)
    assert "unsent_budget" in note and "near_duplicate" not in note


def test_the_demo_like_report_draws_near_duplicates(tmp_path: Path) -> None:
    report = validate_run(near_duplicate_run(tmp_path), workers=1, cache=False)
    fig = plots.findings_figure(explore.findings_table(report))
    assert "near_duplicate_reply" in [rule for t in fig.data for rule in t.y]
