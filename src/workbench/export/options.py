"""What an export is asked for and what it did: the options, and per dataset the rows
written and the records dropped (by reason, in :data:`DROP_REASONS` order)."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

from workbench.analyze.rules import RECORD_RULES
from workbench.export.trainers import TrainerReport
from workbench.sketch import DEFAULT_TEMPLATE_SHARE, DEFAULT_THRESHOLD

__all__ = ["DROP_REASONS", "DatasetExport", "ExportFormat", "ExportOptions", "ExportSummary",
           "ReasoningCarry"]

ExportFormat: TypeAlias = Literal["tokens", "conversations"]

ReasoningCarry: TypeAlias = Literal["auto", "field", "inline"]

SampleId: TypeAlias = int | str

RUN_DROPS: dict[str, tuple[str, ...]] = {  # a --drop name -> the run-level rules it drops
    "duplicate": ("duplicate_reply",),
    "near_duplicate": ("duplicate_reply", "near_duplicate_reply"),
    "contaminated": ("contaminated_prompt", "contaminated_reply"),
}

DROP_REASONS: tuple[str, ...] = (
    "other_mode", "parse_error", "torn_line", "missing_field", "duplicate_sample_id", "orphan_response",
    *(rule for rule in RECORD_RULES if rule != "missing_field"), *RUN_DROPS,
    "prompt_tokens_mismatch", "earlier_turn_dropped", "limit",
)


class ExportOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What to export; the CLI flags map one to one onto these fields.

    `drop`: ids of validate.RECORD_RULES whose failing records are left out ("truncated"
    for --drop-truncated), or of :data:`RUN_DROPS`: replies equal to an earlier one
    ("duplicate"), equal or nearly equal ("near_duplicate"), prompts or replies holding an
    n-gram of a benchmark of `decontaminate`, by default the ones generate was given
    ("contaminated"; `benchmark_field` names the benchmark files' prompt field, `ngram` the
    n); `near_threshold` is the estimated Jaccard similarity of near duplicates,
    `template_share` the share of a dataset's prompts from which a shingle is template.
    `only_mode`: keep the records of these modes only (a dataset that mixes modes; the
    others are counted as ``other_mode``). `limit`: rows per dataset at most. `shuffle`: mix the rows of all
    datasets in an order drawn from `seed`. `tokenizer` overrides the manifest's (text
    prompts, conversations); `trust_remote_code` lets it run the directory's own code.
    `trainer` (--for): write the rows that trainer reads plus a manifest (trainers.py);
    `max_length`: count the rows it would cut instead of proposing one that fits.
    `reasoning`: conversations carry the reasoning as `reasoning_content` ("field"), in
    `content` between the model's think tags ("inline"), or per row the first of these two
    whose rendering with the chat template gives back the generated ids, else "field"
    ("auto"); `keep_truncated` keeps replies cut at max_new_tokens in conversations.
    """

    format: ExportFormat = "tokens"
    only: tuple[str, ...] = ()
    only_mode: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    limit: int | None = None
    shuffle: bool = False
    seed: int = 0
    model_profile: str | None = None
    tokenizer: str | None = None
    trust_remote_code: bool = False
    trainer: str | None = None
    max_length: int | None = None
    reasoning: ReasoningCarry = "auto"
    keep_truncated: bool = False
    decontaminate: tuple[str, ...] | None = None  # None: the run's (run.json), (): none
    benchmark_field: str | None = None  # None: the run's, else the first known field
    ngram: int | None = None  # None: the run's, else 13
    near_threshold: float = DEFAULT_THRESHOLD
    template_share: float = DEFAULT_TEMPLATE_SHARE

    def drop_rules(self) -> tuple[str, ...]:
        """The rules whose failing records are left out: conversations also leave out
        truncated replies (they cannot be a finished turn) unless `keep_truncated`."""
        if self.format == "conversations" and not self.keep_truncated:
            return tuple(dict.fromkeys((*self.drop, "truncated")))
        return self.drop


class DatasetExport(msgspec.Struct):
    """Rows written and records dropped (by reason) for one dataset; `trimmed` counts
    outputs whose prepended prompt-suffix ids were removed; `exact` (conversations) the rows
    whose re-rendering with the tokenizer's chat template gives back the generated ids;
    `modes` the rows written per mode (a dataset that mixes modes; {} otherwise)."""

    written: int = 0
    dropped: dict[str, int] = msgspec.field(default_factory=dict)
    trimmed: int = 0
    exact: int | None = None
    modes: dict[str, int] = msgspec.field(default_factory=dict)

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def wrote(self, mode: str | None) -> None:
        """Count a row written (of `mode`, None: without one)."""
        self.written += 1
        if mode is not None:
            self.modes[mode] = self.modes.get(mode, 0) + 1


class ExportSummary(msgspec.Struct):
    path: str
    format: ExportFormat
    rows: int
    seconds: float
    datasets: dict[str, DatasetExport]
    trainer: TrainerReport | None = None

    def to_builtins(self) -> dict[str, Any]:
        """The summary as JSON-ready dicts; a dataset's "modes" only when it mixes modes."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        for dataset in data["datasets"].values():
            if not dataset["modes"]:
                del dataset["modes"]
        return data
