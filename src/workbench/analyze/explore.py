"""The report notebooks' API: a run's outputs shaped into the tables the reports show.

The notebooks call ``explore.<name>``, one function per section, and so do the copies of them
in users' job folders (``workbench init``): this module keeps those names in one place. It
defines nothing; each name lives in the module of its concern, where code inside the package
imports it from.

    workbench.analyze.frames      the run's header and one row per record
        run_overview, RunOverview       the report header: run.json facts, datasets, profile
        record_frame, RECORD_COLUMNS    one row per record: counts, finish reason, time,
                                        reasoning and answer tokens, turn and end of a
                                        conversation regenerated turn by turn
        log_axes, wants_log             whether a token axis should be logarithmic
        histogram, cdf                  token distributions per dataset
        sample_records                  a seeded sample of each dataset's rows
        filter_records                  the explorer's filters
        record_findings                 the per-record validation rules each record fails
    workbench.analyze.tables      per-dataset tables
        reasoning_summary               reasoning and answer tokens per dataset
        finish_mix                      finish reasons per dataset, with max_new_tokens
        budget_table, progress_state    targets, budgets, state, remaining tokens and time;
        RUNNING, DONE, BUDGET_REACHED   the states
        findings_table                  validation findings per dataset and rule
        findings_over_time,             per-record rule failures by record timestamp;
        MIN_BUCKET_RECORDS              a bucket with fewer records says little
    workbench.analyze.readback    records read back from the files and shown
        examples_table                  the findings' example records, with an excerpt
                                        (and the turn of a conversation's record)
        samples, Sample                 chosen records, their output decoded (or ids)
        record_detail, RecordDetail     one record in full
        search_replies                  the selected records whose decoded reply holds a text
    workbench.analyze.conversations  datasets regenerated turn by turn (``turns: each``)
        conversation_frames,            per dataset its conversations, turns per conversation,
        Conversations                   completion tokens by turn index, early ends by reason

Everything returns plain data (pandas frames, small frozen dataclasses);
:mod:`workbench.report.plots` draws it.
"""

from __future__ import annotations

from workbench.analyze.conversations import Conversations, conversation_frames
from workbench.analyze.frames import (
    RECORD_COLUMNS,
    RunOverview,
    cdf,
    filter_records,
    histogram,
    log_axes,
    record_findings,
    record_frame,
    run_overview,
    sample_records,
    wants_log,
)
from workbench.analyze.readback import (
    RecordDetail,
    Sample,
    examples_table,
    record_detail,
    samples,
    search_replies,
)
from workbench.analyze.tables import (
    BUDGET_REACHED,
    DONE,
    MIN_BUCKET_RECORDS,
    RUNNING,
    budget_table,
    findings_over_time,
    findings_table,
    finish_mix,
    progress_state,
    reasoning_summary,
)

__all__ = [
    "BUDGET_REACHED",
    "DONE",
    "MIN_BUCKET_RECORDS",
    "RECORD_COLUMNS",
    "RUNNING",
    "Conversations",
    "RecordDetail",
    "RunOverview",
    "Sample",
    "budget_table",
    "cdf",
    "conversation_frames",
    "examples_table",
    "filter_records",
    "findings_over_time",
    "findings_table",
    "finish_mix",
    "histogram",
    "log_axes",
    "progress_state",
    "reasoning_summary",
    "record_detail",
    "record_findings",
    "record_frame",
    "run_overview",
    "sample_records",
    "samples",
    "search_replies",
    "wants_log",
]
