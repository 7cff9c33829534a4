"""What an earlier run left in a dataset's folder, and whether this run may go on from it.

Resume trusts what was sent, not what the manifest says now. prompts.jsonl is the record of
the prompt every finished sample was sent (its token ids, or its text): its lines for
finished samples are never rewritten. Before anything is written, :func:`read_resume` reads:

- the finished records of raw_responses.jsonl (:func:`~workbench.rundir.records.is_finished`,
  the definition every reader shares): their ids and completion tokens;
- the lines that are not finished records (unreadable, a contract field missing, an
  abort): ``rejected``, put aside on open (``raw_responses.jsonl.rejected``) and sent again;
- the prompt each finished sample was sent (its prompts.jsonl line), compared with the one
  the manifest and the data file build now: ``changed`` when they differ (a chat template
  argument, a tokenizer, an edited row), ``removed`` when the row is gone from the data file.

Changed or removed finished samples refuse the resume (:func:`conflict_message`: the
dataset, the count, an example id); with ``--force`` their records are moved aside
(``*.bak``) and the changed ones are sent again with their new prompt. So does a run.json
that says another model, or other sampling parameters for a dataset (:func:`check_settings`;
``--force`` resumes anyway).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from workbench.config import DatasetSpec, Sampling
from workbench.errors import DataError, ResumeMismatch
from workbench.generate.prompts import Prompt
from workbench.rundir.layout import DatasetDir
from workbench.rundir.line_index import LineSpan, index_lines, span_reader
from workbench.rundir.manifest import dataset_entries, manifest_path
from workbench.rundir.reader import iter_blocks
from workbench.rundir.records import PromptRecord, Row, SampleId, encode_line, is_finished

__all__ = [
    "DatasetResume",
    "TurnResume",
    "check_settings",
    "conflict_message",
    "finished_rows",
    "modes_record",
    "prompt_line",
    "prompt_record",
    "read_resume",
    "recorded_modes",
    "same_prompt",
    "sent_line",
]

_PROMPT = msgspec.json.Decoder(PromptRecord)


@dataclass(slots=True)
class TurnResume:
    """A turns dataset's conversations as an earlier session left them."""

    next: dict[SampleId, Prompt] = field(default_factory=dict)  # started: their next turn
    spans: dict[SampleId, list[LineSpan]] = field(default_factory=dict)  # finished turns' lines
    turns: dict[SampleId, int] = field(default_factory=dict)  # finished turns per conversation
    tokens: dict[SampleId, int] = field(default_factory=dict)  # their completion tokens

    def forget(self, sample_id: SampleId) -> None:
        """The conversation starts again from turn 0 (its records moved aside)."""
        for kept in (self.next, self.spans, self.turns, self.tokens):
            kept.pop(sample_id, None)


@dataclass(slots=True)
class DatasetResume:
    """What a dataset's folder holds of an earlier run (see the module docstring)."""

    done: dict[SampleId, int] = field(default_factory=dict)  # finished id -> completion tokens
    lines: dict[SampleId, list[int]] = field(default_factory=dict)  # raw lines of each id
    rejected: set[int] = field(default_factory=set)  # raw lines that are no finished record
    sent: dict[SampleId, LineSpan] = field(default_factory=dict)  # prompts.jsonl lines
    changed: list[SampleId] = field(default_factory=list)
    removed: list[SampleId] = field(default_factory=list)
    turns: TurnResume | None = None  # a turns: each dataset's conversations (turn_resume)

    @property
    def conflicts(self) -> list[SampleId]:
        """Finished samples whose prompt is no longer the one they were sent."""
        return [*self.changed, *self.removed]

    def record_lines(self, ids: list[SampleId]) -> set[int]:
        """The raw lines of the records of `ids`."""
        return {line for sample_id in ids for line in self.lines.get(sample_id, ())}


def prompt_record(prompt: Prompt) -> PromptRecord:
    """The prompts.jsonl entry of a prompt as sent."""
    return PromptRecord(prompt.sample_id, input_ids=prompt.input_ids, text=prompt.text,
                        turn=prompt.turn, history=prompt.digest, mode=prompt.mode)


def prompt_line(prompt: Prompt) -> bytes:
    """The prompts.jsonl line of a prompt as sent."""
    return encode_line(prompt_record(prompt))


def sent_line(prompt: Prompt, server_ids: list[int]) -> PromptRecord:
    """The prompts.jsonl line of a prompt the server rendered: the ids it rendered, the
    digest of the history it rendered them from."""
    return PromptRecord(prompt.sample_id, input_ids=server_ids, turn=prompt.turn,
                        history=prompt.digest, mode=prompt.mode)


class _ModeLine(msgspec.Struct):
    """What a prompts.jsonl line says of its mode (its ids are skipped, not built)."""

    sample_id: SampleId
    mode: str | None = None


_MODE_LINE = msgspec.json.Decoder(_ModeLine)


def recorded_modes(path: Path) -> dict[SampleId, str]:
    """The mode each sample of a prompts.jsonl was drawn in an earlier session ({} when the
    file is absent; lines that cannot be read are passed over)."""
    modes: dict[SampleId, str] = {}
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return modes
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
    with handle:
        for line in handle:
            if b'"mode"' not in line:
                continue
            try:
                item = _MODE_LINE.decode(line)
            except msgspec.DecodeError:
                continue
            if item.mode is not None:
                modes.setdefault(item.sample_id, item.mode)
    return modes


def read_resume(folder: DatasetDir, prompts: list[Prompt], complete: bool) -> DatasetResume:
    """What `folder` holds, against this run's `prompts` (`complete`: they are every row of the
    data file, so a finished id missing from them was removed from it). OSError when a file
    cannot be read."""
    state = DatasetResume()
    if folder.raw_path.is_file():
        _read_records(folder.raw_path, state)
    if folder.prompts_path.is_file() and state.done:
        state.sent = index_lines(folder.prompts_path)
        _compare(folder.prompts_path, state, prompts, complete)
    return state


def finished_rows(path: Path, state: DatasetResume) -> Iterator[Row]:
    """The finished records of path, in file order; every line of each id noted in
    `state.lines`, the lines that are no finished record in `state.rejected`."""
    for block in iter_blocks(path):
        bad = {p.line for p in block.problems if p.kind != "torn"}
        state.rejected |= bad
        for row in block.rows:
            if row.sample_id is not None:
                state.lines.setdefault(row.sample_id, []).append(row.line)
            if is_finished(row, row.line not in bad):
                yield row
            else:
                state.rejected.add(row.line)


def _read_records(path: Path, state: DatasetResume) -> None:
    """Finished records (the first of each id counts), every line of each id, the rest."""
    for row in finished_rows(path, state):
        if row.sample_id not in state.done:
            assert row.sample_id is not None and row.completion_tokens is not None
            state.done[row.sample_id] = row.completion_tokens


def _compare(path: Path, state: DatasetResume, prompts: list[Prompt], complete: bool) -> None:
    """Fill `changed` and `removed`: finished samples with a recorded prompt that is not the
    one built now, or whose row is gone."""
    now = {p.sample_id: p for p in prompts}
    with span_reader(path) as read:
        for sample_id in state.done:
            span = state.sent.get(sample_id)
            if span is None:
                continue  # no record of what was sent: nothing to compare with
            prompt = now.get(sample_id)
            if prompt is None:
                if complete:
                    state.removed.append(sample_id)
            elif not same_prompt(read(span), prompt_line(prompt)):
                state.changed.append(sample_id)


def same_prompt(sent: bytes, built: bytes) -> bool:
    """Whether two prompts.jsonl lines hold the same prompt (the same bytes, or the same
    values written another way; for a prompt the server rendered, the same history)."""
    if sent.rstrip(b"\r\n") == built.rstrip(b"\n"):
        return True
    try:
        old, new = _PROMPT.decode(sent), _PROMPT.decode(built)
    except msgspec.DecodeError:
        return False
    if old.mode != new.mode:
        return False
    if old.history is not None or new.history is not None:  # rendered by the server
        return (old.history, old.turn) == (new.history, new.turn)
    return (old.input_ids, old.text, old.turn) == (new.input_ids, new.text, new.turn)


def conflict_message(name: str, state: DatasetResume, source: str) -> str:
    """One line: which finished samples of dataset `name` no longer match `source` (the data
    file), an example of each kind, and what to do."""
    parts = []
    if state.changed:
        parts.append(f"{len(state.changed)} finished samples were sent another prompt than the "
                     f"manifest builds now from {source} (e.g. sample_id {state.changed[0]!r}: "
                     "a changed row, chat template argument or tokenizer)")
    if state.removed:
        parts.append(f"{len(state.removed)} finished samples are no longer in {source} (e.g. "
                     f"sample_id {state.removed[0]!r})")
    return (f"dataset {name}: " + "; ".join(parts) + " (use --force to send them again with "
            "the new prompts, their records moved aside, or another --out)")


def check_settings(out: Path, previous: Mapping[str, Any], model: str,
                   loaded: Iterable[tuple[DatasetSpec, Sampling, list[Prompt]]]) -> None:
    """ResumeMismatch when run.json (`previous`, of the run in `out`) says another model or
    other sampling parameters than the `loaded` datasets' (spec, sampling, prompts)."""
    path = manifest_path(out)
    old_model = previous.get("model")
    if old_model and old_model != model:
        raise ResumeMismatch(
            f"{path}: the run was made with model {old_model!r}, the server now serves "
            f"{model!r} (use --force to resume anyway, or another --out)")
    entries = dataset_entries(previous)
    for spec, sampling, _prompts in loaded:
        entry = entries.get(spec.name, {})
        old, new = entry.get("sampling"), msgspec.to_builtins(sampling)
        if old is not None and old != new:
            raise ResumeMismatch(
                f"{path}: datasets.{spec.name}.sampling changed from {old} to {new} "
                "(use --force to resume anyway, or another --out)")
        if entry and entry.get("modes") != modes_record(spec):
            raise ResumeMismatch(
                f"{path}: datasets.{spec.name}.modes changed from {_modes_text(entry.get('modes'))} "
                f"to {_modes_text(modes_record(spec))} (use --force to resume anyway: finished "
                "samples keep the mode they were sent in, the rest are drawn towards the new "
                "weights; or another --out)")


def modes_record(spec: DatasetSpec) -> list[dict[str, Any]] | None:
    """The dataset's modes as run.json keeps them."""
    return [msgspec.to_builtins(mode) for mode in spec.mode_list()] or None


def _modes_text(modes: Any) -> str:
    """Modes as a message names them: ``think 0.75 {thinking: True}, direct 0.25 ...``."""
    if not isinstance(modes, list) or not modes:
        return "none"
    return ", ".join(f"{m.get('name')} {m.get('weight')} {m.get('chat_template_kwargs') or {}}"
                     + _sampling_text(m.get("sampling"))
                     for m in modes if isinstance(m, dict))


def _sampling_text(sampling: Any) -> str:
    if not isinstance(sampling, dict):
        return ""
    return f" sampling {({k: v for k, v in sampling.items() if v is not None})}"
