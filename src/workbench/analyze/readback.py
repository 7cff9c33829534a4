"""Records read back from a run's files and shown: the replies the scan does not keep.

The scan (:mod:`workbench.analyze.scan`) keeps each record's counts and an index of its raw
file's blocks, not its output ids. What shows a reply reads back the few records it needs,
each from the block that holds it, and decodes their ids with a tokenizer when one is given
(else shows the ids, the profile's special ids named: ``<end>``, ``</think>``).

    examples_table        the findings' example records, with a text or id excerpt (and
                          the turn of a record of a conversation regenerated turn by turn)
    samples, Sample       chosen records with their output decoded (or their ids)
    record_detail, RecordDetail
                          one record in full: prompt, reasoning, answer, counts, findings
    search_replies        the selected records whose decoded reply holds a text

Reasoning and answer are split at the profile's think-end id, as in the record frame
(:mod:`workbench.analyze.frames`); a record of a mode that switched thinking off (a dataset
that mixes modes) is all answer.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
import pandas as pd

from workbench.analyze.findings import ValidationReport
from workbench.analyze.frames import RunSource, scanned
from workbench.analyze.rules import dataset_checker
from workbench.analyze.scan import RunScan
from workbench.errors import ConfigError
from workbench.profiles import ModelProfile
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE
from workbench.rundir.reader import rows_at
from workbench.rundir.records import Row
from workbench.rundir.run import load_run
from workbench.tokenizer import load_tokenizer

__all__ = [
    "RecordDetail",
    "Sample",
    "examples_table",
    "record_detail",
    "samples",
    "search_replies",
]


def _decoder(tokenizer: str | os.PathLike[str] | None) -> Any:
    if tokenizer is None:
        return None

    with warnings.catch_warnings():  # tqdm, imported by transformers, warns in a kernel without widgets
        warnings.filterwarnings("ignore", message="IProgress not found")
        return load_tokenizer(Path(tokenizer))


def _id_names(profile: ModelProfile) -> dict[int, str]:
    names = {end: "<end>" for end in profile.end_ids}
    if profile.eos_id is not None:
        names[profile.eos_id] = "<eos>"
    if profile.think_start is not None:
        names[profile.think_start] = "<think>"
    if profile.think_end is not None:
        names[profile.think_end] = "</think>"
    return names


def _render_ids(ids: Sequence[int], names: Mapping[int, str]) -> str:
    return " ".join(names.get(i, str(i)) for i in ids)


def _excerpt(ids: list[int] | None, decoder: Any, names: Mapping[int, str], chars: int) -> str:
    """The end of a reply (where format problems show): decoded text, or its last ids."""
    if not ids:
        return "" if ids is None else "(no output ids)"
    if decoder is not None:
        text = decoder.decode(ids, skip_special_tokens=False)
        return text if len(text) <= chars else "…" + text[-chars:]
    keep = max(8, chars // 8)
    shown = _render_ids(ids[-keep:], names)
    return shown if len(ids) <= keep else "… " + shown


def examples_table(
    report: ValidationReport | RunScan,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    chars: int = 400,
) -> pd.DataFrame:
    """Every example of every finding: dataset, rule, severity, file, line, detail, and for
    a record its sample_id, finish_reason, completion_tokens and an excerpt of its end
    (decoded with `tokenizer`, else its last ids with the profile's special ids named); for
    a line of prompts.jsonl (a prompt without a record, a duplicate prompt) its sample_id.
    When an example is a turn of a conversation regenerated turn by turn (``turns: each``),
    a ``turn`` column (Int64) stands beside ``sample_id``: the record's turn, or the
    prompt's, NA for a single-turn example. Given a
    :func:`~workbench.analyze.scan.scan_run` result, only the examples' blocks are read."""
    scan = report if isinstance(report, RunScan) else None
    report = report.report if isinstance(report, RunScan) else report
    run = scan.run if scan is not None else load_run(_required(run_dir), list(report.datasets))
    profile = run.profile(report.model_profile)
    decoder, names = _decoder(tokenizer), _id_names(profile)
    rows = []
    for ds in run.datasets:
        findings = report.datasets[ds.name].findings
        wanted = {e.line for f in findings for e in f.examples if e.file == RAW_FILE}
        records = rows_at(ds.raw_path, wanted, scan.files.get(ds.name) if scan else None)
        prompt_keys = _prompt_keys_at(ds.prompts_path, {e.line for f in findings for e in f.examples
                                                        if e.file == PROMPTS_FILE})
        for finding in findings:
            for example in finding.examples:
                row = records.get(example.line) if example.file == RAW_FILE else None
                rows.append(_example_row(ds.name, finding, example, row, decoder, names, chars))
                if example.file == PROMPTS_FILE:
                    rows[-1]["sample_id"], rows[-1]["turn"] = prompt_keys.get(example.line, (None, None))
    return _examples_frame(rows)


_EXAMPLE_COLUMNS = ["dataset", "rule", "severity", "file", "line", "detail", "sample_id",
                    "finish_reason", "completion_tokens", "excerpt"]


def _examples_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The examples, with the ``turn`` column beside ``sample_id`` when one of them has a turn."""
    frame = pd.DataFrame(rows, columns=_EXAMPLE_COLUMNS)
    turns = [row["turn"] for row in rows]
    if any(turn is not None for turn in turns):
        frame.insert(_EXAMPLE_COLUMNS.index("sample_id") + 1, "turn", pd.array(turns, dtype="Int64"))
    return frame


class _PromptKey(msgspec.Struct):
    sample_id: Any = None
    turn: Any = None


def _turn(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _prompt_keys_at(path: Path, lines: set[int]) -> dict[int, tuple[Any, int | None]]:
    """The sample_id and turn (None without one) at each of the given (1-based) lines of
    prompts.jsonl, read up to the last of them; a line that is not a prompt object is left
    out."""
    found: dict[int, tuple[Any, int | None]] = {}
    if not lines or not path.is_file():
        return found
    decoder, last = msgspec.json.Decoder(_PromptKey), max(lines)
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if number in lines:
                try:
                    key = decoder.decode(line)
                except msgspec.DecodeError:
                    pass
                else:
                    found[number] = (key.sample_id, _turn(key.turn))
            if number >= last:
                break
    return found


def _required(run_dir: str | os.PathLike[str] | None) -> str | os.PathLike[str]:
    if run_dir is None:
        raise ConfigError("run_dir", "needed with a validation report (or pass the run's scan)")
    return run_dir


def _example_row(name: str, finding: Any, example: Any, row: Row | None, decoder: Any,
                 names: Mapping[int, str], chars: int) -> dict[str, Any]:
    return {
        "dataset": name, "rule": finding.rule, "severity": finding.severity,
        "file": example.file, "line": example.line, "detail": example.detail,
        "sample_id": None if row is None else row.sample_id,
        "turn": None if row is None else row.turn,
        "finish_reason": None if row is None else row.finish_reason,
        "completion_tokens": None if row is None else row.completion_tokens,
        "excerpt": "" if row is None else _excerpt(row.output_ids, decoder, names, chars),
    }


@dataclass(frozen=True, slots=True)
class Sample:
    """One record shown in full: its reasoning and answer as text (decoded) or ids, its
    turn of a conversation regenerated turn by turn (None for a single-turn record) and its
    mode (None outside a dataset that mixes modes)."""

    dataset: str
    line: int
    sample_id: int | str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning: str | None
    answer: str
    decoded: bool
    cut: bool
    turn: int | None = None
    mode: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clip(text: str, chars: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= chars else (text[:chars], True)


def _parts(ids: list[int], profile: ModelProfile, reasoning: bool) -> tuple[list[int] | None, list[int]]:
    """(reasoning ids up to the think-end id, answer ids); no reasoning part without thinking."""
    if not reasoning or profile.think_end is None:
        return None, ids
    if profile.think_end not in ids:
        return ids, []
    cut = ids.index(profile.think_end) + 1
    return ids[:cut], ids[cut:]


def _sample(name: str, row: Row, profile: ModelProfile, reasoning: bool, decoder: Any,
            chars: int) -> Sample:
    head, tail = _parts(row.output_ids or [], profile, reasoning)
    names = _id_names(profile)

    def show(ids: list[int]) -> tuple[str, bool]:
        return _clip(_show(ids, decoder, names), chars)

    thought, cut_head = show(head) if head is not None else (None, False)
    answer, cut_tail = show(tail)
    return Sample(name, row.line, row.sample_id, row.finish_reason, row.prompt_tokens,
                  row.completion_tokens, thought, answer, decoder is not None, cut_head or cut_tail,
                  row.turn, row.mode)


def samples(
    run_dir: RunSource,
    selected: pd.DataFrame,
    *,
    n: int = 10,
    seed: int = 0,
    tokenizer: str | os.PathLike[str] | None = None,
    model_profile: str | None = None,
    chars: int = 2000,
) -> list[Sample]:
    """Up to n of the `selected` rows (a record_frame slice), drawn with seed, read back with
    their output ids: decoded with `tokenizer` when given, else as ids; each part is cut
    to `chars` characters. Only the chosen records' blocks are read (the scan's index)."""
    scan = scanned(run_dir, model_profile)
    run, profile = scan.run, scan.profile
    chosen = selected.sample(min(n, len(selected)), random_state=seed).sort_values(["dataset", "line"])
    decoder = _decoder(tokenizer)
    shown = []
    for ds in run.datasets:
        lines = chosen.loc[chosen["dataset"] == ds.name, "line"].tolist()
        checker = dataset_checker(ds, profile)
        found = rows_at(ds.raw_path, set(lines), scan.files.get(ds.name))
        for line, row in sorted(found.items()):
            shown.append(_sample(ds.name, row, profile, checker.reasoning_of(row.mode), decoder,
                                 chars))
    return shown


# --- one record, and search in the decoded replies -------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordDetail:
    """One record opened in full: prompt, reasoning and answer (decoded with special tokens
    visible, or as ids), counts, the per-record findings it has, its turn of a
    conversation regenerated turn by turn (None for a single-turn record) and its mode (None
    outside a dataset that mixes modes)."""

    dataset: str
    line: int
    sample_id: int | str | None
    finish_reason: str | None
    matched_stop: int | str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    prompt: str | None
    reasoning: str | None
    answer: str
    decoded: bool
    findings: tuple[tuple[str, str], ...]
    matched_stop_name: str | None = None  # the stop token's text (<|im_end|>), else the profile's name
    turn: int | None = None
    mode: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _PromptLine(msgspec.Struct):
    sample_id: Any = None
    input_ids: list[int] | None = None
    text: str | None = None
    turn: Any = None


_PROMPT_DECODER = msgspec.json.Decoder(_PromptLine)


def _prompt_of(path: Path, sample_id: object, decoder: Any, names: Mapping[int, str],
               turn: int | None = None) -> str | None:
    """The prompt of `sample_id` (at `turn` of a conversation regenerated turn by turn) as
    sent (prompts.jsonl): decoded ids, or its text. The file is read from its start up to
    that prompt (prompts are not in the scan)."""
    if sample_id is None or not path.is_file():
        return None
    with path.open("rb") as lines:
        for raw in lines:
            try:
                prompt = _PROMPT_DECODER.decode(raw)
            except msgspec.DecodeError:
                continue
            if prompt.sample_id == sample_id and prompt.turn == turn:
                if prompt.input_ids is not None:
                    return _show(prompt.input_ids, decoder, names)
                return prompt.text
    return None


def _show(ids: Sequence[int], decoder: Any, names: Mapping[int, str]) -> str:
    return decoder.decode(list(ids), skip_special_tokens=False) if decoder else _render_ids(ids, names)


def _stop_name(matched: int | str | None, decoder: Any, names: Mapping[int, str]) -> str | None:
    """A matched stop id as text: the tokenizer's token (``<|im_end|>``), else the profile's
    name for it (``<end>``); a stop string is itself; None when there is no name."""
    if matched is None or isinstance(matched, str):
        return matched
    return _show([matched], decoder, names) if decoder is not None or matched in names else None


def record_detail(
    run_dir: RunSource,
    dataset: str,
    line: int,
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    model_profile: str | None = None,
) -> RecordDetail:
    """The record at `line` of `dataset`'s raw file, in full (ConfigError when there is
    none); with a scan, only the block holding it is read."""
    scan = scanned(run_dir, model_profile)
    profile, ds = scan.profile, scan.run.dataset(dataset)
    row = rows_at(ds.raw_path, {line}, scan.files.get(ds.name)).get(line)
    if row is None:
        raise ConfigError("line", f"{ds.raw_path}: no readable record at line {line}")
    checker = dataset_checker(ds, profile)
    decoder, names = _decoder(tokenizer), _id_names(profile)
    head, tail = _parts(row.output_ids or [], profile, checker.reasoning_of(row.mode))
    problems = checker.check_rows([row])[0]
    return RecordDetail(
        dataset, line, row.sample_id, row.finish_reason, row.matched_stop, row.prompt_tokens,
        row.completion_tokens, row.cached_tokens,
        _prompt_of(ds.prompts_path, row.sample_id, decoder, names, row.turn),
        None if head is None else _show(head, decoder, names), _show(tail, decoder, names),
        decoder is not None, tuple(problems), _stop_name(row.matched_stop, decoder, names), row.turn,
        row.mode)


def search_replies(
    run_dir: RunSource,
    selected: pd.DataFrame,
    text: str,
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    model_profile: str | None = None,
    limit: int = 5000,
    cache: dict[tuple[str, int], str] | None = None,
) -> tuple[pd.DataFrame, int]:
    """The rows of `selected` whose decoded reply (special tokens visible; ids without a
    tokenizer) holds `text` (case-insensitive), and how many rows were searched: the first
    `limit` of the selection. `cache` keeps decoded replies between calls."""
    scan = scanned(run_dir, model_profile)
    decoder, names = _decoder(tokenizer), _id_names(scan.profile)
    store = {} if cache is None else cache
    searched = selected.iloc[:limit]
    for ds in scan.run.datasets:
        lines = searched.loc[searched["dataset"].astype(str) == ds.name, "line"]
        todo = {int(n) for n in lines if (ds.name, int(n)) not in store}
        for at, row in rows_at(ds.raw_path, todo, scan.files.get(ds.name)).items():
            store[(ds.name, at)] = _show(row.output_ids or [], decoder, names).casefold()
    needle = text.casefold()
    keys = zip(searched["dataset"].astype(str), searched["line"].astype(int), strict=True)
    hits = [needle in store.get(key, "") for key in keys]
    return searched[pd.Series(hits, index=searched.index, dtype=bool)], len(searched)
