"""``workbench validate``: a run's records checked against the format rules.

The rules are :mod:`workbench.analyze.rules`'s, the findings :mod:`workbench.analyze.findings`'s,
read in one pass by :func:`workbench.analyze.scan.scan_run` (whose cache makes a second
validation of a grown run read only the new records); validate also checks each turn's prompt
of a conversation regenerated turn by turn against the rendering of its history
(:mod:`workbench.analyze.turn_prompts`), or says in a note why it could not. A finding given
per mode (``mode_mismatch``) shows each mode's count of its records after its rate:
``(direct: 3/40, think: 0/120)``. Exit code 0 unless ``--strict`` and a finding is an error
(then 1); bad input raises.

The text says two verdicts apart: the format's (``format: passed``: no error finding, what
``--strict`` checks) and the data's (``data: 50% of B1's replies are near duplicates``, one
clause per data concern of :data:`~workbench.analyze.findings.DATA_LIMITS`; never a failure),
then once which benchmarks contamination was checked against (nothing when none).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from workbench.analyze.findings import DatasetReport, Finding, ValidationReport, share
from workbench.analyze.quality import Decontamination, RunBenchmarks
from workbench.analyze.rules import Thresholds
from workbench.analyze.scan import scan_run

__all__ = [
    "benchmark_notes",
    "contamination_line",
    "exit_code",
    "format_report",
    "validate_run",
    "verdict_lines",
]


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


def format_report(report: ValidationReport, benchmarks: RunBenchmarks | None = None) -> str:
    """The report as lines of text for a terminal: the verdicts, the benchmarks checked
    against (`benchmarks`: how they were chosen, to say whether run.json named them and what
    to do about the ones it could not look for), then each dataset's findings."""
    lines = [f"model profile {report.model_profile}", *verdict_lines(report)]
    contamination = contamination_line(report, benchmarks)
    if contamination is not None:
        lines.append(contamination)
    notes = [*report.notes, *(benchmark_notes(benchmarks) if benchmarks is not None else [])]
    lines.extend(f"note: {note}" for note in notes)
    for name, ds in report.datasets.items():
        lines.append(_dataset_line(name, ds))
        lines.extend(_format_finding(f) for f in ds.findings)
        if not ds.findings:
            lines.append("  no findings")
    return "\n".join(lines)


def _dataset_line(name: str, ds: DatasetReport) -> str:
    """`B1: 300 records, 300 prompts: ok (format), data: 50% of replies are near duplicates`."""
    prompts = "?" if ds.prompts is None else f"{ds.prompts:,}"
    data = ", ".join(f"{share(c.rate)} of {c.of} {c.says}" for c in ds.data) or "ok"
    return (f"{name}: {ds.records:,} records, {prompts} prompts: {'ok' if ds.ok else 'FAILED'} "
            f"(format), data{' ' if data == 'ok' else ': '}{data}")


def verdict_lines(report: ValidationReport) -> list[str]:
    """`format: passed (...)` and `data: 50% of B1's replies are near duplicates; ...`."""
    failed = [name for name, ds in report.datasets.items() if not ds.ok]
    fmt = ("format: passed (no error finding; --strict checks the format only)" if report.ok
           else f"format: FAILED in {', '.join(failed)} (an error finding; --strict exits 1 on it)")
    clauses = report.data_clauses()
    return [fmt, f"data: {'; '.join(clauses)}" if clauses else "data: no concern"]


def contamination_line(report: ValidationReport, benchmarks: RunBenchmarks | None = None) -> str | None:
    """`contamination: checked against tiny_bench (from run.json)`; None when no benchmark was
    looked for."""
    if not report.benchmarks:
        return None
    source = " (from run.json)" if benchmarks is not None and benchmarks.choice.recorded else ""
    return f"contamination: checked against {', '.join(report.benchmarks)}{source}"


def benchmark_notes(benchmarks: RunBenchmarks) -> list[str]:
    """The notes of how the benchmarks were chosen that ask for something (a recorded file
    gone, ids not read), without the one saying run.json's were taken
    (:func:`contamination_line` says that)."""
    return list(benchmarks.actions)


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
