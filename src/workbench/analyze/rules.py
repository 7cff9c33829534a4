"""The format rules: their ids and severities, and the per-record rules of a model profile.

Each rule has a stable id and a default severity (:data:`SEVERITY`, the one table of them).
Rules that are a matter of degree become errors above a rate (:class:`Thresholds`): a few
truncated replies are normal, a tenth of them means ``max_new_tokens`` is too small.

    rule                  default   what it counts (file)
    parse_error           error     lines that are not JSON objects (raw, prompts)
    torn_line             warning   a last line without newline: a writer died or is writing
    missing_field         error     records where a contract field cannot be read (flat records
                                    need every field; older layouts the ids, counts and finish)
    legacy_layout         info      records in the chat-completions or meta_info layout
    bad_type              error     lines whose known fields hold the wrong type
    duplicate_sample_id   error     a sample_id seen before in the same file (raw, prompts);
                                    of a conversation regenerated turn by turn, the same
                                    (sample_id, turn): its other turns are no duplicates
    missing_response      warning   a prepared prompt with no record (prompts)
    no_records            error     a dataset with prepared prompts and not one record: every
                                    prompt failed (its errors.jsonl says why), or none was sent
    unsent_budget         info      a prepared prompt with no record in a dataset whose
                                    max_tokens budget stopped it (run.json budget_reached)
    orphan_response       warning   a record whose sample_id (and turn) is not a prepared prompt
    missing_turn          warning   a conversation regenerated turn by turn whose turns have a
                                    gap: a record of turn n, none of an earlier turn
    no_prompts            warning   prompts.jsonl is absent: the two rules above cannot run
    prompt_tokens_mismatch error    a record whose prompt_tokens differs from the ids of its
                                    prompt in prompts.jsonl: the server cut or changed the prompt
                                    (SGLang --allow-auto-truncate), so the reply answers another
                                    prompt than the one kept (see below)
    turn_prompt_mismatch  error     a turn of a conversation regenerated turn by turn whose
                                    prompt is not the chat template's rendering of its history
                                    (the data row and the model's earlier turns): validate
                                    only, :mod:`workbench.analyze.turn_prompts`
    token_count_mismatch  warning   completion_tokens != len(output_ids); some SGLang versions
                                    prepend prompt-suffix ids, so the example gives the difference
    truncated             warning   finish_reason "length"; error above truncated_error_rate.
                                    The example says when the cut fell inside the reasoning.
    context_reduced       info      a record generated with max_new_tokens cut for its prompt to
                                    fit the context (context_fit: reduce_generation); one that
                                    ends with "length" is also `truncated`
    empty_output          warning   no output ids, or only end ids
    aborted               warning   finish_reason "abort"
    reasoning_unclosed    warning   a reply that ended (not "length", not "abort") with no
                                    think-end id; a reply cut by "length" inside its reasoning
                                    is `truncated`, not this
    empty_answer          warning   nothing between the think-end id and the end id (or the
                                    end of a reply that ended)
    stray_think_start     warning   more think-start ids than the template allows: none when
                                    the template opens the reasoning (Kimi), one otherwise (Qwen3)
    stray_think_end       warning   more than one think-end id
    id_out_of_vocab       error     an output id outside [0, vocab_size)
    (duplicates and contamination across the run: :mod:`workbench.analyze.quality`)
    repetition            warning   a reply stuck in a loop: the share of its ids inside an
                                    n-gram (repetition_ngram, 10) that occurs at least twice
                                    in its part (the reasoning, or the answer: an answer that
                                    restates the reasoning is no loop) is repetition_share
                                    (0.5) or more; the example gives the share
    special_heavy         warning   a reply whose special ids (the profile's special_start on,
                                    the think, end, eos and tool-call ids aside) are
                                    special_share (0.2) of its ids or more, at least 4 of them
    mode_mismatch         warning   a record of a mode (a dataset that mixes modes) whose ids
                                    contradict it: its mode switched thinking off and the reply
                                    holds a think-end or think-start id, or its mode reasons and
                                    a reply that finished ("stop") holds no think-end id; the
                                    finding gives each mode's count of its records; error when
                                    a mode's rate passes mode_mismatch_error_rate

`prompt_tokens_mismatch` compares only prompts sent as token ids (``input: input_ids``, and
``messages``, which the workbench tokenizes itself): prompts.jsonl holds their ids. A text
prompt (``input: text``) is tokenized by the server, so its length is not known here and its
records are not compared; neither is any record when prompts.jsonl mixes text and ids. It is
an error whatever the rate: such a record pairs a reply with a prompt the model never saw,
which is wrong training data, not a matter of degree.

A reply whose reasoning never reaches an answer is told by the reasoning rules below (a
finished reply with no think-end id, `reasoning_unclosed`; nothing after it, `empty_answer`)
and by `truncated`, whose example says when the cut fell inside the reasoning.

The reasoning rules run when the model profile has a think-end id and the record's
chat-template arguments did not switch thinking off (they set the profile's thinking argument
to false): the dataset's ``chat_template_kwargs``, and in a dataset that mixes modes the
record's mode's over them (:func:`mode_reasoning`), so a record of a thinking-off mode is all
answer and is never `reasoning_unclosed`. Per-record rules live in :class:`RecordChecker`
(:func:`dataset_checker` builds a dataset's), which the export's filters use too.

The run-level findings (counts, rates, examples, escalation) are :mod:`workbench.analyze.findings`;
the one pass over a run is :mod:`workbench.analyze.scan`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple, TypeAlias

import msgspec
import numpy as np

from workbench import sketch
from workbench.analyze.id_facts import id_facts
from workbench.profiles import ModelProfile, reasoning_expected
from workbench.rundir.figures import FigureStore, ReplyFigures, reply_figures
from workbench.rundir.id_arrays import IdArrays, of_lists
from workbench.rundir.layout import DatasetDir
from workbench.rundir.line_index import key_text
from workbench.rundir.records import Row, missing_fields

__all__ = [
    "PROBLEM_RULES",
    "PROMPT_RULES",
    "RECORD_RULES",
    "RULE_BITS",
    "SEVERITY",
    "RecordChecker",
    "Severity",
    "Thresholds",
    "counted_over",
    "dataset_checker",
    "failed_rules",
    "mode_reasoning",
    "reasoning_expected",
    "record_failures",
    "record_problems",
    "rule_bit",
]

Severity: TypeAlias = Literal["error", "warning", "info"]
Reply: TypeAlias = "Sequence[int] | np.ndarray | None"  # a row's output ids (None: it has none)

SEVERITY: dict[str, Severity] = {
    "parse_error": "error",
    "torn_line": "warning",
    "missing_field": "error",
    "legacy_layout": "info",
    "bad_type": "error",
    "duplicate_sample_id": "error",
    "missing_response": "warning",
    "no_records": "error",
    "unsent_budget": "info",
    "orphan_response": "warning",
    "missing_turn": "warning",
    "no_prompts": "warning",
    "prompt_tokens_mismatch": "error",
    "turn_prompt_mismatch": "error",
    "token_count_mismatch": "warning",
    "truncated": "warning",
    "context_reduced": "info",
    "empty_output": "warning",
    "aborted": "warning",
    "reasoning_unclosed": "warning",
    "empty_answer": "warning",
    "stray_think_start": "warning",
    "stray_think_end": "warning",
    "id_out_of_vocab": "error",
    "repetition": "warning",
    "special_heavy": "warning",
    "mode_mismatch": "warning",
    "duplicate_prompt": "warning",
    "near_duplicate_prompt": "info",
    "duplicate_reply": "warning",
    "near_duplicate_reply": "info",
    "contaminated_prompt": "warning",
    "contaminated_reply": "warning",
}

_OVER_PROMPTS = ("missing_response", "unsent_budget")


def counted_over(rule: str) -> Literal["prompts", "records"]:
    """What a rule's count (and rate) is out of: the dataset's prepared prompts for a
    prompt without a record (`missing_response`, `unsent_budget`: more than the records,
    whose ids are prompts.jsonl's) and the rules of prompts (``*_prompt``); else its records."""
    return "prompts" if rule in _OVER_PROMPTS or rule.endswith("_prompt") else "records"


RECORD_RULES: tuple[str, ...] = (
    "missing_field",
    "token_count_mismatch",
    "truncated",
    "aborted",
    "empty_output",
    "id_out_of_vocab",
    "reasoning_unclosed",
    "stray_think_end",
    "empty_answer",
    "stray_think_start",
    "context_reduced",
    "repetition",
    "special_heavy",
    "mode_mismatch",  # new rules go last: the bits of the rules before them keep their meaning
)

PROBLEM_RULES = {"malformed": "parse_error", "not_object": "parse_error",
                  "bad_type": "bad_type", "torn": "torn_line"}

PROMPT_RULES = {**PROBLEM_RULES, "no_id": "missing_field",
                 "duplicate_id": "duplicate_sample_id"}  # prompt_scan's problem kinds


class Thresholds(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Rates (share of a dataset's records, or prompts for missing_response) above which a
    rule is an error whatever its default severity; 1.0 never escalates. The last three are
    the per-record limits of the degeneracy rules: `repetition` when the share of a reply's
    ids inside a repeated `repetition_ngram`-gram reaches `repetition_share`,
    `special_heavy` when its special ids reach `special_share` of it.
    `near_duplicate_threshold` is the estimated Jaccard similarity from which two replies are
    near duplicates, `near_duplicate_prompt_threshold` two prompts, compared without their
    dataset's template: the shingles `template_share` of its prompts hold
    (:mod:`workbench.sketch.template`, :mod:`workbench.analyze.quality`)."""

    truncated_error_rate: float = 0.05
    empty_output_error_rate: float = 0.01
    aborted_error_rate: float = 0.01
    reasoning_unclosed_error_rate: float = 0.02
    empty_answer_error_rate: float = 0.02
    stray_think_start_error_rate: float = 0.02
    stray_think_end_error_rate: float = 0.02
    token_count_mismatch_error_rate: float = 1.0
    missing_response_error_rate: float = 1.0
    orphan_response_error_rate: float = 1.0
    repetition_error_rate: float = 0.05
    special_heavy_error_rate: float = 0.05
    mode_mismatch_error_rate: float = 0.02
    max_examples: int = 5
    repetition_share: float = 0.5
    repetition_ngram: int = sketch.DEFAULT_REPEAT_NGRAM
    special_share: float = 0.2
    near_duplicate_threshold: float = sketch.DEFAULT_THRESHOLD
    near_duplicate_prompt_threshold: float = sketch.PROMPT_THRESHOLD
    template_share: float = sketch.DEFAULT_TEMPLATE_SHARE

    def record_limits(self) -> tuple[float, int, float]:
        """What the per-record degeneracy rules depend on (a cached scan's key holds them)."""
        return self.repetition_share, self.repetition_ngram, self.special_share

    def error_rate(self, rule: str) -> float | None:
        """The escalation rate of rule, or None when it has none."""
        value = getattr(self, f"{rule}_error_rate", None)
        return value if isinstance(value, float) else None


_ENDED_EARLY = ("length", "abort")


class IdStats(NamedTuple):
    """Per-row facts about the output ids of a batch of rows, found with a few array passes.

    Positions are within the row's ids; -1 when absent. `after_end` is the id right after the
    first think-end id (-1 when there is none); the think ids are looked for only when the
    checker needs them (:attr:`RecordChecker.think_facts`), else counted 0 and found -1.
    `repeat` is the share of the row's ids inside a repeated n-gram, `special` the number of
    its special ids (see the module docstring); `flat` the batch's ids in one array, for the
    checks that follow the rules, and `replies` each row's ids (a list, or a view of `flat`).
    """

    bad_vocab: list[int]
    end_count: list[int]
    end_first: list[int]
    after_end: list[int]
    start_count: list[int]
    repeat: list[float]
    special: list[int]
    flat: _Flat
    replies: list[Reply]
    figures: ReplyFigures | None = None  # the data-quality figures, when asked for


class _Flat(IdArrays):
    """The ids of a batch of rows in one array (row i holds ids[starts[i]:ends[i]]), and
    the per-row facts the rules draw from it."""

    @classmethod
    def of(cls, rows: Sequence[Row], ids: IdArrays | None) -> tuple[_Flat, list[Reply]]:
        """The rows' ids in one array (`ids`, the reader's, else built from their lists) and
        each row's ids: its list, else (read into `ids`) its view, None when it has none."""
        if ids is None:
            replies: list[Reply] = [row.output_ids for row in rows]
            return cls(*of_lists(replies)), replies
        flat = cls(*ids)
        replies = [row.output_ids if row.output_ids is not None
                   else flat.ids[start:end] if row.has_output_ids else None
                   for row, start, end in zip(rows, flat.starts.tolist(), flat.ends.tolist(),
                                              strict=True)]
        return flat, replies


def _id_stats(flat: _Flat, replies: list[Reply], checker: RecordChecker, *,
              figures: bool = False, known: FigureStore | None = None) -> IdStats:
    """The facts about the rows' ids; with `figures`, their data-quality figures too (those
    `known` holds taken from it)."""
    ids, n = flat.ids, len(replies)
    profile = checker.profile
    facts = id_facts(ids, flat.starts, flat.ends, vocab_size=checker.vocab_size,
                     think_end=profile.think_end if checker.think_facts else None,
                     think_start=profile.think_start, special_start=profile.special_start,
                     not_special=checker.not_special)
    split = facts.end_first if checker.splits else np.full(n, -1)
    ngram = checker.repetition_ngram
    quality = (reply_figures(ids, flat.starts, flat.ends, split, ngram, known) if figures
               else None)
    repeat = (quality.repeat if quality is not None else sketch.row_figures(
        ids, flat.starts, flat.ends, split, ngram, num_perm=0).repeat)
    return IdStats(facts.bad_vocab.tolist(), facts.end_count.tolist(), facts.end_first.tolist(),
                   facts.after_end.tolist(), facts.start_count.tolist(), repeat.tolist(),
                   facts.special.tolist(), flat, replies, quality)


class RecordChecker:
    """The per-record rules for one model profile; rows must be read with output ids.

    `reasoning` False skips the reasoning rules (thinking switched off) of the records
    without a mode; `modes` maps each mode of a dataset that mixes them to whether its
    replies reason (:func:`mode_reasoning`): a record of a mode follows its mode's (one it
    does not name, `reasoning`), and is checked against it (`mode_mismatch`). `vocab_size`
    defaults to the profile's. :meth:`check_rows` looks at the ids of a batch of rows with a
    few numpy passes (no Python loop over ids); the rules themselves are
    :meth:`_row_problems`, written once for validation and the export's filters.

    `splits`: whether replies are split at the think-end id for the repeated-n-gram share
    (some record reasons; as generate keeps the reply figures), `think_facts` whether the
    think ids are looked for at all (some record reasons, or there are modes to check).
    """

    def __init__(
        self, profile: ModelProfile, *, vocab_size: int | None = None, reasoning: bool = True,
        modes: Mapping[str, bool] | None = None, thresholds: Thresholds | None = None,
    ) -> None:
        limits = thresholds or Thresholds()
        self.repetition_share, self.repetition_ngram, self.special_share = limits.record_limits()
        self.profile = profile
        self.vocab_size = vocab_size if vocab_size is not None else profile.vocab_size
        thinks = profile.think_end is not None
        self.reasoning = reasoning and thinks
        self.modes = {name: expected and thinks for name, expected in (modes or {}).items()}
        self.splits = any(self.modes.values()) if self.modes else self.reasoning
        self.think_facts = thinks and (self.reasoning or bool(self.modes))
        ends = (*profile.end_ids, *(() if profile.eos_id is None else (profile.eos_id,)))
        self.end_ids = frozenset(ends)
        self.starts_allowed = 0 if profile.think_in_template else 1
        expected = (*ends, profile.think_start, profile.think_end, *profile.reply_special_ids)
        self.not_special = np.array([i for i in expected if i is not None], dtype=np.int64)

    def reasoning_of(self, mode: str | None) -> bool:
        """Whether a reply of `mode` (None: no mode) should hold reasoning."""
        return self.reasoning if mode is None else self.modes.get(mode, self.reasoning)

    def settings(self) -> tuple[object, ...]:
        """What the rules' verdicts depend on beyond the limits (a cached scan's key)."""
        return self.profile, self.vocab_size, self.reasoning, tuple(sorted(self.modes.items()))

    def failures(self, row: Row) -> set[str]:
        """The ids of the per-record rules row fails."""
        return {rule for rule, _ in self.problems(row)}

    def problems(self, row: Row) -> list[tuple[str, str]]:
        """(rule, detail) for every per-record rule row fails, in RECORD_RULES order."""
        return self.check_rows([row])[0]

    def check_rows(self, rows: Sequence[Row]) -> list[list[tuple[str, str]]]:
        """The problems of each row (see :meth:`problems`), the ids of all checked at once."""
        return self._check(rows)[0]

    def _check(self, rows: Sequence[Row], *, figures: bool = False,
               known: FigureStore | None = None, ids: IdArrays | None = None,
               ) -> tuple[list[list[tuple[str, str]]], IdStats]:
        """The problems of each row and the facts about their ids (with `figures`, their
        data-quality figures too, those `known` holds taken from it). `ids`: the rows'
        output ids as the reader gave them in one array (else their lists are read)."""
        flat, replies = _Flat.of(rows, ids)
        stats = _id_stats(flat, replies, self, figures=figures, known=known)
        return [self._row_problems(row, stats, index) for index, row in enumerate(rows)], stats

    def split(self, ids: Reply, end_first: int, mode: str | None = None,
              ) -> tuple[int | None, int | None, bool | None]:
        """(reasoning tokens, answer tokens, closed) of one reply (of `mode`) whose first
        think-end id is at end_first (-1: none). Ids before it are reasoning, ids after it
        the answer; trailing end ids count in neither. Without reasoning (the profile's, or
        the record's mode switched thinking off) the whole reply is answer."""
        if ids is None:
            return None, None, None
        body = len(ids)
        while body and ids[body - 1] in self.end_ids:
            body -= 1
        if not self.reasoning_of(mode):
            return 0, body, None
        if end_first < 0:
            return body, 0, False
        return end_first, max(0, body - end_first - 1), True

    def _row_problems(self, row: Row, stats: IdStats, i: int) -> list[tuple[str, str]]:
        found = self._reply_problems(row, stats, i)
        reduced = row.max_new_tokens_reduced
        if reduced is not None:
            detail = f"sample_id {row.sample_id!r}: max_new_tokens cut to {reduced} to fit the context"
            found.append(("context_reduced", detail))
        if row.mode is not None and self.think_facts:
            mismatch = self._mode_mismatch(row, stats, i)
            if mismatch is not None:
                detail = f"{key_text(row.sample_id, row.turn)}: mode {row.mode!r} {mismatch}"
                found.append(("mode_mismatch", detail))
        return found

    def _mode_mismatch(self, row: Row, stats: IdStats, i: int) -> str | None:
        """How the reply contradicts its mode (None when it does not, or holds nothing
        but end ids: `empty_output` tells that)."""
        ids = stats.replies[i]
        if ids is None or self._is_empty(ids):
            return None
        end, start = self.profile.think_end, self.profile.think_start
        if not self.reasoning_of(row.mode):
            if stats.end_count[i]:
                return (f"switched thinking off, but the reply holds think-end id {end} "
                        f"(at {stats.end_first[i]} of {len(ids)} ids)")
            if start is not None and stats.start_count[i]:
                return (f"switched thinking off, but the reply holds think-start id {start} "
                        f"(at {_position(ids, start)} of {len(ids)} ids)")
            return None
        if row.finish_reason == "stop" and stats.end_first[i] < 0:
            return (f"reasons, but the reply finished (stop) after {len(ids)} ids with no "
                    f"think-end id {end}")
        return None

    def _reply_problems(self, row: Row, stats: IdStats, i: int) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        missing = missing_fields(row)
        if missing:
            found.append(("missing_field", "cannot read " + ", ".join(missing)))
        ids = stats.replies[i]
        finish = row.finish_reason
        if ids is not None and row.completion_tokens is not None and len(ids) != row.completion_tokens:
            found.append(("token_count_mismatch", _count_detail(len(ids), row.completion_tokens)))
        if finish == "length":
            found.append(("truncated", self._truncated_detail(ids, stats.end_first[i], row.mode)))
        elif finish == "abort":
            found.append(("aborted", f"finish_reason abort after {_count(ids)} ids"))
        if ids is None or self._empty(ids, found):
            return found
        if stats.bad_vocab[i] >= 0:
            position = stats.bad_vocab[i]
            detail = (f"output_ids[{position}] = {int(ids[position])} outside "
                      f"[0, {self.vocab_size}) of {self.profile.name}")
            found.append(("id_out_of_vocab", detail))
        if self.reasoning_of(row.mode):
            self._reasoning_problems(ids, finish, stats, i, found)
        self._degeneracy_problems(ids, stats, i, found)
        return found

    def _degeneracy_problems(
        self, ids: Sequence[int], stats: IdStats, i: int, found: list[tuple[str, str]]
    ) -> None:
        share = stats.repeat[i]
        if share >= self.repetition_share and share > 0:
            detail = f"{share:.0%} of {len(ids)} ids inside a repeated {self.repetition_ngram}-gram"
            found.append(("repetition", detail))
        special = stats.special[i]
        if special >= 4 and special >= self.special_share * len(ids):
            detail = f"{special} special ids of {len(ids)} ({special / len(ids):.0%})"
            found.append(("special_heavy", detail))

    def _is_empty(self, ids: Sequence[int]) -> bool:
        """Whether the ids hold nothing but end ids (at most 4 of them)."""
        return len(ids) == 0 or (len(ids) <= 4 and self.end_ids.issuperset(_listed(ids)))

    def _empty(self, ids: Sequence[int], found: list[tuple[str, str]]) -> bool:
        """Record empty_output; True when the ids hold nothing but end ids."""
        if not self._is_empty(ids):
            return False
        found.append(("empty_output", f"output_ids {_listed(ids)}"))
        return True

    def _truncated_detail(self, ids: Reply, end_first: int, mode: str | None) -> str:
        detail = f"finish_reason length after {_count(ids)} ids"
        if self.reasoning_of(mode) and ids is not None and end_first < 0:
            detail += ", inside the reasoning (no think-end id)"
        return detail

    def _reasoning_problems(
        self, ids: Sequence[int], finish: str | None, stats: IdStats, i: int,
        found: list[tuple[str, str]],
    ) -> None:
        end, start = self.profile.think_end, self.profile.think_start
        assert end is not None
        first, ended = stats.end_first[i], finish not in _ENDED_EARLY
        if first < 0 and ended:
            detail = f"finish_reason {finish} after {len(ids)} ids, no think-end id {end}"
            found.append(("reasoning_unclosed", detail))
        if stats.end_count[i] > 1:
            detail = (f"{stats.end_count[i]} think-end ids {end} "
                      f"(at {first} and {_position(ids, end, first + 1)})")
            found.append(("stray_think_end", detail))
        if first >= 0 and ended and (stats.after_end[i] < 0 or stats.after_end[i] in self.end_ids):
            detail = f"nothing after the think-end id at {first} of {len(ids)} ids"
            found.append(("empty_answer", detail))
        if start is not None and stats.start_count[i] > self.starts_allowed:
            detail = (f"{stats.start_count[i]} think-start ids {start} (first at "
                      f"{_position(ids, start)}), the template allows {self.starts_allowed}")
            found.append(("stray_think_start", detail))


def _count_detail(length: int, completion: int) -> str:
    diff = length - completion
    hint = " (prepended prompt-suffix ids?)" if diff > 0 else ""
    return f"len(output_ids) {length} vs completion_tokens {completion} ({diff:+d}){hint}"


def _count(ids: Reply) -> str:
    return "?" if ids is None else str(len(ids))


def _listed(ids: Sequence[int]) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


def _position(ids: Sequence[int], value: int, start: int = 0) -> int:
    """Where value first is in ids from start (it is there)."""
    if isinstance(ids, np.ndarray):
        return start + int(np.flatnonzero(ids[start:] == value)[0])
    return ids.index(value, start)


@functools.lru_cache(maxsize=32)
def _checker(profile: ModelProfile, vocab_size: int | None, reasoning: bool) -> RecordChecker:
    return RecordChecker(profile, vocab_size=vocab_size, reasoning=reasoning)


def record_problems(
    row: Row, profile: ModelProfile, vocab_size: int | None = None, *, reasoning: bool = True
) -> list[tuple[str, str]]:
    """(rule, detail) for each per-record rule row (read with output ids) fails."""
    return _checker(profile, vocab_size, reasoning).problems(row)


def record_failures(
    row: Row, profile: ModelProfile, vocab_size: int | None = None, *, reasoning: bool = True
) -> set[str]:
    """The ids of the per-record rules row (read with output ids) fails."""
    return _checker(profile, vocab_size, reasoning).failures(row)


def mode_reasoning(ds: DatasetDir, profile: ModelProfile) -> dict[str, bool]:
    """Per mode of a dataset that mixes modes (run.json), whether its replies should hold
    reasoning: its chat-template arguments over the dataset's; {} for a dataset without."""
    return {mode["name"]: reasoning_expected(profile, ds.template_kwargs(mode["name"]))
            for mode in ds.modes}


def dataset_checker(
    ds: DatasetDir, profile: ModelProfile, vocab_size: int | None = None,
    thresholds: Thresholds | None = None,
) -> RecordChecker:
    """The per-record rules of a dataset's records: reasoning as its chat-template arguments
    say, per mode in a dataset that mixes modes."""
    return RecordChecker(profile, vocab_size=vocab_size,
                         reasoning=reasoning_expected(profile, ds.chat_template_kwargs),
                         modes=mode_reasoning(ds, profile), thresholds=thresholds)


RULE_BITS = {rule: 1 << index for index, rule in enumerate(RECORD_RULES)}


def failed_rules(mask: int) -> list[str]:
    """The per-record rules of a :class:`~workbench.rundir.columns.Columns` ``failed`` mask."""
    return [rule for rule, bit in RULE_BITS.items() if mask & bit]


def rule_bit(rule: str) -> int:
    """The bit of a per-record rule in a ``failed`` mask (see :func:`failed_rules`)."""
    return RULE_BITS[rule]
