"""A planned output under SGLang's stop rules, its reply text, and plausible logprobs.

The model's own output comes from `outputs.plan_output`; this module applies the request's
sampling parameters to it as SGLang's scheduler would (`srt/managers/schedule_batch.py`,
`Req.check_finished`: stop strings first, then stop token ids, then the length):

- `ignore_eos`: no token ends the request (`_check_token_based_finish` returns at once, so
  `stop_token_ids` are ignored too); the model's end id is kept and the output goes on to
  exactly `max_new_tokens` (stop strings still apply).
- `min_new_tokens`: the end id and `stop_token_ids` are masked (the min-new-tokens penalizer)
  until that many tokens exist; a shorter natural output is continued, then ends.
- `stop_token_ids`, the model's end and EOS ids: `{"type": "stop", "matched": id}` at the
  first one; `stop`: `{"type": "stop", "matched": "<str>"}` at the first token whose decoded
  tail contains a stop string. Both keep the stop in `output_ids`.

Reply text follows `srt/managers/detokenizer_manager.py` (`trim_matched_stop`): a matched stop
id is left out of the text and a matched stop string cut off, unless `no_stop_trim`; special
ids (tool-call markers too, where the model's are special tokens) are left out with
`skip_special_tokens` (the default).

Logprobs of input tokens (`logprob_start_len`, as a request that scores a reply without
generating sends) come from a bigram model of the simulator's own text (`corpus.json`): the
probability of a token after the one before it is ``0.9 * count(prev, token) / count(prev) +
0.1 * unigram(token)`` (the unigram add-one smoothed over the text's vocabulary; the unigram
alone after an id the text never holds). The simulator's replies are close to samples of that
model (runs of the text joined by its bigram steps, `workbench.sim.outputs`), so a reply it
generated scores as far more likely (a mean NLL near 2) than random ids (near 8.6),
and the top-k alternatives at a position are the bigram's most likely next ids. The logprobs of
generated (output) tokens stay the per-(position, token) values of :func:`_logprob`.
"""

from __future__ import annotations

import functools
import math
import random
import zlib
from collections import Counter
from typing import Any, Literal, NamedTuple

from workbench.profiles import ModelProfile
from workbench.sim.drift import perturbed
from workbench.sim.markers import call_format
from workbench.sim.outputs import PlannedOutput, corpus, render_text
from workbench.sim.sampling import Sampling

__all__ = [
    "Completion",
    "complete",
    "extend_text",
    "logprob_fields",
    "reasoning_length",
    "reply_text",
]

FILLER_SALT = 0x5EED


class Completion(NamedTuple):
    """The ids a request will generate and how it finishes."""

    output_ids: list[int]
    finish: Literal["stop", "length"]
    matched: int | str | None


def complete(plan: PlannedOutput, sampling: Sampling, model: ModelProfile, seed: int) -> Completion:
    """`plan` (cut at max_new_tokens) under the request's stop rules."""
    ids = _continued(list(plan.output_ids), plan, sampling, model, seed)
    stop_ids = frozenset() if sampling.ignore_eos else _stop_ids(model) | sampling.stop_token_ids
    at_string = _first_stop_string(ids, sampling.stop, model)
    at_token = next(
        (index + 1 for index in range(sampling.min_new_tokens, len(ids)) if ids[index] in stop_ids),
        None,
    )
    if at_string is not None and (at_token is None or at_string[0] <= at_token):
        return Completion(ids[: at_string[0]], "stop", at_string[1])
    if at_token is not None:
        return Completion(ids[:at_token], "stop", ids[at_token - 1])
    return Completion(ids, "length", None)


def _continued(
    ids: list[int], plan: PlannedOutput, sampling: Sampling, model: ModelProfile, seed: int
) -> list[int]:
    """The model's ids, continued where ignore_eos or min_new_tokens mask its end."""
    limit = sampling.max_new_tokens
    if plan.finish != "stop" or len(ids) >= limit:
        return ids
    if sampling.ignore_eos:
        return ids + _filler(model, seed, limit - len(ids))
    if len(ids) - 1 < sampling.min_new_tokens:
        body = ids[:-1] + _filler(model, seed, sampling.min_new_tokens - (len(ids) - 1))
        return (body + ids[-1:])[:limit]
    return ids


def _filler(model: ModelProfile, seed: int, count: int) -> list[int]:
    low, high = model.sim_content_ids
    return random.Random(seed ^ FILLER_SALT).choices(range(low, high), k=count)


@functools.cache
def _stop_ids(model: ModelProfile) -> frozenset[int]:
    ids = set(model.end_ids)
    if model.eos_id is not None:
        ids.add(model.eos_id)
    return frozenset(ids)


@functools.cache
def _special_ids(model: ModelProfile) -> frozenset[int]:
    ids = set(_stop_ids(model))
    ids.update(token for token in (model.think_start, model.think_end) if token is not None)
    calls = call_format(model)
    if calls is not None and calls.special:
        ids.update(calls.names)
    return frozenset(ids)


def _first_stop_string(
    ids: list[int], stops: tuple[str, ...], model: ModelProfile
) -> tuple[int, str] | None:
    """(tokens through the match, stop) for the first token whose decoded tail holds a stop
    string (schedule_batch's `tail_str`: the last max(len(stop)) + 1 tokens), or None."""
    stops = tuple(stop for stop in stops if stop)
    if not stops:
        return None
    window = max(len(stop) for stop in stops) + 1
    for count in range(1, len(ids) + 1):
        tail = render_text(ids[max(0, count - window) : count], model)
        matched = next((stop for stop in stops if stop in tail), None)
        if matched is not None:
            return count, matched
    return None


def _visible(ids: list[int], sampling: Sampling, model: ModelProfile) -> list[int]:
    if not sampling.skip_special_tokens:
        return ids
    special = _special_ids(model)
    return [token for token in ids if token not in special]


def extend_text(text: str, new_ids: list[int], sampling: Sampling, model: ModelProfile) -> str:
    """`text` (the rendering of earlier ids) followed by the rendering of `new_ids`: the
    decoded text of a running request grows by its new tokens only (rendered tokens are
    joined by spaces), so a stream costs O(new tokens) per chunk, not O(all tokens)."""
    added = render_text(_visible(new_ids, sampling, model), model)
    return f"{text} {added}" if text and added else text or added


def reply_text(
    ids: list[int], matched: int | str | None, sampling: Sampling, model: ModelProfile
) -> str:
    """The reply's text: special ids skipped, a matched stop trimmed (detokenizer_manager)."""
    if isinstance(matched, int) and not sampling.no_stop_trim and ids:
        ids = ids[:-1]
    text = render_text(_visible(ids, sampling, model), model)
    if isinstance(matched, str):
        position = text.find(matched)
        if position >= 0:
            text = text[: position + len(matched)] if sampling.no_stop_trim else text[:position]
    return text


def reasoning_length(ids: list[int], model: ModelProfile) -> int | None:
    """Tokens up to and including the think-end id, as SGLang counts `reasoning_tokens`
    (None when the output never closes its reasoning)."""
    if model.think_end is None or model.think_end not in ids:
        return None
    return ids.index(model.think_end) + 1


def _logprob(position: int, token: int) -> float:
    """A deterministic, plausible log-probability in (-4, 0)."""
    unit = zlib.crc32(f"{position}:{token}".encode()) / 2**32
    return -round(4.0 * unit**3 + 1e-4, 6)


def _entry(position: int, token: int, model: ModelProfile, text: bool,
           noise: float = 0.0) -> list[Any]:
    logprob = perturbed(_logprob(position, token), position, token, noise)
    return [logprob, token, render_text([token], model) if text else None]


def _top(position: int, token: int, count: int, model: ModelProfile, text: bool) -> list[Any]:
    """`count` alternatives, best first; the sampled token leads (greedy-like)."""
    low, high = model.sim_content_ids
    best = _logprob(position, token)
    entries = [[best, token, render_text([token], model) if text else None]]
    for rank in range(1, count):
        other = low + (token * 31 + rank * 977) % (high - low)
        value = round(best - 0.4 * rank - 0.1, 6)
        entries.append([value, other, render_text([other], model) if text else None])
    return entries


class LogprobRequest(NamedTuple):
    """What a request asked for: `logprob_start_len` (-1: output only), top count, text."""

    start: int
    top: int
    text: bool


BIGRAM_WEIGHT = 0.9  # the bigram's share of an input token's probability (module docstring)


class _Bigrams(NamedTuple):
    """The simulator's text as a bigram model: successors of each id, most frequent first."""

    pairs: Counter[tuple[int, int]]  # (prev, token) -> how often token follows prev
    follow: dict[int, list[tuple[int, int]]]  # prev -> [(token, count)], by count then id
    totals: dict[int, int]  # prev -> how often it is followed by anything
    unigram: list[float]  # add-one smoothed probability of each id of the text's vocabulary
    ranked: list[int]  # the vocabulary by unigram probability, most likely first
    floor: float  # the unigram probability of an id outside the vocabulary


@functools.cache
def _bigrams() -> _Bigrams:
    text = corpus()
    vocab, size = len(text.tokens), len(text.ids)
    pairs = Counter(zip(text.ids, text.ids[1:], strict=False))
    follow: dict[int, list[tuple[int, int]]] = {}
    for (prev, token), count in pairs.items():
        follow.setdefault(prev, []).append((token, count))
    for successors in follow.values():
        successors.sort(key=lambda item: (-item[1], item[0]))
    counts = Counter(text.ids)
    unigram = [(counts[token] + 1) / (size + vocab) for token in range(vocab)]
    ranked = sorted(range(vocab), key=lambda token: (-unigram[token], token))
    totals = {prev: sum(count for _, count in successors) for prev, successors in follow.items()}
    return _Bigrams(pairs, follow, totals, unigram, ranked, 1 / (size + vocab))


def _bigram_probability(prev: int, token: int) -> float:
    """P(token | prev) under the bigram model of the module docstring."""
    model = _bigrams()
    unigram = model.unigram[token] if 0 <= token < len(model.unigram) else model.floor
    total = model.totals.get(prev)
    if not total:
        return unigram
    return BIGRAM_WEIGHT * model.pairs[prev, token] / total + (1 - BIGRAM_WEIGHT) * unigram


def _input_logprob(prev: int, token: int) -> float:
    return round(math.log(_bigram_probability(prev, token)), 6)


def _input_top(prev: int, count: int, model: ModelProfile, text: bool) -> list[Any]:
    """The bigram's `count` most likely ids after `prev`, best first (exactly: an id that
    never follows `prev` is worth its unigram share, so the best of those are the most frequent
    ids)."""
    bigrams = _bigrams()
    candidates = [token for token, _ in bigrams.follow.get(prev, [])]
    candidates += bigrams.ranked[: count + len(candidates)]
    scored = {token: _bigram_probability(prev, token) for token in candidates}
    best = sorted(scored, key=lambda token: (-scored[token], token))[:count]
    return [[round(math.log(scored[token]), 6), token,
             render_text([token], model) if text else None] for token in best]


def _input_entries(
    request: LogprobRequest, input_ids: list[int], start: int, model: ModelProfile
) -> list[list[Any]]:
    """`[logprob, id, text]` of input positions from `start`; the first has no logprob: the
    scheduler computes logprobs from `logprob_start_len` on, each for the next token, and
    publishes `[None] + logprobs[:-1]` (scheduler_output_processor_mixin
    `_process_input_token_logprobs`), whatever the start."""
    return [
        [None if index == start else _input_logprob(input_ids[index - 1], input_ids[index]),
         input_ids[index], render_text([input_ids[index]], model) if request.text else None]
        for index in range(start, len(input_ids))
    ]


def logprob_fields(
    request: LogprobRequest, input_ids: list[int], output_ids: list[int], model: ModelProfile,
    *, noise: float = 0.0,
) -> dict[str, Any]:
    """meta_info's logprob keys (tokenizer_manager `add_logprob_to_meta_info`): entries are
    `[logprob, token_id, text or null]`; input tokens from `logprob_start_len` on are scored
    by the bigram model (module docstring), the first of them without a logprob (and without
    top logprobs); the output's move by up to `noise` (fp8 KV,
    `workbench.sim.drift.perturbed`)."""
    start = len(input_ids) if request.start < 0 else request.start
    offset = len(input_ids)
    outputs = [
        _entry(offset + index, token, model, request.text, noise)
        for index, token in enumerate(output_ids)
    ]
    fields: dict[str, Any] = {
        "input_token_logprobs": _input_entries(request, input_ids, start, model),
        "output_token_logprobs": outputs,
        "output_token_logprobs_length": len(outputs),
    }
    if request.top > 0:
        fields["input_top_logprobs"] = [
            None if index == start
            else _input_top(input_ids[index - 1], request.top, model, request.text)
            for index in range(start, len(input_ids))
        ]
        fields["output_top_logprobs"] = [
            _top(offset + index, token, request.top, model, request.text)
            for index, token in enumerate(output_ids)
        ]
    return fields
