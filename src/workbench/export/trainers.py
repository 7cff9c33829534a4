"""What each drafter trainer reads, and the manifest that ties its rows back to the run.

Both trainers take pre-tokenized JSONL rows `{"input_ids": [...], "loss_mask": [...]}` as they
are and keep nothing else of a row (SpecForge's `prepare_prompt_tasks` reads those two keys;
speculators' `prepare-data` drops every other column), so a `--for` export writes those two
fields (and, when every row is a turn of a conversation, `id` and `turn` before them, and
when every row has a mode, `mode`: extra keys are ignored when every row has them, but a key on some rows only, or null in the
first 10 MB and an int later, makes speculators' loader, HF datasets' JSON reader, fail
with "Couldn't cast ... column names don't match") and puts the rest in a manifest beside the file
(`<file>.manifest.json`): per row its dataset/sample_id, prompt and total length and a digest
of its ids (and its turn and mode when some row has one: the way back from a row a trainer
shuffled), per dataset the generation's chat template arguments, modes and sampling
parameters, the model, and the token-length
distribution. Rows longer than the trainer's `max_length` are cut to it; a cut row whose prompt
alone fills `max_length` has no supervised token left, and both trainers drop it silently.

    specforge     SpecForge 0.2.0 online training, `data.prompts_path` (JSON/JSONL only);
                  data.max_length defaults to 2048.
    speculators   vLLM speculators 0.9.0 `speculators prepare-data --data` (JSON/JSONL only);
                  --seq-length defaults to 8192.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeAlias

import msgspec
import numpy as np

from workbench.rundir.files import write_atomic

__all__ = [
    "TRAINERS",
    "LengthReport",
    "RowEntry",
    "Trainer",
    "TrainerName",
    "TrainerReport",
    "row_digest",
    "trainer_report",
    "write_manifest",
]

TrainerName: TypeAlias = Literal["specforge", "speculators"]
LENGTH_STEP = 256  # a fitting max_length is rounded up to a multiple of this


class Trainer(NamedTuple):
    name: TrainerName
    default_max_length: int
    length_key: str

    def command(self, path: Path, max_length: int, model: str) -> str:
        """The trainer's command line that reads `path` with `max_length`."""
        file = shlex.quote(str(path.resolve()))
        if self.name == "specforge":
            return (f"specforge train -c YOUR_CONFIG.yaml data.prompts_path={file} "
                    f"data.max_length={max_length}")
        out = shlex.quote(str(path.resolve().with_suffix("")) + ".prepared")
        return (f"speculators prepare-data --model {shlex.quote(model)} --data {file} "
                f"--output {out} --seq-length {max_length}")


TRAINERS: dict[str, Trainer] = {
    "specforge": Trainer("specforge", 2048, "data.max_length"),
    "speculators": Trainer("speculators", 8192, "--seq-length"),
}


class RowEntry(NamedTuple):
    """One written row: its id, dataset, prompt length, total length and ids digest; the
    generated turn of the conversation `id` (None outside ``turns: each`` datasets) and the
    record's mode (None outside datasets that mix modes)."""

    id: str
    dataset: str
    prompt: int
    total: int
    digest: str
    turn: int | None = None
    mode: str | None = None


_OPTIONAL_FIELDS = ("turn", "mode")  # a manifest names them only when some row has one


def row_digest(ids: Sequence[int]) -> str:
    """A short stable digest of a row's input_ids (int64 little-endian, blake2b-64)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()


class LengthReport(msgspec.Struct):
    """Token lengths of one dataset's rows (or all), and what a max_length does to them."""

    rows: int
    p50: int
    p90: int
    p99: int
    max: int
    cut: int
    dropped: int


class TrainerReport(msgspec.Struct):
    """What `max_length` does to the rows (per dataset and "all"), the command, the manifest;
    `at_default`: what the trainer's own default max_length would do to all rows."""

    trainer: str
    max_length: int
    fits: bool
    command: str
    manifest: str
    lengths: dict[str, LengthReport]
    length_key: str
    default_max_length: int
    at_default: LengthReport


def _lengths(entries: Sequence[RowEntry], max_length: int) -> LengthReport:
    totals = np.array([e.total for e in entries], dtype=np.int64)
    prompts = np.array([e.prompt for e in entries], dtype=np.int64)
    if not len(totals):
        return LengthReport(0, 0, 0, 0, 0, 0, 0)
    p50, p90, p99 = (int(v) for v in np.percentile(totals, [50, 90, 99], method="higher"))
    cut = int((totals > max_length).sum())
    dropped = int((prompts >= max_length).sum())
    return LengthReport(len(totals), p50, p90, p99, int(totals.max()), cut, dropped)


def fitting_length(entries: Sequence[RowEntry]) -> int:
    """The smallest multiple of LENGTH_STEP that holds every row (at least one step)."""
    longest = max((e.total for e in entries), default=1)
    return max(LENGTH_STEP, -(-longest // LENGTH_STEP) * LENGTH_STEP)


def trainer_report(
    trainer: Trainer, target: Path, entries: Sequence[RowEntry], datasets: Sequence[str],
    max_length: int | None, model: str,
) -> TrainerReport:
    """Length figures per dataset and overall; the command with a max_length that fits the
    rows, or with the given one (then `cut`/`dropped` count what it costs)."""
    length = max_length if max_length is not None else fitting_length(entries)
    by_dataset = {name: _lengths([e for e in entries if e.dataset == name], length)
                  for name in datasets}
    lengths = {**by_dataset, "all": _lengths(entries, length)}
    return TrainerReport(trainer.name, length, lengths["all"].cut == 0,
                         trainer.command(target, length, model), str(manifest_path(target)),
                         lengths, trainer.length_key, trainer.default_max_length,
                         _lengths(entries, trainer.default_max_length))


def manifest_path(target: Path) -> Path:
    return target.with_name(target.name + ".manifest.json")


def write_manifest(
    target: Path, report: TrainerReport, entries: Sequence[RowEntry],
    run: dict[str, Any], datasets: dict[str, dict[str, Any]], named: bool = False,
    modes: bool = False,
) -> Path:
    """`<target>.manifest.json` (written to a temporary name, then renamed). Its rows name
    a turn only when some row has one (a run with a ``turns: each`` dataset), a mode only
    when some row has one (a dataset that mixes modes); `fields` are the keys of the file's
    rows (`named`: each row names its conversation and turn; `modes`: each row its mode)."""
    fields = [name for name in RowEntry._fields if name not in _OPTIONAL_FIELDS
              or any(getattr(entry, name) is not None for entry in entries)]
    columns = [RowEntry._fields.index(name) for name in fields]
    keys = [*(("id", "turn") if named else ()), *(("mode",) if modes else ())]
    data = {
        "file": str(target.resolve()),
        "trainer": report.trainer,
        "fields": [*keys, "input_ids", "loss_mask"],
        "model": run,
        "max_length": report.max_length,
        "command": report.command,
        "lengths": msgspec.to_builtins(report.lengths),
        "datasets": datasets,
        "row_fields": fields,
        "rows": [[entry[i] for i in columns] for entry in entries],
    }
    head = json.dumps({k: v for k, v in data.items() if k != "rows"}, indent=2, ensure_ascii=False)
    rows = ",\n".join("  " + json.dumps(row, ensure_ascii=False) for row in data["rows"])
    text = f'{head[:-2]},\n  "rows": [\n{rows}\n  ]\n}}\n'
    path = manifest_path(target)
    write_atomic(path, text.encode())
    return path
