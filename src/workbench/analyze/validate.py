"""``workbench validate``: a run's records checked against the format rules.

The rules are :mod:`workbench.analyze.rules`'s, the findings :mod:`workbench.analyze.findings`'s,
read in one pass by :func:`workbench.analyze.scan.scan_run` (whose cache makes a second
validation of a grown run read only the new records); validate also checks each turn's prompt
of a conversation regenerated turn by turn against the rendering of its history
(:mod:`workbench.analyze.turn_prompts`), or says in a note why it could not. A finding given
per mode (``mode_mismatch``) shows each mode's count of its records after its rate:
``(direct: 3/40, think: 0/120)``. Exit code 0 unless ``--strict`` and a finding is an error
(then 1); bad input raises.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from workbench.analyze.findings import Finding, ValidationReport
from workbench.analyze.quality import Decontamination
from workbench.analyze.rules import Thresholds
from workbench.analyze.scan import scan_run

__all__ = ["exit_code", "format_report", "validate_run"]


def validate_run(
    out: str | os.PathLike[str],
    *,
    model_profile: str | None = None,
    thresholds: Thresholds | None = None,
    only: Sequence[str] = (),
    vocab_size: int | None = None,
    workers: int | None = None,
    cache: bool = True,
    decontaminate: Decontamination | None = None,
    figures: bool | None = None,
) -> ValidationReport:
    """The findings of every dataset of run directory `out` (the arguments are
    :func:`~workbench.analyze.scan.scan_run`'s)."""
    return scan_run(out, model_profile=model_profile, thresholds=thresholds, only=only,
                    vocab_size=vocab_size, workers=workers, cache=cache,
                    decontaminate=decontaminate, figures=figures, turn_prompts=True).report


def format_report(report: ValidationReport) -> str:
    """The report as lines of text for a terminal."""
    lines = [f"model profile {report.model_profile}: {'ok' if report.ok else 'FAILED'}"]
    if report.benchmarks:
        lines.append(f"benchmarks looked for: {', '.join(report.benchmarks)}")
    lines.extend(f"note: {note}" for note in report.notes)
    for name, ds in report.datasets.items():
        prompts = "?" if ds.prompts is None else f"{ds.prompts:,}"
        lines.append(f"{name}: {ds.records:,} records, {prompts} prompts: "
                     f"{'ok' if ds.ok else 'FAILED'}")
        lines.extend(_format_finding(f) for f in ds.findings)
        if not ds.findings:
            lines.append("  no findings")
    return "\n".join(lines)


def _format_finding(finding: Finding) -> str:
    rate = f" ({finding.rate:.1%})" if finding.rate is not None else ""
    head = f"  {finding.severity:<7} {finding.rule:<21} {finding.count:>8,}{rate}"
    if finding.modes:
        head += " (" + ", ".join(f"{name}: {mode.count:,}/{mode.records:,}"
                                 for name, mode in finding.modes.items()) + ")"
    examples = [f"      {e.file}:{e.line}: {e.detail}" for e in finding.examples]
    return "\n".join([head, *examples])


def exit_code(report: ValidationReport, *, strict: bool = False) -> int:
    """0 unless strict and some finding is an error, then 1 (bad input raises instead)."""
    return 1 if strict and not report.ok else 0
