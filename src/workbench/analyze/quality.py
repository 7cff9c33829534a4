"""Data worth training on: duplicates and benchmark contamination, across a run's datasets.

The per-record degeneracy rules (``repetition``, ``special_heavy``) are
:mod:`workbench.analyze.rules`'s; this module adds what only the whole run can tell:

    rule                   default   what it counts (file)
    duplicate_prompt       warning   a prompt whose content (its ids, or its text's normalised
                                     words) equals an earlier prompt's, in this dataset or an
                                     earlier one: the budget spent twice (prompts)
    near_duplicate_prompt  info      a prompt whose MinHash estimate of shingle Jaccard with an
                                     earlier one is near_duplicate_prompt_threshold (0.9) or
                                     more: high, as a dataset's template (system prompt, tool
                                     schemas) makes different questions alike (prompts)
    duplicate_reply        warning   a reply whose output ids equal an earlier reply's (raw)
    near_duplicate_reply   info      a reply nearly equal to an earlier one (estimated Jaccard of
                                     near_duplicate_threshold, 0.5, or more): templated answers
                                     that teach a drafter nothing new (raw)
    contaminated_prompt    warning   a prompt holding an n-gram (13 normalised words) of a
                                     benchmark given with --decontaminate (prompts)
    contaminated_reply     warning   a reply holding one (raw)

"Earlier" is the manifest's dataset order, then file order: the first copy is kept, the later
ones are flagged (and dropped by ``export --drop duplicate|near_duplicate``). Replies of fewer
than 32 ids (short answers are alike by nature, their prompts differ) and records repeating
an earlier record's sample id are not compared.

The per-record figures (digest, MinHash signature, benchmark overlap) are computed in the one
scan of the raw files and kept in its cache (:mod:`workbench.rundir.columns`): a grown run
computes them for the new records only, and the comparison across the run works on the kept
figures. A prompts file's figures are kept beside it while it is unchanged.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np

from workbench import sketch
from workbench.analyze.rules import Thresholds
from workbench.config import load_manifest
from workbench.errors import ConfigError, DataError
from workbench.rundir.cache import cache_key, file_stamp, load_appended, save_appended
from workbench.rundir.columns import Columns, FileScan, Tally
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE
from workbench.rundir.records import PromptRecord, SampleId
from workbench.rundir.run import RunInfo
from workbench.tokenizer import load_tokenizer

__all__ = [
    "DATA_RULES",
    "QUALITY_VERSION",
    "Decontamination",
    "PromptFigures",
    "add_quality",
    "benchmark_counts",
    "data_findings",
    "flagged_samples",
    "prompt_figures",
    "run_tokenizer",
]

QUALITY_VERSION = 4  # bump when the kept figures change meaning

DATA_RULES = ("duplicate_prompt", "near_duplicate_prompt", "duplicate_reply",
              "near_duplicate_reply", "contaminated_prompt", "contaminated_reply")

MIN_REPLY_IDS = 32  # shorter replies ("4", "Yes.") are alike by nature: their prompts differ

_SIGNATURE = np.uint32  # signatures are kept as 32-bit values: half the cache, same estimates


@dataclass(frozen=True)
class Decontamination:
    """Benchmarks to look for in a run, and the decoder of its ids into words."""

    benchmarks: sketch.Benchmarks
    decoder: sketch.PieceDecoder | None

    @property
    def key(self) -> str:
        """The benchmarks' digest and the decoder's (another tokenizer reads other words)."""
        return f"{self.benchmarks.digest}:{self.decoder.digest if self.decoder else 'no-ids'}"

    @property
    def names(self) -> list[str]:
        return list(self.benchmarks.names)

    @classmethod
    def load(cls, paths: Sequence[str | os.PathLike[str]], *, field: str | None = None,
             ngram: int = 13, tokenizer: Any = None) -> Decontamination:
        """The benchmark files (JSONL or Parquet; DataError naming a bad file and line) and
        the tokenizer that decodes the run's ids (None: ids are not looked at)."""
        benchmarks = sketch.Benchmarks.load([Path(p) for p in paths], field, n=ngram)
        return cls(benchmarks, None if tokenizer is None else sketch.PieceDecoder(tokenizer))

    def id_overlaps(self, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per row of ids, the bit mask of the benchmarks it overlaps (0 without a decoder)."""
        if self.decoder is None or not len(starts):
            return np.zeros(len(starts), dtype=np.int64)
        words, word_starts, word_ends = self.decoder.words(ids, starts, ends)
        return self.benchmarks.overlaps(words, word_starts, word_ends)

    def text_overlaps(self, texts: Sequence[str]) -> np.ndarray:
        """Per text, the bit mask of the benchmarks it overlaps."""
        words, starts, ends = _concat([sketch.word_hashes(text) for text in texts])
        return self.benchmarks.overlaps(words, starts, ends)

    def describe(self, mask: int) -> str:
        return ", ".join(name for bit, name in enumerate(self.names) if mask >> bit & 1)


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
                repeat: list[float], special: list[int],
                decontaminate: Decontamination | None) -> None:
    """Append the quality columns of a batch of rows (row i holds ids[starts[i]:ends[i]])."""
    columns.repeat_share.extend(repeat)
    columns.special_ids.extend(special)
    if not len(starts):
        return
    columns.digest.extend(sketch.digest(ids, starts, ends).tolist())
    first = sketch.clipped(starts, ends)  # the figures of a huge reply: its first ids'
    signatures = sketch.signatures(ids, starts, first).astype(_SIGNATURE)
    columns.signature.extend(row.tobytes() for row in signatures)
    overlap = (np.zeros(len(starts), dtype=np.int64) if decontaminate is None
               else decontaminate.id_overlaps(ids, starts, first))
    columns.overlap.extend(overlap.tolist())


class _Rows(NamedTuple):
    """The rows of every dataset compared together: owner dataset, line, sample id, digest,
    signature, overlap."""

    dataset: list[str]
    line: list[int]
    sample_id: list[SampleId]
    digest: np.ndarray
    signature: np.ndarray
    overlap: np.ndarray


class PromptFigures(msgspec.Struct):
    """What the quality rules keep of a prompts file: one entry per sample id's first line,
    and the lines read (a file that grew is read from where this stopped)."""

    sample_id: list[SampleId] = msgspec.field(default_factory=list)
    line: list[int] = msgspec.field(default_factory=list)
    digest: list[int] = msgspec.field(default_factory=list)
    signature: list[bytes] = msgspec.field(default_factory=list)
    overlap: list[int] = msgspec.field(default_factory=list)
    lines: int = 0

    def extend(self, other: PromptFigures) -> None:
        for name in ("sample_id", "line", "digest", "signature", "overlap"):
            getattr(self, name).extend(getattr(other, name))
        self.lines += other.lines


def data_findings(run: RunInfo, scans: Sequence[FileScan], thresholds: Thresholds,
                  decontaminate: Decontamination | None = None, *, cache: bool = True,
                  prompts: Mapping[str, PromptFigures] | None = None,
                  ) -> dict[str, list[tuple[str, Tally]]]:
    """Per dataset, the tallies of the run-level rules: (file, tally) pairs for the findings.
    `prompts`: the :func:`prompt_figures` of the run when they were read already."""
    if prompts is None:
        prompts = prompt_figures(run, decontaminate, cache=cache)
    flags = _flags(run, scans, thresholds, decontaminate, prompts)
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
                    ) -> dict[str, dict[str, set[SampleId]]]:
    """Per dataset, per run-level rule, the sample ids it flags (the export's drops)."""
    flags = _flags(run, scans, thresholds, decontaminate,
                   prompt_figures(run, decontaminate, cache=cache))
    return {name: {rule: {sid for sid, _ in lines.values()} for rule, lines in rules.items()}
            for name, rules in flags.items()}


_Flags = dict[str, dict[str, dict[int, tuple[SampleId, str]]]]  # dataset -> rule -> line -> ...


def _flags(run: RunInfo, scans: Sequence[FileScan], thresholds: Thresholds,
           decontaminate: Decontamination | None, figures: Mapping[str, PromptFigures]) -> _Flags:
    flags: _Flags = {}
    names = [ds.name for ds in run.datasets]
    _compare(_reply_rows(names, scans, MIN_REPLY_IDS), "reply",
             thresholds.near_duplicate_threshold, flags)
    _contamination(_reply_rows(names, scans), "contaminated_reply", decontaminate, flags)
    prompts = _prompt_rows(run, figures)
    _compare(prompts, "prompt", thresholds.near_duplicate_prompt_threshold, flags)
    _contamination(prompts, "contaminated_prompt", decontaminate, flags)
    return flags


def _reply_rows(names: Sequence[str], scans: Sequence[FileScan], min_ids: int = 1) -> _Rows:
    parts: list[tuple[str, Columns, np.ndarray]] = []
    for name, scan in zip(names, scans, strict=True):
        parts.append((name, scan.columns, _comparable(scan.columns, min_ids)))
    return _gather((name, columns, keep, columns.digest, columns.signature, columns.overlap)
                   for name, columns, keep in parts)


def _comparable(columns: Columns, min_ids: int) -> np.ndarray:
    """Indexes of the records compared: the first of their sample id, with `min_ids` ids or
    more."""
    seen: set[SampleId] = set()
    keep: list[int] = []
    for index, (sample_id, length) in enumerate(
            zip(columns.sample_id, columns.output_len, strict=True)):
        if sample_id is None or sample_id in seen:
            continue
        seen.add(sample_id)  # the first record of a sample id is the one exports keep
        if length and length >= min_ids:
            keep.append(index)
    return np.asarray(keep, dtype=np.int64)


def _gather(parts: Iterable[tuple[str, Any, np.ndarray, Sequence[int], Sequence[bytes],
                                  Sequence[int]]]) -> _Rows:
    dataset: list[str] = []
    line: list[int] = []
    sample_id: list[SampleId] = []
    digests: list[np.ndarray] = []
    signatures: list[bytes] = []
    overlaps: list[np.ndarray] = []
    for name, columns, keep, digest, signature, overlap in parts:
        keep_list = keep.tolist()
        dataset.extend([name] * len(keep_list))
        line.extend(columns.line[i] for i in keep_list)
        sample_id.extend(columns.sample_id[i] for i in keep_list)
        digests.append(np.asarray(digest, dtype=np.uint64)[keep] if len(keep) else
                       np.zeros(0, dtype=np.uint64))
        signatures.extend(signature[i] for i in keep_list)
        overlaps.append(np.asarray(overlap, dtype=np.int64)[keep] if len(keep) else
                        np.zeros(0, dtype=np.int64))
    width = len(signatures[0]) // np.dtype(_SIGNATURE).itemsize if signatures else 1
    matrix = (np.frombuffer(b"".join(signatures), dtype=_SIGNATURE).reshape(-1, width)
              if signatures else np.zeros((0, width), dtype=_SIGNATURE))
    return _Rows(dataset, line, sample_id, np.concatenate(digests) if digests else
                 np.zeros(0, dtype=np.uint64), matrix,
                 np.concatenate(overlaps) if overlaps else np.zeros(0, dtype=np.int64))


def _compare(rows: _Rows, what: str, threshold: float, flags: _Flags) -> None:
    """Flag exact, then near duplicates among rows (a row exactly equal to an earlier one is
    not told again as near)."""
    if not len(rows.line):
        return
    exact = sketch.exact_duplicates(rows.digest)
    near = sketch.near_duplicates(rows.signature.astype(np.uint64), threshold)
    for index in np.flatnonzero((exact >= 0) | (near >= 0)).tolist():
        other = int(exact[index]) if exact[index] >= 0 else int(near[index])
        rule = f"duplicate_{what}" if exact[index] >= 0 else f"near_duplicate_{what}"
        where = f"{rows.dataset[other]} sample_id {rows.sample_id[other]!r}"
        kind = "same as" if exact[index] >= 0 else "nearly the same as"
        detail = f"sample_id {rows.sample_id[index]!r}: {kind} {where}"
        _flag(flags, rows, index, rule, detail)


def _contamination(rows: _Rows, rule: str, decontaminate: Decontamination | None,
                   flags: _Flags) -> None:
    if decontaminate is None:
        return
    for index in np.flatnonzero(rows.overlap).tolist():
        detail = (f"sample_id {rows.sample_id[index]!r} holds a {decontaminate.benchmarks.n}-gram "
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
                   cache: bool = True) -> dict[str, PromptFigures]:
    """The figures of each dataset's prompts.jsonl (those without one left out): read while
    the scan's workers read the replies, on a machine with cores to spare."""
    return {ds.name: _prompt_figures(ds.prompts_path, decontaminate, cache)
            for ds in run.datasets if ds.prompts_path.is_file()}


def _prompt_rows(run: RunInfo, figures: Mapping[str, PromptFigures]) -> _Rows:
    parts = []
    for ds in run.datasets:
        found = figures.get(ds.name)
        if found is not None:
            keep = np.arange(len(found.line), dtype=np.int64)
            parts.append((ds.name, found, keep, found.digest, found.signature, found.overlap))
    return _gather(parts)


def _prompt_figures(path: Path, decontaminate: Decontamination | None,
                    cache: bool) -> PromptFigures:
    """The figures of every prompt of path: kept ones, and those of the lines appended since."""
    key = cache_key("quality-prompts", QUALITY_VERSION,
                    None if decontaminate is None else decontaminate.key)
    found = load_appended(path, "quality", key, PromptFigures) if cache else None
    known, offset = found if found is not None else (PromptFigures(), 0)
    stamp = file_stamp(path)  # before the read: what a saved summary was read from
    new, end = _read_prompt_figures(path, offset, known, decontaminate)
    known.extend(new)
    if cache and end > offset:
        save_appended(path, "quality", key, known, end, stamp)
    return known


_LINES = msgspec.json.Decoder(PromptRecord)


def _read_prompt_figures(path: Path, offset: int, known: PromptFigures,
                         decontaminate: Decontamination | None) -> tuple[PromptFigures, int]:
    """The figures of the whole lines of path after byte offset (each sample id's first line
    only; unreadable lines are validate's to tell), and the offset after the last one."""
    with open(path, "rb") as file:
        file.seek(offset)
        data = file.read()
    data = data[: data.rfind(b"\n") + 1]  # a torn last line waits for its end
    seen = set(known.sample_id)
    lines: list[int] = []
    records: list[PromptRecord] = []
    for number, line in enumerate(data.split(b"\n")[:-1], start=known.lines + 1):
        try:
            record = _LINES.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if record.sample_id in seen or (record.input_ids is None and record.text is None):
            continue
        seen.add(record.sample_id)
        lines.append(number)
        records.append(record)
    flat, starts, ends = _prompt_tokens(records)
    figures = PromptFigures([r.sample_id for r in records], lines,
                             sketch.digest(flat, starts, ends).tolist(),
                             [row.tobytes() for row in sketch.signatures(
                                 flat, starts, sketch.clipped(starts, ends)).astype(_SIGNATURE)],
                             _prompt_overlaps(records, decontaminate).tolist(),
                             data.count(b"\n"))
    return figures, offset + len(data)


def _prompt_tokens(records: Sequence[PromptRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prompts' content back to back: their ids, or their text's word hashes."""
    if all(r.input_ids is not None for r in records):
        lists = [r.input_ids or [] for r in records]
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        try:
            flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64,
                               count=int(lengths.sum())).view(np.uint64)
        except OverflowError:  # an id past 64 bits: out of any vocabulary, so clipped
            flat = np.array([min(max(i, -1), 1 << 62) for i in itertools.chain.from_iterable(lists)],
                            dtype=np.int64).view(np.uint64)
        ends = np.cumsum(lengths)
        return flat, ends - lengths, ends
    return _concat([np.asarray(r.input_ids, dtype=np.int64).view(np.uint64)
                    if r.input_ids is not None else sketch.word_hashes(r.text or "")
                    for r in records])


def _prompt_overlaps(records: Sequence[PromptRecord],
                     decontaminate: Decontamination | None) -> np.ndarray:
    overlap = np.zeros(len(records), dtype=np.int64)
    if decontaminate is None or not records:
        return overlap
    texts = [i for i, r in enumerate(records) if r.input_ids is None]
    if texts:
        overlap[texts] = decontaminate.text_overlaps([records[i].text or "" for i in texts])
    with_ids = [i for i, r in enumerate(records) if r.input_ids is not None]
    if with_ids:
        flat, starts, ends = _concat([np.asarray(records[i].input_ids, dtype=np.int64)
                                      for i in with_ids])
        overlap[with_ids] = decontaminate.id_overlaps(flat.astype(np.int64), starts,
                                                      sketch.clipped(starts, ends))
    return overlap


def _concat(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One flat array of parts and the start and end of each."""
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    ends = np.cumsum(lengths)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    return flat, ends - lengths, ends
