"""Validation findings: each rule's count, rate, severity and first examples, per dataset.

A dataset's findings gather the tallies of its scanned raw file (the per-record rules and
the line problems, :mod:`workbench.analyze.scan`), the torn last line, and its keys
against prompts.jsonl's: a record whose key repeats (``duplicate_sample_id``) or is not a
prepared prompt (``orphan_response``), a prepared prompt with no record
(``missing_response``, or ``unsent_budget`` when the dataset's token budget stopped it), a
record whose ``prompt_tokens`` is not the number of ids its prompt was sent with
(``prompt_tokens_mismatch``: only when prompts.jsonl holds ids for every prompt) and the
problems of prompts.jsonl itself. A key is ``(sample_id, turn)``
(:data:`~workbench.rundir.line_index.Key`): the turns of a conversation regenerated turn by
turn (``turns: each``) share a sample id and are no duplicates; such a conversation whose
records skip a turn is a ``missing_turn``, and every example of a record with a turn names
its sample id and turn. A rule whose rate (over the records; over the
prompts for the missing ones) passes its :class:`~workbench.analyze.rules.Thresholds` rate
is an error whatever its default severity. Findings come errors first, then in
:data:`~workbench.analyze.rules.SEVERITY` order.

In a dataset that mixes modes, a ``mode_mismatch`` finding also gives each mode's count of
its records (:attr:`Finding.modes`, :class:`ModeRate`), and is an error when one mode's rate
passes its threshold: a mode whose thinking switch does not hold is broken however small a
share of the dataset it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgspec

from workbench.analyze.rules import (
    PROMPT_RULES,
    SEVERITY,
    Severity,
    Thresholds,
    counted_over,
    rule_bit,
)
from workbench.rundir import prompt_scan
from workbench.rundir.columns import Columns, FileScan, Tally
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE, DatasetDir
from workbench.rundir.line_index import Key, key_text

__all__ = [
    "DATA_LIMITS",
    "DataConcern",
    "DatasetReport",
    "Example",
    "Finding",
    "ModeRate",
    "PromptIds",
    "ValidationReport",
    "data_concerns",
    "dataset_report",
    "read_prompt_ids",
    "share",
]

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

_NOT_ROWS = frozenset({"malformed", "not_object"})  # prompts.jsonl lines that hold no prompt row

_RULE_ORDER = {rule: index for index, rule in enumerate(SEVERITY)}

BY_MODE = ("mode_mismatch",)  # the rules whose findings give each mode's count

SampleId: TypeAlias = int | str


class Example(msgspec.Struct):
    """Where a rule fired: a line of `file` (raw_responses.jsonl or prompts.jsonl)."""

    line: int
    detail: str
    file: str = RAW_FILE


class ModeRate(msgspec.Struct):
    """A finding within one mode: `count` of its `records` fail the rule (`rate`)."""

    count: int
    records: int
    rate: float


class Finding(msgspec.Struct):
    """One rule's result for a dataset; `rate` is count over records (prompts when missing);
    `modes`, of a rule of :data:`BY_MODE`, the same per mode name (None for other rules)."""

    rule: str
    severity: Severity
    count: int
    examples: list[Example]
    rate: float | None = None
    modes: dict[str, ModeRate] | None = None


DATA_LIMITS: dict[str, float] = {  # a data-quality rule's rate above which it is a concern
    "near_duplicate_reply": 0.10,
    "near_duplicate_prompt": 0.10,
    "duplicate_reply": 0.01,
    "duplicate_prompt": 0.01,
    "repetition": 0.05,
    "contaminated_prompt": 0.0,  # any
    "contaminated_reply": 0.0,
}

_DATA_SAYS = {  # rule -> what its records are, after "50% of the replies"
    "near_duplicate_reply": "are near duplicates",
    "near_duplicate_prompt": "are near duplicates",
    "duplicate_reply": "are duplicates",
    "duplicate_prompt": "are duplicates",
    "repetition": "are stuck in a loop",
    "contaminated_prompt": "hold a benchmark n-gram",
    "contaminated_reply": "hold a benchmark n-gram",
}


class DataConcern(msgspec.Struct):
    """A data-quality rule whose `rate` (`count` of the dataset's `of`: replies or prompts)
    passes its `limit` (:data:`DATA_LIMITS`); `says` what those are (`are near duplicates`)."""

    rule: str
    count: int
    rate: float
    limit: float
    of: str
    says: str

    def clause(self, dataset: str) -> str:
        """`50% of B1_glaive's replies are near duplicates`."""
        return f"{share(self.rate)} of {dataset}'s {self.of} {self.says}"


def share(rate: float) -> str:
    """A rate as a share a reader takes in: `50%` from 10%, `0.3%` below."""
    return f"{rate:.0%}" if rate >= 0.1 else f"{rate:.1%}"


def data_concerns(findings: Iterable[Finding]) -> list[DataConcern]:
    """The concerns of a dataset's findings: each data-quality rule whose rate passes its limit."""
    return [DataConcern(f.rule, f.count, f.rate, DATA_LIMITS[f.rule],
                        "prompts" if counted_over(f.rule) == "prompts" else "replies",
                        _DATA_SAYS[f.rule])
            for f in findings
            if f.rule in DATA_LIMITS and f.rate is not None and f.rate > DATA_LIMITS[f.rule]]


class DatasetReport(msgspec.Struct):
    """`ok`: the format's verdict (no error finding); `data`: the data-quality concerns."""

    ok: bool
    records: int
    prompts: int | None
    findings: list[Finding]
    data: list[DataConcern] = msgspec.field(default_factory=list)


class ValidationReport(msgspec.Struct):
    """`benchmarks`: the names of the benchmarks looked for (none: contamination was not
    checked, and no ``contaminated_*`` finding can show); `notes`: the checks that could not
    run, each with why (a line each)."""

    ok: bool
    model_profile: str
    datasets: dict[str, DatasetReport]
    benchmarks: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)

    def data_clauses(self) -> list[str]:
        """Each data concern of each dataset in words (`50% of B1's replies are near duplicates`)."""
        return [concern.clause(name) for name, ds in self.datasets.items() for concern in ds.data]

    def to_builtins(self) -> dict[str, Any]:
        """The report as JSON-ready dicts: {"ok", "model_profile", "datasets": {...},
        "benchmarks": [...]}, and "notes": [...] when a check could not run; a dataset's
        "data" lists its data concerns (:class:`DataConcern`: "rule", "count", "rate",
        "limit", "of", "says"; empty when none); a finding has "modes" ({mode: {"count",
        "records", "rate"}}) only when it is given per mode."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        if not self.notes:
            del data["notes"]
        for dataset in data["datasets"].values():
            for finding in dataset["findings"]:
                if finding["modes"] is None:
                    del finding["modes"]
        return data


@dataclass(slots=True)
class PromptIds:
    """Each prompt's first line (by :data:`Key`), the problems of prompts.jsonl, and the ids
    each prompt was sent with (None unless every prompt of the file was sent as ids: text
    prompts are tokenized by the server, so their length is not known)."""

    lines: dict[Key, int]
    tally: Tally
    sent_ids: dict[Key, int] | None = None


def read_prompt_ids(ds: DatasetDir, thresholds: Thresholds, cache: bool = True) -> PromptIds | None:
    """Each prompt's first line; parse problems and repeats tallied (prompts.jsonl lines),
    from the one read of prompts.jsonl the reports share (see :mod:`workbench.rundir.prompt_scan`)."""
    path = ds.prompts_path
    if not path.is_file():
        return None
    found = prompt_scan.summary(path, cache=cache)
    tally = Tally(thresholds.max_examples)
    for line, kind, detail in found.problems:
        tally.add(PROMPT_RULES[kind], line, detail)
    return PromptIds(found.first_line_of(), tally, _sent_ids(found))


def _sent_ids(found: prompt_scan.PromptScan) -> dict[Key, int] | None:
    """Each prompt's number of ids when every row of the file holds an input_ids array (the
    scan's lengths are then those counts, never text estimates); else None."""
    rows = found.lines - sum(1 for _, kind, _ in found.problems if kind in _NOT_ROWS)
    if rows <= 0 or found.tokenized != rows:
        return None
    return found.length_of()


def _id_findings(
    scan: FileScan, prompts: PromptIds | None, tally: Tally, budget_reached: bool = False
) -> None:
    """Duplicate and orphan records and gaps in conversations into tally; missing responses
    into the prompts' tally (as `unsent_budget` when the dataset's token budget stopped it)."""
    first_line: dict[Key, int] = {}
    for key, line in zip(_keys(scan.columns), scan.columns.line, strict=True):
        if key[0] is None:
            continue
        seen = first_line.setdefault(key, line)
        if seen != line:
            tally.add("duplicate_sample_id", line, f"{key_text(*key)} also at line {seen}")
        elif prompts is not None and key not in prompts.lines:
            tally.add("orphan_response", line, f"{key_text(*key)} is not a prepared prompt")
    _turn_gaps(first_line, tally)
    if prompts is not None:
        answered = first_line.keys()
        missing = sorted((line, key) for key, line in prompts.lines.items()
                         if key not in answered)
        rule, detail = (("unsent_budget", "not sent: the max_tokens budget was reached")
                        if budget_reached else ("missing_response", "prepared prompt without a record"))
        for line, key in missing:
            prompts.tally.add(rule, line, detail if key[1] is None else f"{key_text(*key)}: {detail}")


def _keys(columns: Columns) -> Iterable[Key]:
    """Each record's (sample id, turn), in file order."""
    return zip(columns.sample_id, columns.turn, strict=True)


def _turn_gaps(first_line: dict[Key, int], tally: Tally) -> None:
    """Each conversation whose records skip a turn (a record of turn n, none of an earlier
    one), at the first line of the first turn after a gap."""
    turns: dict[SampleId, dict[int, int]] = {}
    for (sample_id, turn), line in first_line.items():
        if turn is not None:
            turns.setdefault(sample_id, {})[turn] = line
    gaps = []
    for sample_id, lines in turns.items():
        missing = [turn for turn in range(max(lines)) if turn not in lines]
        if missing:
            after = min(turn for turn in lines if turn > missing[0])
            gaps.append((lines[after], sample_id, after, missing))
    for line, sample_id, after, missing in sorted(gaps, key=lambda gap: gap[0]):
        names = ", ".join(map(str, missing))
        tally.add("missing_turn", line, f"sample_id {sample_id!r}: turn {after} present, "
                  f"turn{'s' if len(missing) > 1 else ''} {names} missing")


def _prompt_token_findings(scan: FileScan, sent: dict[Key, int], tally: Tally) -> None:
    """Records whose prompt_tokens are not the number of ids their prompt was sent with."""
    columns = scan.columns
    for key, line, tokens in zip(_keys(columns), columns.line, columns.prompt_tokens,
                                 strict=True):
        ids = sent.get(key) if key[0] is not None else None
        if ids is not None and tokens is not None and ids != tokens:
            tally.add("prompt_tokens_mismatch", line, f"{key_text(*key)}: prompt_tokens "
                      f"{tokens}, sent {ids} ids ({tokens - ids:+d})")


def _named(examples: list[Example], turns: dict[int, Key]) -> list[Example]:
    """The examples, each of a record with a turn naming its sample id and turn (unless its
    detail names them already)."""
    named = []
    for example in examples:
        key = turns.get(example.line) if example.file == RAW_FILE else None
        if key is not None and not example.detail.startswith("sample_id "):
            example = Example(example.line, f"{key_text(*key)}: {example.detail}", example.file)
        named.append(example)
    return named


def _turn_lines(columns: Columns) -> dict[int, Key]:
    """line -> (sample id, turn) of each record with a turn (none in a single-turn file)."""
    if not any(turn is not None for turn in columns.turn):
        return {}
    return {line: (sample_id, turn) for line, sample_id, turn
            in zip(columns.line, columns.sample_id, columns.turn, strict=True)
            if turn is not None}


def _mode_rates(columns: Columns, rule: str) -> dict[str, ModeRate]:
    """Per mode (by name) of the records that have one, how many fail per-record `rule`."""
    bit = rule_bit(rule)
    counts: dict[str, list[int]] = {}
    for mode, failed in zip(columns.mode, columns.failed, strict=True):
        if mode is not None:
            entry = counts.setdefault(mode, [0, 0])
            entry[0] += 1 if failed & bit else 0
            entry[1] += 1
    return {mode: ModeRate(count, records, count / records)
            for mode, (count, records) in sorted(counts.items())}


def _findings(
    tallies: Iterable[tuple[str, Tally]], records: int, prompts: int | None,
    thresholds: Thresholds, turns: dict[int, Key] | None = None,
    columns: Columns | None = None,
) -> list[Finding]:
    """Findings of every rule that fired, errors first; `turns` names the records with a
    turn in the examples (:func:`_named`); `columns` give the rules of :data:`BY_MODE`
    their count per mode."""
    counts: dict[str, int] = {}
    examples: dict[str, list[Example]] = {}
    for file, tally in tallies:
        for rule, count in tally.counts.items():
            counts[rule] = counts.get(rule, 0) + count
            examples.setdefault(rule, []).extend(
                Example(line, detail, file) for line, detail in tally.examples[rule])
    found = [_finding(rule, count, _named(examples[rule], turns) if turns else examples[rule],
                      records, prompts, thresholds,
                      _mode_rates(columns, rule) if columns is not None and rule in BY_MODE else None)
             for rule, count in counts.items()]
    return sorted(found, key=lambda f: (_SEVERITY_ORDER[f.severity], _RULE_ORDER[f.rule]))


def _finding(
    rule: str, count: int, examples: list[Example], records: int, prompts: int | None,
    thresholds: Thresholds, modes: dict[str, ModeRate] | None = None,
) -> Finding:
    """The finding of one rule; an error when its rate (or one mode's) passes its limit."""
    base = prompts if counted_over(rule) == "prompts" else records
    rate = count / base if base and rule != "no_prompts" else None
    severity = SEVERITY[rule]
    limit = thresholds.error_rate(rule)
    rates = [rate, *(mode.rate for mode in (modes or {}).values())]
    if limit is not None and any(r is not None and r > limit for r in rates):
        severity = "error"
    return Finding(rule, severity, count, examples[: thresholds.max_examples], rate, modes)


def dataset_report(
    scan: FileScan, prompts: PromptIds | None, thresholds: Thresholds, budget_reached: bool = False,
    data: Sequence[tuple[str, Tally]] = (),
) -> DatasetReport:
    """The findings of one dataset; `data` adds the run-level tallies (file, tally) of
    :mod:`workbench.analyze.quality`."""
    records = Tally(thresholds.max_examples)
    tallies: list[tuple[str, Tally]] = [(RAW_FILE, scan.tally), (RAW_FILE, records), *data]
    if scan.torn is not None:
        records.add("torn_line", *scan.torn)
    if prompts is not None:
        tallies.append((PROMPTS_FILE, prompts.tally))
    else:
        absent = Tally(thresholds.max_examples)
        absent.add("no_prompts", 0, "file not found: missing and orphan responses not checked")
        tallies.append((PROMPTS_FILE, absent))
    _id_findings(scan, prompts, records, budget_reached)
    if prompts is not None and prompts.lines and scan.records == 0 and not budget_reached:
        records.add("no_records", 0, f"none of its {len(prompts.lines):,} prepared prompts has a "
                    "record: they all failed (see errors.jsonl), or none was sent yet")
    if prompts is not None and prompts.sent_ids is not None:
        _prompt_token_findings(scan, prompts.sent_ids, records)
    count = len(prompts.lines) if prompts is not None else None
    findings = _findings(tallies, scan.records, count, thresholds, _turn_lines(scan.columns),
                         scan.columns)
    ok = not any(f.severity == "error" for f in findings)
    return DatasetReport(ok, scan.records, count, findings, data_concerns(findings))
