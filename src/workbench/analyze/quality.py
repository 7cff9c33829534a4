"""Data worth training on: duplicates and benchmark contamination, across a run's datasets.

The per-record degeneracy rules (``repetition``, ``special_heavy``) are
:mod:`workbench.analyze.rules`'s; this module adds what only the whole run can tell:

    rule                   default   what it counts (file)
    duplicate_prompt       warning   a prompt whose content (its ids, or its text's normalised
                                     words) equals an earlier prompt's, in this dataset or an
                                     earlier one: the budget spent twice (prompts)
    near_duplicate_prompt  info      a prompt whose MinHash estimate of shingle Jaccard with an
                                     earlier one is near_duplicate_prompt_threshold (0.55) or
                                     more, compared on what varies: without the shingles
                                     template_share (half) of its dataset's first prompts hold,
                                     their template (system prompt, tool schemas, chat markers;
                                     :mod:`workbench.sketch.template`) (prompts)
    duplicate_reply        warning   a reply whose output ids equal an earlier reply's (raw)
    near_duplicate_reply   info      a reply nearly equal to an earlier one (estimated Jaccard of
                                     near_duplicate_threshold, 0.5, or more): templated answers
                                     that teach a drafter nothing new; where a dataset's replies
                                     share a template (tool-call boilerplate), compared without
                                     it (:mod:`workbench.analyze.reply_template`) (raw)
    contaminated_prompt    warning   a prompt holding an n-gram (13 normalised words) of a
                                     benchmark given with --decontaminate, else of the ones
                                     generate was given (run.json) (prompts)
    contaminated_reply     warning   a reply holding one (raw)

"Earlier" is the manifest's dataset order, then file order: the first copy is kept, the later
ones are flagged (and dropped by ``export --drop duplicate|near_duplicate``). Replies of fewer
than 32 ids (short answers are alike by nature, their prompts differ) and records repeating
an earlier record's (sample id, turn) are not compared. A conversation regenerated turn by
turn (``turns: each``) has one reply per turn, each compared (and named by its turn), and
its first prompt compared, which every later turn's prompt holds: a flagged prompt drops
the whole conversation from an export, a flagged reply its turn.

The per-record figures (digest, MinHash signature, benchmark overlap) are computed in the one
scan of the raw files and kept in its cache (:mod:`workbench.rundir.columns`): a grown run
computes them for the new records only, and the comparison across the run works on the kept
figures. Generate keeps the digest and signature of each reply and prompt as it writes them
(:mod:`workbench.rundir.figures`), so a first scan takes them instead of reading every id
again; a prompts file's benchmark overlaps are kept beside it while it is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from workbench import sketch
from workbench.analyze.reply_template import reply_templates, template_signatures
from workbench.analyze.rules import Thresholds
from workbench.config import load_manifest
from workbench.errors import ConfigError, DataError
from workbench.rundir.cache import KeyedCache, cache_key, file_stamp
from workbench.rundir.columns import Columns, FileScan, Tally
from workbench.rundir.figures import (
    SIGNATURE_DTYPE,
    FigureStore,
    PromptRows,
    ReplyFigures,
    prompt_rows,
    reply_overlaps,
)
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE
from workbench.rundir.line_index import Key, key_text
from workbench.rundir.manifest import BenchmarkChoice, choose_benchmarks
from workbench.rundir.records import SampleId
from workbench.rundir.run import RunInfo
from workbench.sketch import Decontamination
from workbench.tokenizer import load_tokenizer

__all__ = [
    "DATA_RULES",
    "QUALITY_VERSION",
    "Decontamination",
    "PromptRows",
    "RunBenchmarks",
    "add_quality",
    "benchmark_counts",
    "data_findings",
    "flagged_samples",
    "prompt_figures",
    "run_benchmarks",
    "run_tokenizer",
]

QUALITY_VERSION = 8  # bump when the kept figures change meaning (8: another digest)

DATA_RULES = ("duplicate_prompt", "near_duplicate_prompt", "duplicate_reply",
              "near_duplicate_reply", "contaminated_prompt", "contaminated_reply")

MIN_REPLY_IDS = 32  # shorter replies ("4", "Yes.") are alike by nature: their prompts differ


class RunBenchmarks(NamedTuple):
    """The benchmarks a command looks for (`decontaminate`: None when none), how they were
    chosen (`choice`: given or run.json's, the recorded files that are gone) and what to
    tell of it (`notes`: lines for a user who did not name them; `actions`: those of them
    that ask for something, a file gone or the ids not read)."""

    decontaminate: Decontamination | None
    choice: BenchmarkChoice
    notes: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()


def run_benchmarks(run: RunInfo, files: Sequence[str] | None, *, field: str | None = None,
                   ngram: int | None = None, tokenizer: str | None = None,
                   trust_remote_code: bool = False, whole: bool = False) -> RunBenchmarks:
    """The benchmarks of `files` (an empty list: none), else the ones run.json records
    (:func:`workbench.rundir.manifest.choose_benchmarks`), loaded with the tokenizer that
    reads the run's ids (:func:`run_tokenizer`); DataError naming a bad file and line.

    The run's own benchmarks, when no tokenizer is given and the run's cannot be loaded (not
    installed, moved), are looked for in text prompts only, and a note says so; ConfigError
    instead with `whole` (what must not miss a record: export) or benchmarks given."""
    choice = choose_benchmarks(run.manifest, files, field, ngram)
    notes, actions = choice.notes(), choice.gone_notes()
    if not choice.files:
        return RunBenchmarks(None, choice, tuple(notes), tuple(actions))
    try:
        reader = run_tokenizer(run, tokenizer, trust_remote_code)
    except ConfigError as exc:
        if whole or not choice.recorded or tokenizer is not None:
            raise
        reader = None
        partial = (f"the run's benchmarks are looked for in text prompts only, not in ids: "
                   f"{exc} (pass --tokenizer DIR)")
        notes.append(partial)
        actions.append(partial)
    decontaminate = Decontamination.load(choice.files, field=choice.field, ngram=choice.ngram,
                                         tokenizer=reader)
    return RunBenchmarks(decontaminate, choice, tuple(notes), tuple(actions))


def run_tokenizer(run: RunInfo, tokenizer: str | None = None, trust_remote_code: bool = False) -> Any:
    """The tokenizer that decodes the run's ids: `tokenizer` (a directory), else the first one
    run.json records for its datasets, else the one the run's manifest names; ConfigError
    saying how to give one. One tokenizer reads every dataset."""
    recorded = [ds.settings.get("tokenizer") for ds in run.datasets]
    recorded = [path for path in recorded if isinstance(path, str) and path]
    if tokenizer is None and recorded:
        tokenizer = recorded[0]
        trust_remote_code = trust_remote_code or any(
            ds.settings.get("trust_remote_code") is True for ds in run.datasets)
    if tokenizer is None:
        source = run.manifest.get("manifest_file")
        try:
            manifest = load_manifest(source) if isinstance(source, str) else None
        except (ConfigError, DataError):
            manifest = None
        named = [ds.tokenizer for ds in manifest.datasets if ds.tokenizer] if manifest else []
        if not named:
            raise ConfigError("--tokenizer", "the run's manifest names no tokenizer to read its "
                                             "ids as words: pass a tokenizer directory")
        trust_remote_code = trust_remote_code or any(ds.trust_remote_code for ds in manifest.datasets)
        tokenizer = named[0]
    return load_tokenizer(tokenizer, trust_remote_code=trust_remote_code)


def add_quality(columns: Columns, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                figures: ReplyFigures, special: list[int],
                decontaminate: Decontamination | None,
                overlaps: FigureStore | None = None) -> None:
    """Append the quality columns of a batch of rows (row i holds ids[starts[i]:ends[i]]):
    their figures, special ids and benchmark overlaps (those `overlaps` holds taken from it)."""
    columns.repeat_share.extend(figures.repeat.tolist())
    columns.special_ids.extend(special)
    if not len(starts):
        return
    columns.digest.extend(figures.digest.tolist())
    columns.signature.extend(row.tobytes() for row in figures.signature)
    overlap = (np.zeros(len(starts), dtype=np.int64) if decontaminate is None
               else reply_overlaps(ids, starts, ends, figures.digest, decontaminate, overlaps))
    columns.overlap.extend(overlap.tolist())


class _Rows(NamedTuple):
    """The rows of every dataset compared together: owner dataset, line, sample id, digest,
    signature, overlap, turn (None for a prompt and a single-turn reply)."""

    dataset: list[str]
    line: list[int]
    sample_id: list[SampleId]
    digest: np.ndarray
    signature: np.ndarray
    overlap: np.ndarray
    turn: list[int | None]


def data_findings(run: RunInfo, scans: Sequence[FileScan], thresholds: Thresholds,
                  decontaminate: Decontamination | None = None, *, cache: bool = True,
                  prompts: Mapping[str, PromptRows] | None = None,
                  ) -> dict[str, list[tuple[str, Tally]]]:
    """Per dataset, the tallies of the run-level rules: (file, tally) pairs for the findings.
    `prompts`: the :func:`prompt_figures` of the run when they were read already."""
    if prompts is None:
        prompts = prompt_figures(run, decontaminate, cache=cache, share=thresholds.template_share)
    flags = _flags(run, scans, thresholds, decontaminate, prompts, cache)
    found: dict[str, list[tuple[str, Tally]]] = {}
    for ds in run.datasets:
        raw, prompts = Tally(thresholds.max_examples), Tally(thresholds.max_examples)
        for rule, lines in flags.get(ds.name, {}).items():
            tally = prompts if rule.endswith("_prompt") else raw
            for line, (_, detail) in sorted(lines.items()):
                tally.add(rule, line, detail)
        found[ds.name] = [(RAW_FILE, raw), (PROMPTS_FILE, prompts)]
    return found


def flagged_samples(run: RunInfo, scans: Sequence[FileScan], thresholds: Thresholds,
                    decontaminate: Decontamination | None = None, *, cache: bool = True,
                    ) -> dict[str, dict[str, set[SampleId | Key]]]:
    """Per dataset, per run-level rule, what it flags (the export's drops): the sample ids of
    flagged prompts and single-turn replies, the (sample id, turn) of flagged replies of a
    conversation regenerated turn by turn."""
    flags = _flags(run, scans, thresholds, decontaminate,
                   prompt_figures(run, decontaminate, cache=cache,
                                  share=thresholds.template_share), cache)
    turns = {ds.name: _line_turns(scan.columns) for ds, scan in zip(run.datasets, scans,
                                                                      strict=True)}
    return {name: {rule: {_flagged(sid, None if rule.endswith("_prompt")
                                   else turns.get(name, {}).get(line))
                          for line, (sid, _) in lines.items()}
                   for rule, lines in rules.items()}
            for name, rules in flags.items()}


def _line_turns(columns: Columns) -> dict[int, int]:
    """line -> turn of each record with a turn."""
    return {line: turn for line, turn in zip(columns.line, columns.turn, strict=True)
            if turn is not None}


def _flagged(sample_id: SampleId, turn: int | None) -> SampleId | Key:
    return sample_id if turn is None else (sample_id, turn)


_Flags = dict[str, dict[str, dict[int, tuple[SampleId, str]]]]  # dataset -> rule -> line -> ...
_FlagsValue = dict[str, dict[str, dict[int, tuple[int | str, str]]]]  # as msgpack decodes it
_PROMPT_FLAGS: KeyedCache[_FlagsValue] = KeyedCache("quality-prompt-flags", _FlagsValue)


def _flags(run: RunInfo, scans: Sequence[FileScan], thresholds: Thresholds,
           decontaminate: Decontamination | None, figures: Mapping[str, PromptRows],
           cache: bool = True) -> _Flags:
    flags = _prompt_flags(run, thresholds, decontaminate, figures, cache)
    names = [ds.name for ds in run.datasets]
    compared = {name: _comparable(scan.columns, MIN_REPLY_IDS)
                for name, scan in zip(names, scans, strict=True)}
    templates = reply_templates(run.datasets, scans, compared, thresholds.template_share, cache)
    replies = _without_templates(run, _reply_rows(names, scans, compared=compared), templates,
                                 cache)
    _compare(replies, "reply", thresholds.near_duplicate_threshold, flags,
             {name: f"compared: {template.text('replies')}" for name, template in templates.items()
              if len(template.shingles)})
    if decontaminate is not None:
        _contamination(_reply_rows(names, scans), "contaminated_reply", decontaminate, flags)
    return flags


def _prompt_flags(run: RunInfo, thresholds: Thresholds, decontaminate: Decontamination | None,
                  figures: Mapping[str, PromptRows], cache: bool) -> _Flags:
    """The flags of the prompt rules, kept in the run's cache while every prompts file is as
    it was (prompts.jsonl is written before the requests: a growing run's replies change,
    its prompts do not)."""
    key = cache_key("quality-prompt-flags", QUALITY_VERSION,
                    thresholds.near_duplicate_prompt_threshold,
                    None if decontaminate is None else decontaminate.key,
                    [(ds.name, file_stamp(ds.prompts_path), len(figures[ds.name].figures.line),
                      figures[ds.name].figures.template_of().key)
                     for ds in run.datasets if ds.name in figures])
    kept = _PROMPT_FLAGS.load(run.out, key) if cache else None
    if kept is not None:
        return kept
    flags: _Flags = {}
    prompts = _prompt_rows(run, figures)
    compared = {name: found.figures.template_of() for name, found in figures.items()}
    _compare(prompts, "prompt", thresholds.near_duplicate_prompt_threshold, flags,
             {name: f"compared: {template.text()}" for name, template in compared.items()})
    _contamination(prompts, "contaminated_prompt", decontaminate, flags)
    if cache:
        _PROMPT_FLAGS.save(run.out, key, flags)
    return flags


def _without_templates(run: RunInfo, rows: _Rows, templates: Mapping[str, sketch.Template],
                       cache: bool) -> _Rows:
    """rows with the signatures of each dataset with a reply template made without it."""
    for ds in run.datasets:
        template = templates.get(ds.name)
        if template is None or not len(template.shingles):
            continue
        if not rows.signature.flags.writeable:
            rows = rows._replace(signature=rows.signature.copy())
        made = template_signatures(ds, template, MIN_REPLY_IDS, cache)
        for index in (i for i, name in enumerate(rows.dataset) if name == ds.name):
            kept = made.get(rows.line[index])
            if kept is not None:
                rows.signature[index] = np.frombuffer(kept, dtype=SIGNATURE_DTYPE)
    return rows


def _reply_rows(names: Sequence[str], scans: Sequence[FileScan], min_ids: int = 1,
                compared: Mapping[str, np.ndarray] | None = None) -> _Rows:
    """The replies compared: per dataset, those of `compared` (indexes of its records), else
    the :func:`_comparable` ones."""
    parts: list[tuple[str, Columns, np.ndarray]] = []
    for name, scan in zip(names, scans, strict=True):
        keep = compared[name] if compared is not None else _comparable(scan.columns, min_ids)
        parts.append((name, scan.columns, keep))
    return _gather((name, columns, keep, columns.digest, columns.signature, columns.overlap,
                    columns.turn) for name, columns, keep in parts)


def _comparable(columns: Columns, min_ids: int) -> np.ndarray:
    """Indexes of the records compared: the first of their (sample id, turn), with `min_ids`
    ids or more."""
    count = len(columns.sample_id)
    # the first record of a key is the one exports keep: the dict keeps its first index
    keys = zip(reversed(columns.sample_id), reversed(columns.turn), strict=True)
    first = {key: index for key, index in zip(keys, range(count - 1, -1, -1), strict=True)
             if key[0] is not None}
    keep = np.sort(np.fromiter(first.values(), dtype=np.int64, count=len(first)))
    lengths = np.array([0 if n is None else n for n in columns.output_len], dtype=np.int64)
    return keep[lengths[keep] >= max(min_ids, 1)] if count else keep


def _gather(parts: Iterable[tuple[str, Any, np.ndarray, Sequence[int], Sequence[bytes],
                                  Sequence[int], Sequence[int | None] | None]]) -> _Rows:
    dataset: list[str] = []
    line: list[int] = []
    sample_id: list[SampleId] = []
    digests: list[np.ndarray] = [np.zeros(0, dtype=np.uint64)]
    signatures: list[bytes] = []
    overlaps: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    turn: list[int | None] = []
    for name, columns, keep, digest, signature, overlap, turns in parts:
        at = keep.tolist()
        turn.extend([None] * len(at) if turns is None else _picked(turns, at))
        dataset.extend([name] * len(at))
        line.extend(_picked(columns.line, at))
        sample_id.extend(_picked(columns.sample_id, at))
        digests.append(np.asarray(digest, dtype=np.uint64)[keep])
        signatures.extend(_picked(signature, at))
        overlaps.append(np.asarray(overlap, dtype=np.int64)[keep])
    width = len(signatures[0]) // np.dtype(SIGNATURE_DTYPE).itemsize if signatures else 1
    matrix = np.frombuffer(b"".join(signatures), dtype=SIGNATURE_DTYPE).reshape(-1, width)
    return _Rows(dataset, line, sample_id, np.concatenate(digests), matrix,
                 np.concatenate(overlaps), turn)


def _picked(values: Sequence[Any], at: list[int]) -> list[Any]:
    """values[i] for i in `at` (sorted distinct indexes): all of them, the usual case, at once."""
    return list(values) if len(at) == len(values) else [values[i] for i in at]


def _compare(rows: _Rows, what: str, threshold: float, flags: _Flags,
             compared: Mapping[str, str] | None = None) -> None:
    """Flag exact, then near duplicates among rows (a row exactly equal to an earlier one is
    not told again as near); `compared`: per dataset, what its near duplicates were compared
    on, told with each."""
    if not len(rows.line):
        return
    exact = sketch.exact_duplicates(rows.digest)
    near = sketch.near_duplicates(rows.signature, threshold)
    for index in np.flatnonzero((exact >= 0) | (near >= 0)).tolist():
        other = int(exact[index]) if exact[index] >= 0 else int(near[index])
        rule = f"duplicate_{what}" if exact[index] >= 0 else f"near_duplicate_{what}"
        where = f"{rows.dataset[other]} {key_text(rows.sample_id[other], rows.turn[other])}"
        kind = "same as" if exact[index] >= 0 else "nearly the same as"
        detail = f"{key_text(rows.sample_id[index], rows.turn[index])}: {kind} {where}"
        if compared and exact[index] < 0 and rows.dataset[index] in compared:
            detail += f" ({compared[rows.dataset[index]]})"
        _flag(flags, rows, index, rule, detail)


def _contamination(rows: _Rows, rule: str, decontaminate: Decontamination | None,
                   flags: _Flags) -> None:
    if decontaminate is None:
        return
    for index in np.flatnonzero(rows.overlap).tolist():
        detail = (f"{key_text(rows.sample_id[index], rows.turn[index])} holds a "
                  f"{decontaminate.benchmarks.n}-gram "
                  f"of {decontaminate.describe(int(rows.overlap[index]))}")
        _flag(flags, rows, index, rule, detail)


def _flag(flags: _Flags, rows: _Rows, index: int, rule: str, detail: str) -> None:
    flags.setdefault(rows.dataset[index], {}).setdefault(rule, {})[rows.line[index]] = (
        rows.sample_id[index], detail)


def benchmark_counts(run: RunInfo, scans: Sequence[FileScan], decontaminate: Decontamination,
                     *, cache: bool = True) -> list[dict[str, Any]]:
    """Per benchmark and dataset: its items (and those too short for an n-gram, skipped),
    and the dataset's prompts and replies holding one of its n-grams."""
    replies = _reply_rows([ds.name for ds in run.datasets], scans)
    prompts = _prompt_rows(run, prompt_figures(run, decontaminate, cache=cache))
    rows = []
    for bit, benchmark in enumerate(decontaminate.benchmarks.benchmarks):
        for ds in run.datasets:
            rows.append({"benchmark": benchmark.name, "items": benchmark.items,
                         "skipped": benchmark.skipped, "dataset": ds.name,
                         "prompts": _holding(prompts, ds.name, bit),
                         "replies": _holding(replies, ds.name, bit)})
    return rows


def _holding(rows: _Rows, name: str, bit: int) -> int:
    mine = np.fromiter((d == name for d in rows.dataset), dtype=bool, count=len(rows.dataset))
    return int(((rows.overlap[mine] >> bit) & 1).sum()) if len(rows.dataset) else 0


def prompt_figures(run: RunInfo, decontaminate: Decontamination | None = None, *,
                   cache: bool = True, kept: bool | None = None,
                   share: float = sketch.DEFAULT_TEMPLATE_SHARE) -> dict[str, PromptRows]:
    """The figures of each dataset's prompts.jsonl (those without one left out), and their
    benchmark overlaps: read while the scan's workers read the replies, on a machine with
    cores to spare. Generate keeps them as it writes the file (the overlaps when it was given
    the benchmarks); with `kept` (default `cache`) those kept are taken, and what is read
    is kept in turn. `share`: the template's (:func:`workbench.rundir.figures.prompt_figures`)."""
    kept = cache if kept is None else kept
    return {ds.name: prompt_rows(ds.prompts_path, decontaminate, kept, share=share)
            for ds in run.datasets if ds.prompts_path.is_file()}


def _prompt_rows(run: RunInfo, figures: Mapping[str, PromptRows]) -> _Rows:
    parts = []
    for ds in run.datasets:
        found = figures.get(ds.name)
        if found is not None:
            kept = found.figures
            keep = np.arange(len(kept.line), dtype=np.int64)
            parts.append((ds.name, kept, keep, kept.digest, kept.signature, found.overlap, None))
    return _gather(parts)
