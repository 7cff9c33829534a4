"""One prompt sent until its reply is on disk or it failed for good: its attempts.

:meth:`Attempts.work` is one request's whole life in a run (a task of the
:class:`~workbench.generate.feed.Feeder`); it holds one of the run's slots only while an
attempt runs:

- Payload: the dataset's sampling parameters, the prompt's ids (else its text) and a
  ``rid`` naming the dataset, the sample and the attempt.
- Retries: exponential backoff with jitter for retryable errors, up to ``max_attempts``;
  every failed attempt is an ``errors.jsonl`` line (a failed request is data, never a crash
  of the run). A bad request is not retried, except a refusal for length under
  ``context_fit: reduce_generation``: sent again once, at once, with ``max_new_tokens`` cut
  to fit the context (:mod:`workbench.generate.context_fit`).
- Outage: a connection failure closes the run's outage gate
  (:func:`~workbench.generate.servers.server_gate`), and every attempt waits at it until
  the server answers again, so an outage does not spend the prompts' attempts (the
  requests it cut are sent again without spending one, up to ``MAX_CONNECTION_LOSSES``
  times each; each is still an ``errors.jsonl`` line).
- Deadline: an attempt that has no whole reply after ``request_timeout`` seconds (however
  slowly its bytes trickle in) fails as a timeout, and the server is asked to abort it
  (``/abort_request`` with the request's ``rid``), as it is for requests cut by a stop.
- Record: a reply is checked (its shape, its ids against the model's vocabulary) and
  written through the run's :class:`~workbench.generate.writer.RunWriter`; it counts as
  done once it is on disk. A prompt sent as ids whose reply counts other prompt_tokens was
  cut or changed by the server: a ``prompt_mismatch`` event (run.json's ``events``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from workbench.errors import ConnectionLost, RequestFailed, RequestTimeout
from workbench.generate.concurrency import Slots
from workbench.generate.context_fit import context_cut
from workbench.generate.conversations import Conversations, Next
from workbench.generate.feed import SendingDataset
from workbench.generate.gate import Gate
from workbench.generate.plan import GenerateOptions, Plan
from workbench.generate.prompts import Prompt
from workbench.generate.rendering import chat_payload
from workbench.generate.resume import prompt_record, sent_line
from workbench.generate.run_manifest import RunManifest
from workbench.generate.writer import RunWriter
from workbench.rundir.records import ErrorRecord, Record
from workbench.server.client import GenerateResult, SGLangClient, check_reply, redact_url
from workbench.text import format_duration

__all__ = ["MAX_CONNECTION_LOSSES", "Attempts"]

MAX_CONNECTION_LOSSES = 20  # lost connections a prompt may take without spending attempts


class _Followup(NamedTuple):
    """A reply written (or held by the writer): `written` is set once its record is on
    disk; `prompt` is its conversation's next turn, if any."""

    prompt: Prompt | None
    written: asyncio.Event


class Attempts:
    """The attempts of a run's prompts (module docstring). `done` is called whenever a
    request ends; `gate` is the run's outage gate, set when the run starts; `retries` and
    `dropped` count the attempts sent again and the prompts a stop cut."""

    def __init__(self, client: SGLangClient, options: GenerateOptions, plan: Plan, slots: Slots,
                 writer: RunWriter, manifest: RunManifest, stop: asyncio.Event,
                 done: Callable[[], None], conversations: Conversations) -> None:
        self.client = client
        self.options = options
        self.plan = plan
        self.slots = slots
        self.writer = writer
        self.manifest = manifest  # run.json: the server's facts, the events
        self.gate: Gate | None = None
        self.retries = 0
        self.dropped = 0
        self._stop = stop
        self._done = done
        self._rng = random.Random(options.seed)
        self._aborts: set[asyncio.Task[bool]] = set()
        self.conversations = conversations  # the turns: each datasets' conversations

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def wait_aborts(self) -> None:
        """Until the server was told to stop what this run gave up on (5 s at most)."""
        if self._aborts:
            await asyncio.wait(self._aborts, timeout=5.0)

    async def work(self, ds: SendingDataset, prompt: Prompt, long: bool) -> None:
        """Send one prompt, retrying retryable failures; holds a slot only while a request
        runs. A conversation's turns go one after the other in this one task: the next turn
        is sent once this one's record is on disk, ahead of new conversations for a slot."""
        current: Prompt | None = prompt
        while current is not None:
            followup = await self._send(ds, current, long)
            if followup is None or followup.prompt is None:
                return
            if not await self._on_disk(followup.written) or not await self._next_slot(
                    ds, followup.prompt):
                return
            current = followup.prompt
            long = current.prompt_tokens > self.options.long_threshold

    async def _on_disk(self, written: asyncio.Event) -> bool:
        """Whether the record is on disk (waiting while the writer holds it), not stopping."""
        if not written.is_set():
            await self.writer.wait()
        return written.is_set() and not self.stopping

    async def _next_slot(self, ds: SendingDataset, prompt: Prompt) -> bool:
        """A slot for a conversation's next turn (ahead of new conversations), its prompt
        line written; False when the run stops or the dataset's budget is reached."""
        if ds.progress.budget_reached:
            return False
        long = prompt.prompt_tokens > self.options.long_threshold
        await self.slots.acquire(long, first=True)
        if self.stopping or ds.progress.budget_reached:
            self.slots.release(long)
            return False
        ds.progress.in_flight += 1
        ds.budget.start(prompt.sample_id, time.perf_counter())
        if ds.planned.spec.render != "server":  # else written with its reply
            assert ds.prompts is not None
            self.writer.write(ds.prompts, prompt_record(prompt))
        return True

    async def _send(self, ds: SendingDataset, prompt: Prompt, long: bool) -> _Followup | None:
        """One prompt until its record is written or it failed for good (the slot held on
        entry is released on the way out); what follows it in its conversation, if any."""
        holding = True
        settled = False  # recorded, or failed for good; else dropped by a stop
        fitted: int | None = None  # max_new_tokens cut to fit the context (once: context_fit)
        cut: int | None = None  # the attempt before was refused for length: again, at once
        spent = lost = 0  # attempts spent; attempts lost with the connection (not spent)
        attempt, lost_last = 0, False
        try:
            while spent < self.options.max_attempts:
                attempt += 1
                if attempt > 1:
                    if cut is None and not lost_last:  # after a lost connection the gate waited
                        await self._sleep_unless_stopped(self._backoff(spent))
                    if self.stopping:
                        return None
                    await self.slots.acquire(long)
                    holding = True
                assert self.gate is not None
                await self.gate.wait()
                await self.writer.wait()
                if self.stopping:
                    return None
                outcome = await self._attempt(ds, prompt, attempt, fitted)
                if not isinstance(outcome, RequestFailed):
                    settled = True
                    return outcome
                error = outcome
                self.slots.release(long)
                holding = False
                cut = None if fitted is not None else context_cut(
                    ds.planned.spec, ds.planned.sampling_of(prompt).max_new_tokens, prompt, error,
                    self.manifest.server)
                fitted = cut or fitted
                lost_last = isinstance(error, ConnectionLost) and lost < MAX_CONNECTION_LOSSES
                if lost_last:
                    lost += 1  # the server went away (a crash, a restart): not the prompt's fault
                else:
                    spent += 1
                if (not error.retryable and cut is None) or spent == self.options.max_attempts:
                    self._failed_for_good(ds, prompt)
                    settled = True
                    return None
                self.retries += 1
            return None
        finally:
            ds.progress.in_flight -= 1
            self.dropped += not settled
            ds.budget.finish(prompt.sample_id, time.perf_counter(), None)
            if holding:
                self.slots.release(long)
            self._done()

    def _failed_for_good(self, ds: SendingDataset, prompt: Prompt) -> None:
        """The prompt failed for good: counted; a conversation ends at that turn (sent again
        from it on resume)."""
        ds.progress.failed_ids += 1
        ds.progress.failed_samples.append(prompt.sample_id)
        if prompt.turn is not None:
            ds.progress.target -= max(0, self.conversations.failed(ds.planned.spec, prompt) - 1)

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    def _payload(self, ds: SendingDataset, prompt: Prompt, attempt: int,
                 max_new_tokens: int | None = None) -> dict[str, Any]:
        """The request: /generate's, or /v1/chat/completions' for a prompt the server
        renders (:mod:`workbench.generate.rendering`)."""
        rid = f"{ds.name}-{prompt.sample_id}-{attempt}-{self._rng.getrandbits(32):08x}"
        if ds.planned.spec.render == "server":
            assert self.manifest.server is not None
            return chat_payload(ds.planned.spec, ds.planned.sampling_of(prompt), prompt, rid,
                                self.manifest.server.model, max_new_tokens)
        payload: dict[str, Any] = {"sampling_params": ds.planned.sampling_of(prompt).to_sglang(),
                                   "rid": rid}
        if max_new_tokens is not None:  # cut to fit the context (context_fit)
            payload["sampling_params"]["max_new_tokens"] = max_new_tokens
        if prompt.input_ids is not None:
            payload["input_ids"] = prompt.input_ids
        else:
            payload["text"] = prompt.text
        return payload

    async def _attempt(self, ds: SendingDataset, prompt: Prompt, attempt: int,
                       max_new_tokens: int | None = None) -> RequestFailed | _Followup:
        payload = self._payload(ds, prompt, attempt, max_new_tokens)
        try:
            result, server_ids = await self._generate(payload, ds.planned.spec.render == "server")
            check_reply(result, self.plan.vocab_size, self.client.base_url)
        except RequestFailed as exc:
            self._failed_attempt(ds, prompt, attempt, exc)
            return exc
        except asyncio.CancelledError:
            self._abort_later(payload["rid"])  # cut by a stop: the server stops generating it
            raise
        return self._record(ds, prompt, result, max_new_tokens, server_ids)

    async def _generate(self, payload: dict[str, Any],
                        chat: bool) -> tuple[GenerateResult, list[int] | None]:
        """One reply within the request timeout, counted from the request's start whatever
        the bytes do meanwhile; past it, a RequestTimeout (and the request aborted). With
        `chat`, through /v1/chat/completions: the prompt ids the server rendered too."""
        deadline = self.options.request_timeout
        try:
            async with asyncio.timeout(deadline):
                if chat:
                    return await self.client.chat_generate(payload)
                return await self.client.generate(payload), None
        except TimeoutError:
            self._abort_later(payload["rid"])
            raise RequestTimeout(f"no whole reply within the request timeout of "
                                 f"{format_duration(deadline)}", redact_url(self.client.base_url)
                                 ) from None

    def _abort_later(self, rid: str) -> None:
        """Ask the server to stop generating request `rid` (best effort, in the background)."""
        task = asyncio.get_running_loop().create_task(self.client.abort_request(rid))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def _failed_attempt(self, ds: SendingDataset, prompt: Prompt, attempt: int,
                        exc: RequestFailed) -> None:
        error = ErrorRecord(sample_id=prompt.sample_id, attempt=attempt,
                            error_type=exc.error_type, http_status=exc.http_status,
                            message=str(exc)[:1000], ts=time.time(),
                            turn=msgspec.UNSET if prompt.turn is None else prompt.turn)
        self.writer.write(ds.errors, error, on_written=ds.progress.count_error)
        if isinstance(exc, ConnectionLost) and self.gate is not None:
            self.gate.close()
        elif exc.retryable:
            self.slots.failed()

    def _backoff(self, attempt: int) -> float:
        base = min(self.options.backoff_cap, self.options.backoff_base * 2 ** (attempt - 1))
        return base * self._rng.uniform(0.5, 1.5)

    def _record(self, ds: SendingDataset, prompt: Prompt, result: GenerateResult,
                reduced: int | None = None, server_ids: list[int] | None = None) -> _Followup:
        """Write the reply's record (`reduced`: the max_new_tokens cut to fit the context);
        it counts as done once it is on disk (`written` is set then). A turn of a
        conversation gets what follows it (:mod:`workbench.generate.conversations`) before
        its record is written: the record says why the conversation ends, if it does. A
        prompt sent as ids whose reply counts other prompt_tokens was cut or changed by the
        server: counted in `prompt_mismatches`, and told as a `prompt_mismatch` event at the
        1st, 2nd, 4th, 8th, ... one of a dataset."""
        following = Next(None)
        if prompt.turn is not None:
            following = self.conversations.follow(ds.planned.spec, prompt, result.output_ids,
                                                  result.finish_reason)
            ds.progress.target -= following.dropped
        record = Record(
            sample_id=prompt.sample_id, output_ids=result.output_ids,
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens, finish_reason=result.finish_reason,
            matched_stop=result.matched_stop, e2e_latency=result.e2e_latency, ts=time.time(),
            num_retractions=(msgspec.UNSET if result.num_retractions is None
                             else result.num_retractions),
            max_new_tokens_reduced=msgspec.UNSET if reduced is None else reduced,
            turn=msgspec.UNSET if prompt.turn is None else prompt.turn,
            ended=msgspec.UNSET if following.ended is None else following.ended,
            mode=msgspec.UNSET if prompt.mode is None else prompt.mode,
        )
        sent = server_ids if server_ids is not None else prompt.input_ids
        if sent is not None and result.prompt_tokens != len(sent):
            self._prompt_mismatch(ds, prompt.sample_id, len(sent), result.prompt_tokens)
        if server_ids is not None:  # the server rendered it: its ids are the prompt kept
            self._server_rendered(ds, prompt, server_ids)
        ds.budget.finish(prompt.sample_id, time.perf_counter(), result.completion_tokens)
        self.slots.finished(result.completion_tokens)
        tokens = result.completion_tokens
        written = asyncio.Event()

        def on_written() -> None:
            ds.progress.count_done(tokens)
            ds.figures.add(record.output_ids)
            written.set()

        self.writer.write(ds.raw, record, on_written=on_written)
        return _Followup(following.prompt, written)

    def _server_rendered(self, ds: SendingDataset, prompt: Prompt, server_ids: list[int]) -> None:
        """The prompts.jsonl line of a prompt the server rendered (before its record), and
        its rendering compared with the tokenizer's (the first difference said)."""
        assert ds.prompts is not None and ds.planned.rendering is not None
        self.writer.write(ds.prompts, sent_line(prompt, server_ids))
        message = ds.planned.rendering.add(prompt, server_ids)
        if message is not None:
            self.manifest.add_event({"ts": round(time.time(), 3), "kind": "rendering",
                                     "dataset": ds.name, "message": message})

    def _prompt_mismatch(self, ds: SendingDataset, sample_id: int | str, sent: int,
                         counted: int) -> None:
        progress = ds.progress
        progress.prompt_mismatches += 1
        count = progress.prompt_mismatches
        if count & (count - 1):  # told at powers of two: a handful of events for any number
            return
        self.manifest.add_event({
            "ts": round(time.time(), 3), "kind": "prompt_mismatch", "dataset": progress.name,
            "message": (f"{progress.name}: prompt_tokens differ from the ids sent in {count} of "
                        f"this run's replies (sample_id {sample_id}: {sent} sent, {counted} "
                        f"counted): the server cut or changed the prompts (started with "
                        f"--allow-auto-truncate?); validate lists them (prompt_tokens_mismatch)"),
            "count": count, "sample_id": sample_id, "sent": sent, "counted": counted})
