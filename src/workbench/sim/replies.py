"""/generate replies and streamed chunks as SGLang 0.5.23's tokenizer manager builds them.

`srt/managers/tokenizer_manager.py` `_handle_batch_output`: meta_info holds `id`,
`finish_reason`, `prompt_tokens`, `weight_version`, `num_retractions`, the logprob keys when
asked, `reasoning_tokens`, `completion_tokens`, `cached_tokens` (and `cached_tokens_details`
with a hierarchical cache), `dp_rank` under data parallelism, the scheduler's timing keys with
`--enable-metrics` (`queue_time`, `forward_entry_time`, `prefill_finished_time`), and, on the
final reply only, `e2e_latency` (plus `request_received_ts`, `first_token_latency`,
`request_finished_ts`, `decode_throughput` with metrics). Text and ids are cumulative.

A request aborted while it waited in the queue is answered by `_handle_abort_req` instead:
meta_info holds only `id`, `finish_reason` (`{"type": "abort", "message": "Abort in waiting
queue"}`, no status code), `weight_version`, `e2e_latency`, the logprob keys when asked and
`completion_tokens`; a streamed one carries only its last output id.

Two replies need no engine (`fixed_reply`, `abort_reply`): the fixed-latency mode's, its
planned output as one piece, and that of a request an injected fault aborts (SGLang's abort:
503); both carry the plain meta_info keys, nothing cached, no retraction.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from workbench.profiles import ModelProfile
from workbench.sim.completion import extend_text, logprob_fields, reply_text
from workbench.sim.job import Job
from workbench.sim.outputs import fixed_output, render_text
from workbench.sim.protocol import GenerateItem, abort_reason

__all__ = ["FAULT_ABORT_MESSAGE", "ReplyOptions", "abort_reply", "fixed_reply", "generate_reply"]

WEIGHT_VERSION = "default"
FAULT_ABORT_MESSAGE = "Abort request: injected fault"


class ReplyOptions(NamedTuple):
    """Server-wide settings that shape replies."""

    model: ModelProfile
    enable_metrics: bool
    hierarchical_cache: bool
    data_parallel: bool
    logprob_noise: float = 0.0  # fp8 KV: the chosen tokens' logprobs move by up to this


def _realtime(perf: float) -> float:
    """A perf_counter time as a unix time (req_time_stats `convert_time_to_realtime`)."""
    return time.time() - (time.perf_counter() - perf)


def finish_reason(job: Job) -> dict[str, Any] | None:
    """The published finish_reason, None while the request runs."""
    request = job.request
    if not request.done:
        return None
    if request.aborted_in_queue:
        return {"type": "abort", "message": request.abort_message}
    if request.abort_message is not None:
        return abort_reason(request.abort_message, request.abort_status)
    completion = job.completion
    if completion.finish == "stop":
        return {"type": "stop", "matched": completion.matched}
    return {"type": "length", "length": job.item.max_new_tokens}


def generate_reply(job: Job, options: ReplyOptions, e2e_latency: float | None) -> dict[str, Any]:
    """The job's reply as published so far; `e2e_latency` is given for the final one only."""
    request = job.request
    if request.aborted_in_queue:
        return _queue_abort_reply(job, options, e2e_latency)
    ids = job.completion.output_ids[: request.published]
    finish = finish_reason(job)
    meta: dict[str, Any] = {
        "id": job.item.rid,
        "finish_reason": finish,
        "prompt_tokens": len(job.item.input_ids),
        "weight_version": WEIGHT_VERSION,
        "num_retractions": request.retractions,
    }
    if job.item.logprob is not None:
        meta.update(logprob_fields(job.item.logprob, job.item.input_ids, ids, options.model,
                                   noise=options.logprob_noise))
    reasoning = job.reasoning_length
    meta["reasoning_tokens"] = reasoning if reasoning and reasoning <= len(ids) else 0
    meta["completion_tokens"] = len(ids)
    meta["cached_tokens"] = request.cached_tokens
    if options.hierarchical_cache:
        meta["cached_tokens_details"] = {
            "device": request.cached_tokens - request.host_cached_tokens,
            "host": request.host_cached_tokens,
        }
    if options.data_parallel:
        meta["dp_rank"] = job.rank
    if options.enable_metrics:
        meta.update(_scheduler_times(job))
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
        if options.enable_metrics:
            meta.update(_final_times(job, e2e_latency))
    return {"text": _text(job, ids, finish, options), "output_ids": ids, "meta_info": meta}


def _queue_abort_reply(
    job: Job, options: ReplyOptions, e2e_latency: float | None
) -> dict[str, Any]:
    """tokenizer_manager `_handle_abort_req`: the reply of a request aborted in the queue."""
    ids = job.completion.output_ids[: job.request.published]
    finish = finish_reason(job)
    meta: dict[str, Any] = {"id": job.item.rid, "finish_reason": finish}
    meta["weight_version"] = WEIGHT_VERSION
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if job.item.logprob is not None:
        meta.update(logprob_fields(job.item.logprob, job.item.input_ids, ids, options.model,
                                   noise=options.logprob_noise))
    meta["completion_tokens"] = len(ids)
    text = _text(job, ids, finish, options)
    return {"text": text, "output_ids": ids[-1:] if job.request.stream else ids, "meta_info": meta}


def _text(job: Job, ids: list[int], finish: dict[str, Any] | None, options: ReplyOptions) -> str:
    """The final text exactly (stop trimmed); a running request's text grown chunk by chunk."""
    sampling = job.item.sampling
    if finish is not None:
        matched = job.completion.matched if finish["type"] == "stop" else None
        return reply_text(ids, matched, sampling, options.model)
    rendered, text = job.text
    if rendered < len(ids):
        text = extend_text(text, ids[rendered:], sampling, options.model)
        job.text = (len(ids), text)
    return text


def _scheduler_times(job: Job) -> dict[str, Any]:
    request = job.request
    if request.admitted_at is None:
        return {}
    times = {"forward_entry_time": _realtime(request.admitted_at)}
    if request.first_token_at is not None:
        times["prefill_finished_time"] = _realtime(request.first_token_at)
    times["queue_time"] = request.admitted_at - request.arrival
    return times


def _final_times(job: Job, e2e_latency: float) -> dict[str, Any]:
    request = job.request
    times: dict[str, Any] = {"request_received_ts": _realtime(request.arrival)}
    if request.first_token_at is not None:
        times["first_token_latency"] = request.first_token_at - request.arrival
        decode = (request.finished_at or request.first_token_at) - request.first_token_at
        if decode > 0 and request.published > 1:
            times["decode_throughput"] = (request.published - 1) / decode
    if request.finished_at is not None:
        times["request_finished_ts"] = _realtime(request.finished_at)
    times["response_sent_to_client_ts"] = time.time()
    return times


def fixed_reply(item: GenerateItem, model: ModelProfile, e2e_latency: float) -> dict[str, Any]:
    """The fixed-latency mode's reply: the fixed output for the sequence as given."""
    plan = fixed_output(model, item.max_new_tokens)
    finish: dict[str, Any] = (
        {"type": "stop", "matched": plan.matched}
        if plan.finish == "stop"
        else {"type": "length", "length": item.max_new_tokens}
    )
    return _plain_reply(item, model, plan.output_ids, finish, e2e_latency)


def abort_reply(item: GenerateItem, model: ModelProfile, e2e_latency: float) -> dict[str, Any]:
    """The reply of a request aborted by an injected fault (SGLang's abort: 503)."""
    return _plain_reply(item, model, [], abort_reason(FAULT_ABORT_MESSAGE), e2e_latency)


def _plain_reply(
    item: GenerateItem,
    model: ModelProfile,
    ids: list[int],
    finish: dict[str, Any],
    e2e_latency: float,
) -> dict[str, Any]:
    return {
        "text": render_text(ids, model),
        "output_ids": ids,
        "meta_info": {
            "id": item.rid,
            "finish_reason": finish,
            "prompt_tokens": len(item.input_ids),
            "weight_version": WEIGHT_VERSION,
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "e2e_latency": e2e_latency,
        },
    }
