"""Training-ready export of a run: exact token ids with a loss mask, or conversations.

Formats (one row per exported record; `id` is ``"<dataset>/<sample_id>"``, unique across the
datasets of a run; a dataset of conversations regenerated turn by turn, ``turns: each``, has
one record, so one row, per generated assistant turn: its `id` is the conversation's, and
an int `turn` beside it names the turn, ``(id, turn)`` unique; a record of a dataset that
mixes modes has its `mode`, a string, after `dataset`, ``--for`` rows only when every row
has one):

    tokens          {"id", "dataset", "input_ids", "loss_mask"}: the prepared prompt's ids
                    followed by the record's output_ids; loss_mask is 0 over the prompt and 1
                    over the output (the layout vLLM speculators' regeneration writes).
                    JSONL (.jsonl) or Parquet (.parquet, .pq: input_ids list<int32>,
                    loss_mask list<int8>, one row group per 1,024 rows). A turn's row is
                    {"id", "turn", "dataset", "input_ids", "loss_mask"}: that turn's prompt
                    (the conversation so far, as sent) then its reply, the mask 1 on the
                    reply only.
    conversations   {"id", "dataset", "conversations"[, "tools"]}: the source file's messages
                    (and tools, when the prompt was rendered with them) and an assistant turn {"role", "content", "reasoning_content"}
                    split at the model profile's think-end id and decoded with the dataset's
                    tokenizer (for trainers that apply the chat template themselves). JSONL
                    only, from datasets whose input is ``messages`` in a JSONL source file; a
                    ``turns: each`` dataset gives one row per conversation, every generated
                    turn in it, {"id", "turns", "dataset", "conversations"[, "tools"]}
                    (:mod:`workbench.export.threads`).
    --for TRAINER   tokens rows as that trainer reads them, {"input_ids", "loss_mask"} only
                    ({"id", "turn", ...} before them when every dataset is ``turns: each``),
                    JSONL only, with a manifest beside the file (trainers.py) whose rows name
                    each row's id (and turn).

The rows' formats are :mod:`workbench.export.sinks`'s; a dataset's records become rows in
:mod:`workbench.export.sources` (conversations: :mod:`workbench.export.conversations`); the
options and the summary are :mod:`workbench.export.options`'s.

`tokens` is exact: the ids are the ones the server saw and produced. When ``len(output_ids)``
exceeds ``completion_tokens`` by k and the first k output ids repeat the prompt's last k ids
(some SGLang versions prepend a prompt suffix), those k ids are dropped from the output.
Text prompts (input ``text``) are tokenized with the dataset's tokenizer as SGLang does
(``tokenizer.encode(text)``); a record whose ``prompt_tokens`` disagrees is dropped as
``prompt_tokens_mismatch``. The tokenizer is ``ExportOptions.tokenizer``, else the one the
run's manifest (run.json ``manifest_file``) names for the dataset.

Conversations: the reasoning is the ids before the first think-end id (a leading think-start
id removed), the content the ids after it; end ids at the end are removed, and newlines
around both texts stripped (chat templates put them back). Without a think-end id a reply
of a thinking dataset is all reasoning (cut short); with thinking off, all content.
Replies cut at max_new_tokens are dropped (``truncated``) unless ``keep_truncated``. When the
messages have no system message and the chat template put in a default one (Kimi-K2.5's), it
is written out, so a trainer renders the prompt the model saw. Each row is rendered back with
the chat template and the generation's ``chat_template_kwargs``; the summary counts the rows
that give back the generated ids (``exact``), and ``reasoning`` says where the reasoning goes.

Modes: a dataset that mixes modes splits and renders each record with its own mode's
chat-template arguments (over the dataset's; a thinking-off mode's reply is all content), and
``only_mode`` (``--only-mode``) keeps the records of the modes named (a name no dataset
exported has in run.json is a ConfigError); the summary counts each dataset's rows per mode.

Records dropped, by reason (the summary counts each record once, under the first):

    other_mode                   not of a mode of ``only_mode``
    parse_error, torn_line       unreadable lines
    missing_field                no sample_id or no output_ids
    duplicate_sample_id          a (sample_id, turn) seen before in the file (the first is kept)
    orphan_response              no prepared prompt for the (sample_id, turn)
    <rule>                       a rule of ``ExportOptions.drop`` (validate.RECORD_RULES, e.g.
                                 truncated, reasoning_unclosed, repetition; or duplicate,
                                 near_duplicate, contaminated: the run-level findings of
                                 :mod:`workbench.analyze.quality`, the first copy kept), in
                                 that order
    prompt_tokens_mismatch       a text prompt that tokenizes to another length
    earlier_turn_dropped         conversations of a turns dataset: a turn after one dropped
    limit                        beyond ``limit`` rows of the dataset: in file order, the
                                 records after the limit (not checked further); shuffled, the
                                 kept records not drawn

Memory stays bounded: records stream in blocks; prompts and source messages are read back by
byte offset; a shuffle permutes an index of (dataset, line) pairs, not rows. The output is
written to a temporary file in the target's directory and renamed at the end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench import loops
from workbench.analyze.quality import Decontamination, flagged_samples, run_benchmarks
from workbench.analyze.rules import RECORD_RULES, Thresholds
from workbench.analyze.scan import scan_run
from workbench.errors import ConfigError, DataError, WorkbenchError
from workbench.export.options import DROP_REASONS, RUN_DROPS, ExportOptions, ExportSummary
from workbench.export.sinks import (
    PARQUET_SUFFIXES,
    RowKeys,
    Sink,
    TrainerSink,
    atomic_sink,
    sink_factory,
)
from workbench.export.sources import READ_BLOCK_BYTES, Lines, Source, manifest_spec, open_source
from workbench.export.threads import ThreadWriter, plan_threads, thread_records
from workbench.export.trainers import (
    TRAINERS,
    RowEntry,
    Trainer,
    TrainerReport,
    trainer_report,
    write_manifest,
)
from workbench.rundir.files import temp_path
from workbench.rundir.reader import iter_blocks, parse_lines, paused_gc
from workbench.rundir.records import Row
from workbench.rundir.run import RunInfo, load_run
from workbench.rundir.storage import DISK_ERRNOS, storage_error

__all__ = ["export_run", "format_summary"]


def _whole_conversations(source: Source) -> bool:
    """Whether the source writes one row per conversation (conversations of turns: each)."""
    return source.options.format == "conversations" and source.turns


def _export_in_order(sources: Sequence[Source], sink: Sink, limit: int | None) -> None:
    """Each dataset in file order, up to limit rows; the rest counted, not checked."""
    for source in sources:
        if _whole_conversations(source):
            _export_threads(source, sink, limit)
            continue
        blocks = iter_blocks(source.ds.raw_path, with_output_ids=True, block_bytes=READ_BLOCK_BYTES)
        for block in blocks:
            source.count_problems(block.problems)
            for row, reason in zip(block.rows, source.verdicts(block.rows), strict=True):
                if limit is not None and source.stats.written >= limit:
                    source.stats.drop("limit")
                elif reason is None:
                    _emit(source, row, sink)
                else:
                    source.stats.drop(reason)
            if limit is not None and source.stats.written >= limit:
                _count_rest(source, block.end_offset, block.first_line + block.lines)
                break


def _export_threads(source: Source, sink: Sink, limit: int | None) -> None:
    """A turns dataset's conversations in the order of their first records, up to limit
    rows (the records of the conversations after it counted as dropped by the limit)."""
    threads = plan_threads(source)
    writer = ThreadWriter(source, threads)
    try:
        for index, thread in enumerate(threads):
            if limit is not None and source.stats.written >= limit:
                source.stats.drop("limit", len(thread.lines))
            else:
                line = writer.write(index)
                sink.write(line)
                source.stats.wrote(line.mode)
    finally:
        writer.close()


def _emit(source: Source, row: Row, sink: Sink) -> None:
    result = source.render(row)
    if isinstance(result, str):
        source.stats.drop(result)
    else:
        sink.write(result)
        source.stats.wrote(result.mode)


def _count_rest(source: Source, offset: int, first_line: int) -> None:
    """Count the records after offset as dropped by the limit (fast scan, no ids)."""
    for block in iter_blocks(source.ds.raw_path, offset=offset, first_line=first_line):
        source.count_problems(block.problems)
        if block.rows:
            source.stats.drop("limit", len(block.rows))


def _export_shuffled(
    sources: Sequence[Source], sink: Sink, limit: int | None, seed: int
) -> None:
    """All datasets mixed in an order drawn from seed; limit draws rows per dataset."""
    rng = np.random.default_rng(seed)
    picks = []
    writers: dict[int, ThreadWriter] = {}
    lines = [Lines(source.ds.raw_path) for source in sources]
    try:
        for index, source in enumerate(sources):
            if _whole_conversations(source):
                writers[index] = ThreadWriter(source, plan_threads(source))
                kept = _drawn_threads(writers[index], limit, rng)
            else:
                kept = _kept_lines(source)
                if limit is not None and len(kept) > limit:
                    source.stats.drop("limit", len(kept) - limit)
                    kept = rng.permutation(kept)[:limit]
            picks.append(np.column_stack([np.full(len(kept), index, dtype=np.int64), kept]))
        order = np.concatenate(picks) if picks else np.zeros((0, 2), dtype=np.int64)
        order = order[rng.permutation(len(order))]
        for index, item in order.tolist():
            if index in writers:
                line = writers[index].write(item)
                sink.write(line)
                sources[index].stats.wrote(line.mode)
                continue
            rows, _ = parse_lines(lines[index].read(item), first_line=item, with_output_ids=True)
            _emit(sources[index], rows[0], sink)
    finally:
        for reader in [*lines, *writers.values()]:
            reader.close()


def _drawn_threads(writer: ThreadWriter, limit: int | None,
                   rng: np.random.Generator) -> np.ndarray:
    """The indices of the conversations to write: all, or `limit` drawn (the records of
    the others counted as dropped by the limit)."""
    kept = np.arange(len(writer.threads), dtype=np.int64)
    if limit is None or len(kept) <= limit:
        return kept
    kept = rng.permutation(kept)[:limit]
    left = set(range(len(writer.threads))) - set(kept.tolist())
    writer.source.stats.drop("limit", thread_records([writer.threads[i] for i in left]))
    return kept


def _kept_lines(source: Source) -> np.ndarray:
    """Line numbers of the records that pass the filters, in file order."""
    kept: list[int] = []
    for block in iter_blocks(source.ds.raw_path, with_output_ids=True,
                             block_bytes=READ_BLOCK_BYTES):
        source.count_problems(block.problems)
        for row, reason in zip(block.rows, source.verdicts(block.rows), strict=True):
            if reason is None:
                kept.append(row.line)
            else:
                source.stats.drop(reason)
    return np.array(kept, dtype=np.int64)


def _check_options(options: ExportOptions) -> None:
    if options.format not in ("tokens", "conversations"):
        raise ConfigError("--format", f"unknown format {options.format!r} "
                                      "(known: tokens, conversations)")
    known = (*RECORD_RULES, *RUN_DROPS)
    unknown = [rule for rule in options.drop if rule not in known]
    if unknown:
        raise ConfigError("--drop", f"unknown rule {unknown[0]!r} (known: {', '.join(known)})")
    if "contaminated" in options.drop and options.decontaminate == ():
        raise ConfigError("--drop", "contaminated needs the benchmark files (--decontaminate FILE)")
    if options.decontaminate and "contaminated" not in options.drop:
        raise ConfigError("--decontaminate", "goes with --drop contaminated (the benchmarks are "
                                             "looked for only to leave out what holds them)")
    if options.limit is not None and options.limit < 1:
        raise ConfigError("--limit", f"expected a number of at least 1, got {options.limit}")
    if options.reasoning not in ("auto", "field", "inline"):
        raise ConfigError("--reasoning", f"unknown value {options.reasoning!r} "
                                         "(known: auto, field, inline)")
    _check_trainer_options(options)


def _check_trainer_options(options: ExportOptions) -> None:
    if options.trainer is None:
        if options.max_length is not None:
            raise ConfigError("--max-length", "goes with --for specforge|speculators")
        return
    if options.trainer not in TRAINERS:
        raise ConfigError("--for", f"unknown trainer {options.trainer!r} "
                                   f"(known: {', '.join(TRAINERS)})")
    if options.format != "tokens":
        raise ConfigError("--format", f"--for {options.trainer} writes token rows; the "
                                      "conversations format is re-rendered by the trainer "
                                      "and is not exact (leave --format out)")
    if options.max_length is not None and options.max_length < 1:
        raise ConfigError("--max-length", f"expected a number of at least 1, "
                                          f"got {options.max_length}")


def export_run(
    out: str | os.PathLike[str], to: str | os.PathLike[str],
    options: ExportOptions | None = None,
) -> ExportSummary:
    """Export run directory `out` to file `to` (format and filters in the module docstring).

    ConfigError for bad options or a missing tokenizer, DataError for bad run files
    (missing prompts.jsonl, bad lines); nothing is written at `to` unless the export ends.
    """
    options = options or ExportOptions()
    started = time.perf_counter()
    _check_options(options)
    target = Path(to)
    sink_factory(target, options.format, options.trainer)
    run = load_run(out, options.only)
    _check_only_mode(run, options)
    _check_target_outside(target, run)
    profile = run.profile(options.model_profile)
    with contextlib.ExitStack() as stack:
        stack.enter_context(loops.sized(sum(  # numba's loops loaded for a large run only
            ds.raw_path.stat().st_size for ds in run.datasets if ds.raw_path.is_file())))
        sources: list[Source] = []
        for ds in run.datasets:
            sources.append(open_source(run, ds, profile, options))
            stack.callback(sources[-1].close)
        _flag_run_drops(out, sources, options)
        sink = _write(sources, target, options)
    report = None
    if isinstance(sink, TrainerSink) and options.trainer is not None:
        report = _trainer_outputs(TRAINERS[options.trainer], target, sink.entries, run,
                                  sources, options)
    rows = sum(source.stats.written for source in sources)
    return ExportSummary(str(target), options.format, rows, time.perf_counter() - started,
                         {source.name: source.stats for source in sources}, report)


def _check_only_mode(run: RunInfo, options: ExportOptions) -> None:
    """ConfigError when ``--only-mode`` names a mode no dataset exported has (run.json)."""
    known = list(dict.fromkeys(mode["name"] for ds in run.datasets for mode in ds.modes))
    unknown = [name for name in options.only_mode if name not in known]
    if unknown:
        listed = ", ".join(known) if known else "none: no dataset exported mixes modes"
        raise ConfigError("--only-mode", f"unknown mode {unknown[0]!r} (known: {listed})")


def _drop_benchmarks(run: RunInfo, options: ExportOptions) -> Decontamination:
    """The benchmarks ``--drop contaminated`` leaves out: the options', else the run's
    (run.json); ConfigError when there are none, or one of the run's is gone (a record
    holding it would be exported)."""
    benchmarks = run_benchmarks(run, options.decontaminate, field=options.benchmark_field,
                                ngram=options.ngram, tokenizer=options.tokenizer,
                                trust_remote_code=options.trust_remote_code, whole=True)
    if benchmarks.choice.gone:
        raise ConfigError("--drop", f"contaminated: the run's benchmark {benchmarks.choice.gone[0]} "
                                    "(run.json) is no longer there: pass --decontaminate with "
                                    "its new place")
    if benchmarks.decontaminate is None:
        raise ConfigError("--drop", "contaminated needs the benchmark files: the run names none "
                                    "(run.json); pass --decontaminate FILE")
    return benchmarks.decontaminate


def _flag_run_drops(out: str | os.PathLike[str], sources: Sequence[Source],
                    options: ExportOptions) -> None:
    """Give each source the samples the run-level drops of the options leave out (from the
    run's scan, its cache at work)."""
    wanted = [name for name in options.drop if name in RUN_DROPS]
    if not wanted:
        return
    decontaminate = None
    if "contaminated" in options.drop:
        decontaminate = _drop_benchmarks(load_run(out), options)
    thresholds = Thresholds(near_duplicate_threshold=options.near_threshold,
                            template_share=options.template_share)
    # every dataset, --only or not: a copy in an earlier dataset makes a record a duplicate
    scan = scan_run(out, model_profile=options.model_profile, thresholds=thresholds,
                    decontaminate=decontaminate)
    flags = flagged_samples(scan.run, list(scan.files.values()), thresholds, decontaminate)
    for source in sources:
        found = flags.get(source.name, {})
        source.flagged = {name: set().union(*(found.get(rule, set()) for rule in RUN_DROPS[name]))
                          for name in wanted}


def _trainer_outputs(trainer: Trainer, target: Path, entries: list[RowEntry], run: RunInfo,
                     sources: Sequence[Source], options: ExportOptions) -> TrainerReport:
    """The trainer's length figures and command; the manifest written beside the file."""
    model = _model_facts(run)
    names = [source.name for source in sources]
    tokenizer = options.tokenizer or _manifest_tokenizer(run, names)
    report = trainer_report(trainer, target, entries, names, options.max_length,
                            tokenizer or str(model.get("model_path") or "MODEL"))
    datasets = {source.name: _dataset_facts(source) for source in sources}
    keys = _row_keys(sources, options)
    write_manifest(target, report, entries, model, datasets, keys.named, keys.all_modes)
    return report


def _model_facts(run: RunInfo) -> dict[str, Any]:
    """The model as run.json records it (path, profile, server version)."""
    info = run.manifest.get("server_info")
    info = info if isinstance(info, dict) else {}
    return {"model_path": info.get("model_path"), "model_profile": run.profile_name,
            "server_version": info.get("version"), "server_url": run.manifest.get("server_url")}


def _manifest_tokenizer(run: RunInfo, names: Sequence[str]) -> str | None:
    """The tokenizer directory the run's manifest names for its datasets, when one is named."""
    for name in names:
        with contextlib.suppress(ConfigError):
            tokenizer = manifest_spec(run, name).tokenizer
            if tokenizer:
                return str(tokenizer)
    return None


def _dataset_facts(source: Source) -> dict[str, Any]:
    """What the generation of one dataset used: input mode, source, template arguments,
    sampling (the prompts are rendered without a `tools` argument: tool schemas travel in
    the messages)."""
    settings = source.ds.settings
    facts = {"rows": source.stats.written, "dropped": dict(source.stats.dropped),
             "input": settings.get("input"), "source": settings.get("path"),
             "chat_template_kwargs": source.ds.chat_template_kwargs,
             "sampling": settings.get("sampling")}
    if source.ds.modes:  # each mode's template arguments and sampling, and its rows
        facts["modes"] = source.ds.modes
        facts["rows_by_mode"] = dict(source.stats.modes)
    return facts


def _check_target_outside(target: Path, run: RunInfo) -> None:
    """ConfigError when target would replace a file the run wrote (or sit in a dataset folder)."""
    if run.owns(target):
        raise ConfigError("--to", f"{target} would replace or join the run's own files; "
                                  "write the export outside the dataset folders")


def _row_keys(sources: Sequence[Source], options: ExportOptions) -> RowKeys:
    """Which optional keys the rows carry: a turn (some rows, every row), a mode (some rows;
    every row when every dataset mixes modes or only some modes are kept)."""
    every = bool(sources)
    return RowKeys(turns=any(source.turns for source in sources),
                   named=every and all(source.turns for source in sources),
                   modes=any(source.modes for source in sources),
                   all_modes=every and (bool(options.only_mode)
                                        or all(source.modes for source in sources)))


def _write(sources: Sequence[Source], target: Path, options: ExportOptions) -> Sink:
    try:
        keys = _row_keys(sources, options)
        with (atomic_sink(target, options.format, options.trainer, keys) as sink,
              paused_gc()):
            if options.shuffle:
                _export_shuffled(sources, sink, options.limit, options.seed)
            else:
                _export_in_order(sources, sink, options.limit)
        return sink
    except WorkbenchError:
        raise
    except OSError as exc:  # the disk said no (an I/O error may be a read: a run file's)
        if exc.errno in DISK_ERRNOS - {errno.EIO} or _names_target(exc, target):
            raise storage_error(target, exc) from None
        raise DataError(exc.filename or target, f"cannot read or write: {exc.strerror or exc}") from None


def _names_target(exc: OSError, target: Path) -> bool:
    """Whether the error is about target or its temp file (not a file of the run)."""
    named = {os.fspath(name) for name in (exc.filename, exc.filename2) if name is not None}
    return bool(named & {os.fspath(target), os.fspath(temp_path(target))})


def format_summary(summary: ExportSummary) -> str:
    """The summary as lines of text for a terminal."""
    rate = summary.rows / summary.seconds if summary.seconds > 0 else 0.0
    head = (f"wrote {summary.rows:,} {summary.format} rows to {summary.path} "
            f"in {summary.seconds:.1f}s ({rate:,.0f} rows/s)")
    lines = [head]
    for name, ds in summary.datasets.items():
        dropped = ", ".join(f"{reason} {count:,}" for reason, count in
                            sorted(ds.dropped.items(), key=lambda item: _reason_order(item[0])))
        trimmed = f"; {ds.trimmed:,} outputs lost prepended prompt ids" if ds.trimmed else ""
        exact = ("" if ds.exact is None else
                 f"; {ds.exact:,} of {ds.written:,} re-render to the generated ids")
        modes = ("" if not ds.modes else
                 " (" + ", ".join(f"{mode} {count:,}" for mode, count in sorted(ds.modes.items()))
                 + ")")
        lines.append(f"  {name}: {ds.written:,} written{modes}; dropped: {dropped or 'none'}"
                     f"{trimmed}{exact}")
    if summary.trainer is not None:
        lines += _trainer_lines(summary.trainer)
    elif Path(summary.path).suffix.lower() in PARQUET_SUFFIXES:
        lines.append("note: SpecForge and speculators read JSON/JSONL only, not Parquet; "
                     "for them export with --for specforge|speculators")
    return "\n".join(lines)


def _trainer_lines(report: TrainerReport) -> list[str]:
    """Length figures, what max_length costs, the manifest and the trainer's command."""
    lines = [(f"token lengths (rows; p50/p90/p99/max) and {report.trainer} max_length "
              f"{report.max_length:,}:")]
    for name, figures in report.lengths.items():
        cost = (f"{figures.cut:,} rows cut, {figures.dropped:,} of them left with no "
                f"supervised token (the trainer drops them)" if figures.cut else "none cut")
        lines.append(f"  {name}: {figures.rows:,} rows; {figures.p50:,}/{figures.p90:,}/"
                     f"{figures.p99:,}/{figures.max:,}; {cost}")
    default = report.at_default
    if default.cut and report.max_length != report.default_max_length:
        lines.append(f"{report.trainer}'s default {report.length_key} "
                     f"{report.default_max_length:,} would cut {default.cut:,} rows and drop "
                     f"{default.dropped:,} of them without a word: pass the one below")
    lines.append(f"manifest: {report.manifest}")
    lines.append(f"train with: {report.command}")
    return lines


def _reason_order(reason: str) -> int:
    return DROP_REASONS.index(reason) if reason in DROP_REASONS else len(DROP_REASONS)
