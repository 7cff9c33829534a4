"""On-policy scores of a finished run: how likely the target model itself finds each reply.

A drafter learns the target model's own distribution, so a reply the target finds unlikely
(a high NLL) is a weak training example. ``workbench score OUT --server URL`` sends every
finished record (``stop`` or ``length``, output ids present) back to the server to be scored
without generating (SGLang's prefill-only request)::

    input_ids          prompt ids + the reply's output ids
    sampling_params    {"max_new_tokens": 0, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    return_logprob     true, top_logprobs_num K
    logprob_start_len  len(prompt ids) - 1

SGLang computes input logprobs from ``logprob_start_len`` on, each for the next token, and
publishes ``[None] + logprobs[:-1]`` (scheduler_output_processor_mixin
``_process_input_token_logprobs``): the entry at ``logprob_start_len`` itself has no value.
Starting one token before the reply makes the last ``len(reply)`` entries of
``meta_info.input_token_logprobs`` (``[logprob, token_id, text]``) and of
``input_top_logprobs`` (the top K ``[logprob, token_id, text]`` per position) those of the
reply's tokens, each given everything before it; their ids are checked against the reply's.
Input logprobs are the model's raw distribution (SGLang scales them by no temperature), so
the sampling keys only pin the server's own defaults.

Per record, one line of ``OUT/<dataset>/scores.jsonl`` (raw_responses.jsonl is never
touched)::

    sample_id   the record's
    nll         -mean of the reply tokens' logprobs (nats per token)
    entropy     mean over the reply's positions of the entropy of the top-K distribution,
                renormalised: a top-K estimate (the mass beyond the K most likely ids is
                left out), in nats
    tokens      the reply tokens scored
    top_k       K
    turn        the record's turn, on the lines of a conversation regenerated turn by turn
                (``turns: each``): one line per (sample_id, turn)

Resume-safe and incremental: a torn last line of scores.jsonl is put aside first
(``scores.jsonl.torn``), records whose (sample_id, turn) is already in it are skipped, and each score
is appended as one whole line when it arrives, so a second run scores only the records added
since. Skipped (counted per reason, not written, tried again by the next run): a record whose
prompt is not in prompts.jsonl; a text prompt when the run names no tokenizer, or when the
tokenized text is not the record's ``prompt_tokens`` long; prompt + reply as long as the
server's context (``context_length`` of ``/server_info`` or ``/model_info``, or
``max_req_input_len``); an empty reply. A request that fails is tried ``ATTEMPTS`` times
(never again for a 400) and then counted as failed; a server unreachable at the start is
:class:`~workbench.errors.ServerUnreachable`.

Output ids that repeat the prompt's last ids before the reply (some SGLang versions prepend
them: ``completion_tokens`` is then below ``len(output_ids)``) are left out, as the export
leaves them out.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from workbench.config import load_manifest
from workbench.errors import ConfigError, DataError, InputError, ProtocolError, RequestFailed
from workbench.rundir.appender import JsonlAppender, repair_torn_tail
from workbench.rundir.layout import SCORES_FILE, DatasetDir
from workbench.rundir.line_index import Key, LineSpan, index_keys, read_keys, span_reader
from workbench.rundir.lock import hold_score_lock
from workbench.rundir.reader import iter_blocks
from workbench.rundir.records import PromptRecord, Row, SampleId, is_finished
from workbench.rundir.run import RunInfo, load_run
from workbench.server.client import SGLangClient, parse_generate_reply, request_timeout
from workbench.tokenizer import load_tokenizer

__all__ = [
    "ATTEMPTS",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_TOP_K",
    "SCORES_FILE",
    "DatasetScores",
    "ScoreLine",
    "ScoreProgress",
    "ScoreSummary",
    "format_summary",
    "load_scores",
    "nll_and_entropy",
    "progress_view",
    "score_run",
    "score_run_async",
    "scores_path",
]

DEFAULT_CONCURRENCY = 32
DEFAULT_TOP_K = 20
ATTEMPTS = 3
RETRY_DELAYS = (0.5, 2.0)  # seconds before the 2nd and the 3rd attempt
REQUEST_TIMEOUT = 600.0  # seconds one scoring request may take
RAW_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}

SKIP_NO_PROMPT = "prompt not in prompts.jsonl"
SKIP_NO_TOKENIZER = "text prompt and the run names no tokenizer"
SKIP_MISMATCH = "tokenized text prompt is not the record's prompt_tokens long"
SKIP_EMPTY = "empty reply"


class ScoreLine(msgspec.Struct):
    """One line of scores.jsonl (keys in the module docstring)."""

    sample_id: SampleId
    nll: float
    entropy: float
    tokens: int
    top_k: int
    turn: int | msgspec.UnsetType = msgspec.UNSET


class DatasetScores(msgspec.Struct):
    """What a run of the scorer did to one dataset; `mean_nll` is over every line of its
    scores.jsonl afterwards (earlier runs' included), records weighing alike."""

    name: str
    scored: int = 0
    already: int = 0
    failed: int = 0
    skipped: dict[str, int] = msgspec.field(default_factory=dict)
    mean_nll: float | None = None
    first_failure: str | None = None

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


class ScoreSummary(msgspec.Struct):
    """What :func:`score_run` returns: one entry per dataset, in the run's order."""

    datasets: list[DatasetScores]
    top_k: int
    seconds: float = 0.0

    @property
    def scored(self) -> int:
        return sum(ds.scored for ds in self.datasets)

    @property
    def already(self) -> int:
        return sum(ds.already for ds in self.datasets)

    @property
    def failed(self) -> int:
        return sum(ds.failed for ds in self.datasets)

    @property
    def skipped(self) -> dict[str, int]:
        reasons: dict[str, int] = {}
        for ds in self.datasets:
            for reason, count in ds.skipped.items():
                reasons[reason] = reasons.get(reason, 0) + count
        return reasons


@dataclass(slots=True)
class ScoreProgress:
    """Live counters of one dataset, given to the progress callback as records are done."""

    name: str
    total: int
    scored: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def done(self) -> int:
        return self.scored + self.failed + self.skipped


OnProgress = Callable[[ScoreProgress], None]


# --------------------------------------------------------------------------- reading scores


def scores_path(dataset: DatasetDir | str | os.PathLike[str]) -> Path:
    """The dataset folder's scores.jsonl."""
    folder = dataset.folder if isinstance(dataset, DatasetDir) else Path(dataset)
    return folder / SCORES_FILE  # layout's name: the folder may be given as a path


_LINE_DECODER = msgspec.json.Decoder(ScoreLine)
SCORE_COLUMNS = ["sample_id", "nll", "entropy", "tokens"]


def load_scores(dataset_dir: DatasetDir | str | os.PathLike[str]) -> pd.DataFrame:
    """The dataset's scores (columns sample_id, nll, entropy, tokens, and turn when its
    lines have one), one row per (sample_id, turn) (its first line); empty when it has no
    scores.jsonl. A torn last line is left out; another bad line is a DataError naming the
    file and the line."""
    path = scores_path(dataset_dir)
    if not path.is_file():
        return pd.DataFrame({name: [] for name in SCORE_COLUMNS})
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1]:
        lines.pop()  # a torn last line: a scorer is writing it, or died writing it
    rows = [_score_row(path, number, text) for number, text in enumerate(lines, start=1)
            if text.strip()]
    if not any(row[-1] is not None for row in rows):
        frame = pd.DataFrame([row[:-1] for row in rows], columns=SCORE_COLUMNS)
        return frame.drop_duplicates("sample_id", keep="first").reset_index(drop=True)
    frame = pd.DataFrame(rows, columns=[*SCORE_COLUMNS, "turn"])
    frame["turn"] = frame["turn"].astype("Int64")
    return frame.drop_duplicates(["sample_id", "turn"], keep="first").reset_index(drop=True)


def _score_row(path: Path, number: int, text: bytes
               ) -> tuple[SampleId, float, float, int, int | None]:
    try:
        line = _LINE_DECODER.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DataError(path, f"not a score line: {exc}", number) from None
    turn = None if line.turn is msgspec.UNSET else line.turn
    return line.sample_id, line.nll, line.entropy, line.tokens, turn


# --------------------------------------------------------------------------- the math


def nll_and_entropy(
    logprobs: Sequence[float], tops: Sequence[Sequence[float]]
) -> tuple[float, float]:
    """(-mean of the chosen tokens' logprobs, mean entropy of each position's top-K logprobs
    renormalised to a distribution): both in nats."""
    return -math.fsum(logprobs) / len(logprobs), math.fsum(map(_entropy, tops)) / len(tops)


def _entropy(logprobs: Sequence[float]) -> float:
    peak = max(logprobs)
    weights = [math.exp(value - peak) for value in logprobs]
    total = math.fsum(weights)
    return max(0.0, -math.fsum(w / total * math.log(w / total) for w in weights if w > 0))


def _reply_ids(prompt: Sequence[int], output: list[int], completion: int | None) -> list[int]:
    """output without the k leading ids that repeat the prompt's last k ids, when
    len(output) exceeds `completion` by exactly such a k; else output unchanged."""
    if completion is None:
        return output
    extra = len(output) - completion
    if 0 < extra <= len(prompt) and output[:extra] == list(prompt[-extra:]):
        return output[extra:]
    return output


# --------------------------------------------------------------------------- the server side


class _Entry(msgspec.Struct, array_like=True):
    logprob: float | None
    token_id: int
    text: str | None = None


class _ScoreMeta(msgspec.Struct):
    input_token_logprobs: list[_Entry]
    input_top_logprobs: list[list[_Entry] | None] | None = None


class _ScoreReply(msgspec.Struct):
    meta_info: _ScoreMeta


def _context_limit(info: dict[str, Any], model_info: dict[str, Any]) -> int | None:
    """Inputs this long or longer are refused: the smallest of the server's context_length
    (/server_info, else /model_info) and max_req_input_len; None when neither says."""
    limits = [value for value in (info.get("context_length"), model_info.get("context_length"),
                                  info.get("max_req_input_len"))
              if type(value) is int and value > 0]
    return min(limits, default=None)


async def _server_limit(client: SGLangClient) -> int | None:
    """The context limit; ServerUnreachable when the server cannot be reached at all."""
    info = await client.server_info()
    try:
        model_info = await client.model_info()
    except RequestFailed:
        model_info = {}
    return _context_limit(info, model_info)


def _payload(prompt: Sequence[int], reply: Sequence[int], top_k: int) -> dict[str, Any]:
    """The prefill-only request that scores `reply` after `prompt` (module docstring)."""
    return {
        "input_ids": [*prompt, *reply],
        "sampling_params": {"max_new_tokens": 0, **RAW_SAMPLING},
        "return_logprob": True,
        "logprob_start_len": len(prompt) - 1,
        "top_logprobs_num": top_k,
    }


def _read_scores(data: Any, reply: Sequence[int], top_k: int, url: str) -> tuple[float, float]:
    """(nll, entropy) of `reply` from a decoded scoring reply; aborts raise as the client
    raises them, a reply of another shape is a ProtocolError."""
    parse_generate_reply(data, url, elapsed=0.0)
    try:
        meta = msgspec.convert(data, _ScoreReply).meta_info
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"scoring reply without input logprobs: {exc}", url) from None
    return nll_and_entropy(_chosen(meta, reply, url), _top_lists(meta, len(reply), top_k, url))


def _chosen(meta: _ScoreMeta, reply: Sequence[int], url: str) -> list[float]:
    """The logprobs of the reply's tokens: the last len(reply) input entries."""
    entries = meta.input_token_logprobs[-len(reply):]
    if [entry.token_id for entry in entries] != list(reply):
        raise ProtocolError("input_token_logprobs are not the reply's tokens", url)
    values: list[float] = []
    for entry in entries:
        if entry.logprob is None or not math.isfinite(entry.logprob):
            raise ProtocolError("a reply token has no finite logprob", url)
        values.append(entry.logprob)
    return values


def _top_lists(meta: _ScoreMeta, count: int, top_k: int, url: str) -> list[list[float]]:
    """The top-K logprobs at each of the reply's `count` positions."""
    tops = (meta.input_top_logprobs or [])[-count:]
    lists = [[entry.logprob for entry in top] for top in tops if top]
    if len(lists) != count or any(len(top) > top_k for top in lists):
        raise ProtocolError(f"input_top_logprobs are not {top_k} entries per reply token", url)
    values = [[value for value in top if value is not None and math.isfinite(value)]
              for top in lists]
    if not all(values):
        raise ProtocolError("a reply position has no finite top logprob", url)
    return values


# --------------------------------------------------------------------------- one dataset


@dataclass(slots=True)
class _Job:
    sample_id: SampleId
    prompt: list[int]
    reply: list[int]
    turn: int | None = None


class _Prompts:
    """prompts.jsonl read back by (sample_id, turn); text prompts tokenized with the run's
    tokenizer (loaded once, when the first is met)."""

    _decoder = msgspec.json.Decoder(PromptRecord)

    def __init__(self, run: RunInfo, ds: DatasetDir, read: Callable[[LineSpan], bytes]) -> None:
        self.run, self.ds, self.read = run, ds, read
        self.spans = index_keys(ds.prompts_path) if ds.prompts_path.is_file() else {}
        self._tokenizer: Any = None
        self._no_tokenizer: str | None = None

    def ids(self, row: Row) -> list[int] | str:
        """The prompt's ids, or why the record is skipped."""
        assert row.sample_id is not None
        span = self.spans.get(row.key)
        if span is None:
            return SKIP_NO_PROMPT
        try:
            prompt = self._decoder.decode(self.read(span))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return SKIP_NO_PROMPT
        if prompt.input_ids:
            return prompt.input_ids
        if not prompt.text:
            return SKIP_NO_PROMPT
        tokenizer = self.tokenizer()
        if tokenizer is None:
            return self._no_tokenizer or SKIP_NO_TOKENIZER
        ids = list(tokenizer.encode(prompt.text))
        return ids if len(ids) == row.prompt_tokens else SKIP_MISMATCH

    def tokenizer(self) -> Any:
        if self._tokenizer is None and self._no_tokenizer is None:
            path = self.ds.settings.get("tokenizer")
            if not isinstance(path, str):
                self._no_tokenizer = SKIP_NO_TOKENIZER
                return None
            try:
                self._tokenizer = load_tokenizer(path, trust_remote_code=self._trust())
            except ConfigError as exc:
                self._no_tokenizer = f"text prompt and no tokenizer ({exc})"
        return self._tokenizer

    def _trust(self) -> bool:
        """The manifest's trust_remote_code for the dataset (run.json does not keep it)."""
        source = self.run.manifest.get("manifest_file")
        if not isinstance(source, str):
            return False
        with contextlib.suppress(InputError, OSError):
            return load_manifest(source).dataset(self.ds.name).trust_remote_code
        return False


def _finished_rows(path: Path, *, with_output_ids: bool) -> Iterator[Row]:
    """The finished records of a raw file (a torn last line is left for the next run)."""
    if not path.is_file():
        return
    for block in iter_blocks(path, with_output_ids=with_output_ids):
        bad = {problem.line for problem in block.problems if problem.kind == "bad_type"}
        yield from (row for row in block.rows if is_finished(row, row.line not in bad))


def _pending(ds: DatasetDir, result: DatasetScores) -> dict[Key, None]:
    """The finished records not in scores.jsonl yet (counting those that are), in file order,
    each (sample_id, turn) once; scores.jsonl's torn last line put aside first."""
    path = scores_path(ds)
    repair_torn_tail(path)
    done, _ = read_keys(path) if path.is_file() else (set(), [])
    pending: dict[Key, None] = {}
    seen: set[Key] = set()
    for row in _finished_rows(ds.raw_path, with_output_ids=False):
        assert row.sample_id is not None
        key = (row.sample_id, row.turn)
        if key in seen:
            continue
        seen.add(key)
        if key in done:
            result.already += 1
        else:
            pending[key] = None
    return pending


class _DatasetScorer:
    """Scores one dataset's pending records with `concurrency` requests in flight."""

    def __init__(self, client: SGLangClient, ds: DatasetDir, result: DatasetScores, *,
                 top_k: int, limit: int | None, on_progress: OnProgress | None) -> None:
        self.client, self.ds, self.result = client, ds, result
        self.top_k, self.limit, self.on_progress = top_k, limit, on_progress
        self.progress = ScoreProgress(ds.name, 0)

    async def run(self, run: RunInfo, pending: dict[Key, None], concurrency: int) -> None:
        self.progress.total = len(pending)
        self._tell()
        if not pending:
            return
        queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=2 * concurrency)
        try:
            with JsonlAppender(scores_path(self.ds)) as out:
                async with asyncio.TaskGroup() as group:
                    for _ in range(concurrency):
                        group.create_task(self._work(queue, out))
                    group.create_task(self._feed(run, pending, queue, concurrency))
        except ExceptionGroup as failed:  # a write refused, or a bug: raised as itself
            raise failed.exceptions[0] from None

    async def _feed(self, run: RunInfo, pending: dict[Key, None],
                    queue: asyncio.Queue[_Job | None], workers: int) -> None:
        """Queue the pending records' jobs in file order, then one None per worker."""
        prompts_file = self.ds.prompts_path
        with span_reader(prompts_file) if prompts_file.is_file() else _no_reader() as read:
            prompts = _Prompts(run, self.ds, read)
            for row in _finished_rows(self.ds.raw_path, with_output_ids=True):
                if row.key in pending:
                    del pending[row.key]
                    job = self._job(row, prompts)
                    if isinstance(job, str):
                        self._skipped(job)
                    else:
                        await queue.put(job)
        for _ in range(workers):
            await queue.put(None)

    def _job(self, row: Row, prompts: _Prompts) -> _Job | str:
        """The record's scoring job, or why it is skipped."""
        assert row.sample_id is not None and row.output_ids is not None
        prompt = prompts.ids(row)
        if isinstance(prompt, str):
            return prompt
        reply = _reply_ids(prompt, row.output_ids, row.completion_tokens)
        if not reply:
            return SKIP_EMPTY
        if self.limit is not None and len(prompt) + len(reply) >= self.limit:
            return f"prompt + reply too long for the server's context ({self.limit} tokens)"
        return _Job(row.sample_id, prompt, reply, row.turn)

    def _skipped(self, reason: str) -> None:
        self.result.skip(reason)
        self.progress.skipped += 1
        self._tell()

    async def _work(self, queue: asyncio.Queue[_Job | None], out: JsonlAppender) -> None:
        while (job := await queue.get()) is not None:
            try:
                nll, entropy = await self._score(job)
            except RequestFailed as exc:
                self.result.failed += 1
                self.progress.failed += 1
                self.result.first_failure = (self.result.first_failure
                                             or f"sample {job.sample_id!r}{_turn_text(job.turn)}: {exc}")
            else:
                turn = msgspec.UNSET if job.turn is None else job.turn
                out.append(ScoreLine(job.sample_id, round(nll, 6), round(entropy, 6),
                                     len(job.reply), self.top_k, turn))
                self.result.scored += 1
                self.progress.scored += 1
            self._tell()

    async def _score(self, job: _Job) -> tuple[float, float]:
        """The job's (nll, entropy), tried up to ATTEMPTS times (a 400 once)."""
        payload = _payload(job.prompt, job.reply, self.top_k)
        for attempt in range(ATTEMPTS):
            try:
                data = await self.client.generate_json(payload)
                return _read_scores(data, job.reply, self.top_k, self.client.base_url)
            except RequestFailed as exc:
                if not exc.retryable or attempt + 1 == ATTEMPTS:
                    raise
            await asyncio.sleep(RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)])
        raise AssertionError("unreachable")

    def _tell(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)


def _turn_text(turn: int | None) -> str:
    return "" if turn is None else f" turn {turn}"


@contextlib.contextmanager
def _no_reader() -> Iterator[Callable[[LineSpan], bytes]]:
    """A span reader for a dataset without prompts.jsonl (no span is ever asked of it)."""
    def read(span: LineSpan) -> bytes:
        raise AssertionError(f"no prompts file to read {span}")

    yield read


# --------------------------------------------------------------------------- a whole run


async def score_run_async(
    out: str | os.PathLike[str],
    server: str,
    *,
    only: Sequence[str] = (),
    concurrency: int = DEFAULT_CONCURRENCY,
    top_k: int = DEFAULT_TOP_K,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    on_progress: OnProgress | None = None,
) -> ScoreSummary:
    """Score every finished, unscored record of run `out` (its datasets, or `only`) on
    `server` (module docstring). DataError / ConfigError for a bad run or option,
    ServerUnreachable when the server cannot be reached, StorageError when scores.jsonl
    cannot be written; failed requests are counted, never raised."""
    if concurrency < 1 or top_k < 1:
        key = "--concurrency" if concurrency < 1 else "--top-k"
        raise ConfigError(key, "must be at least 1")
    started = time.perf_counter()
    run = load_run(out, only)
    summary = ScoreSummary([DatasetScores(ds.name) for ds in run.datasets], top_k)
    with hold_score_lock(out):
        await _score(run, summary, server, api_key, transport, top_k, concurrency, on_progress)
    summary.seconds = time.perf_counter() - started
    return summary


async def _score(run: RunInfo, summary: ScoreSummary, server: str, api_key: str | None,
                 transport: httpx.AsyncBaseTransport | None, top_k: int, concurrency: int,
                 on_progress: OnProgress | None) -> None:
    async with SGLangClient(server, api_key=api_key, transport=transport,
                             timeout=request_timeout(REQUEST_TIMEOUT)) as client:
        limit = await _server_limit(client)
        for ds, result in zip(run.datasets, summary.datasets, strict=True):
            scorer = _DatasetScorer(client, ds, result, top_k=top_k, limit=limit,
                                    on_progress=on_progress)
            await scorer.run(run, _pending(ds, result), concurrency)
            scores = load_scores(ds)
            result.mean_nll = float(scores["nll"].mean()) if len(scores) else None


def score_run(
    out: str | os.PathLike[str],
    server: str,
    *,
    only: Sequence[str] = (),
    concurrency: int = DEFAULT_CONCURRENCY,
    top_k: int = DEFAULT_TOP_K,
    api_key: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    on_progress: OnProgress | None = None,
) -> ScoreSummary:
    """:func:`score_run_async` run to the end on its own event loop."""
    return asyncio.run(score_run_async(
        out, server, only=only, concurrency=concurrency, top_k=top_k, api_key=api_key,
        transport=transport, on_progress=on_progress))


# --------------------------------------------------------------------------- what is shown


def format_summary(summary: ScoreSummary) -> str:
    """One line: `scored 40 (12 already), failed 0, skipped 2 (empty reply: 2); mean nll:
    ids 2.041, chat 1.873` (a failure's first message after it)."""
    line = f"scored {summary.scored} ({summary.already} already), failed {summary.failed}"
    skipped = summary.skipped
    if skipped:
        reasons = "; ".join(f"{reason}: {count}" for reason, count in skipped.items())
        line += f", skipped {sum(skipped.values())} ({reasons})"
    means = ", ".join(f"{ds.name} {ds.mean_nll:.3f}" if ds.mean_nll is not None
                      else f"{ds.name} -" for ds in summary.datasets)
    line += f"; mean nll: {means}"
    failure = next((ds.first_failure for ds in summary.datasets if ds.first_failure), None)
    return line + (f"; first failure: {failure}" if failure else "")


class _ProgressBars:
    """One rich bar per dataset, started with its first update (so a run that fails before
    scoring draws nothing)."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(TextColumn("{task.fields[name]}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                                 console=console)
        self.tasks: dict[str, TaskID] = {}

    def update(self, state: ScoreProgress) -> None:
        if not self.tasks:
            self.progress.start()
        note = f"{state.failed} failed, {state.skipped} skipped"
        task = self.tasks.get(state.name)
        if task is None:
            task = self.tasks[state.name] = self.progress.add_task(
                "", total=state.total, name=state.name, note=note)
        self.progress.update(task, completed=state.done, total=state.total, note=note)

    def stop(self) -> None:
        if self.tasks:
            self.progress.stop()


@contextlib.contextmanager
def progress_view(console: Console) -> Iterator[OnProgress]:
    """A progress callback drawing one bar per dataset on `console` (the CLI's stderr)."""
    bars = _ProgressBars(console)
    try:
        yield bars.update
    finally:
        bars.stop()

