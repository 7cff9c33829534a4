"""Deterministic simulated outputs, shaped like a reasoning model's.

A completion for a thinking-mode prompt is: reasoning ids drawn from the model profile's
`sim_content_ids`, the think-end id, answer ids, then the end id (`end_ids[0]`); profiles whose
chat template does not open the reasoning block (`think_in_template=False`) start with the
think-start id, and non-reasoning profiles produce only an answer and the end id. Lengths come
from the simulator profile's `OutputShape`. A seeded fraction (`unclosed_rate`) reasons until
`max_new_tokens`. Anything cut at `max_new_tokens` finishes with "length", otherwise "stop".

The same seed, prompt and sampling parameters always give the same ids (the request id plays no
part); a larger `max_new_tokens` extends, never changes, a shorter output's ids.
Text renders ids as `w<id>` words and special ids by name; `tokenize_text` inverts it.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import zlib
from array import array
from typing import Literal, NamedTuple

from workbench.profiles import ModelProfile
from workbench.sim.profiles import OutputShape

__all__ = [
    "PlannedOutput",
    "fixed_output",
    "output_seed",
    "plan_output",
    "render_text",
    "tokenize_text",
]


class PlannedOutput(NamedTuple):
    """The ids a request will generate and how it ends."""

    output_ids: list[int]
    finish: Literal["stop", "length"]
    matched: int | None


def output_seed(
    seed: int, prompt: list[int] | str, temperature: float, top_p: float, top_k: int
) -> int:
    """A 64-bit seed for one (server seed, prompt, sampling) triple; greedy ignores top_p/top_k."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(seed.to_bytes(8, "little", signed=True))
    if isinstance(prompt, str):
        digest.update(b"text:" + prompt.encode())
    else:
        digest.update(b"ids:" + array("q", prompt).tobytes())
    sampling = (0.0,) if temperature == 0 else (temperature, top_p, top_k)
    digest.update(repr(sampling).encode())
    return int.from_bytes(digest.digest(), "little")


def plan_output(
    model: ModelProfile, shape: OutputShape, seed: int, max_new_tokens: int
) -> PlannedOutput:
    """The output for one seed, cut at `max_new_tokens`."""
    rng = random.Random(seed)
    head = _head(model)
    think_end = model.think_end
    if think_end is not None and rng.random() < shape.unclosed_rate:
        ids = head + _content(rng, model, max(0, max_new_tokens - len(head)))
        return PlannedOutput(ids[:max_new_tokens], "length", None)
    answer = _length(rng, shape.answer_median, shape.answer_sigma)
    if think_end is None:
        body = _content(rng, model, min(answer, max_new_tokens))
        return _finish(body, model.end_ids[0], max_new_tokens)
    reasoning = _length(rng, shape.reasoning_median, shape.reasoning_sigma)
    ids = head + _content(rng, model, min(reasoning, max_new_tokens))
    if len(ids) < max_new_tokens:
        ids.append(think_end)
        ids += _content(rng, model, min(answer, max_new_tokens - len(ids)))
    return _finish(ids, model.end_ids[0], max_new_tokens)


def _head(model: ModelProfile) -> list[int]:
    """The think-start id when the completion itself opens the reasoning block."""
    if model.think_in_template or model.think_start is None or model.think_end is None:
        return []
    return [model.think_start]


def _length(rng: random.Random, median: float, sigma: float) -> int:
    return max(1, int(rng.lognormvariate(math.log(median), sigma)))


def _content(rng: random.Random, model: ModelProfile, count: int) -> list[int]:
    low, high = model.sim_content_ids
    return rng.choices(range(low, high), k=count)


def _finish(ids: list[int], end_id: int, max_new_tokens: int) -> PlannedOutput:
    if len(ids) >= max_new_tokens:
        return PlannedOutput(ids[:max_new_tokens], "length", None)
    ids.append(end_id)
    return PlannedOutput(ids, "stop", end_id)


@functools.cache
def _special_names(model: ModelProfile) -> dict[int, str]:
    names: dict[int, str] = {}
    if model.eos_id is not None:
        names[model.eos_id] = "[EOS]"
    names.update({end_id: "<|im_end|>" for end_id in model.end_ids})
    if model.think_start is not None:
        names[model.think_start] = "<think>"
    if model.think_end is not None:
        names[model.think_end] = "</think>"
    return names


@functools.cache
def _special_ids(model: ModelProfile) -> dict[str, int]:
    return {name: token for token, name in _special_names(model).items()}


def render_text(ids: list[int], model: ModelProfile) -> str:
    """Ids as text: `w<id>` words, special ids by name, separated by spaces."""
    names = _special_names(model)
    return " ".join(names.get(token) or f"w{token}" for token in ids)


def tokenize_text(text: str, model: ModelProfile) -> list[int]:
    """Whitespace-separated words as ids: `w<id>` and special names exactly, others hashed."""
    specials = _special_ids(model)
    low, high = model.sim_content_ids
    return [_word_id(word, specials, low, high) for word in text.split()]


def _word_id(word: str, specials: dict[str, int], low: int, high: int) -> int:
    special = specials.get(word)
    if special is not None:
        return special
    if word[0] == "w" and word[1:].isdigit() and low <= int(word[1:]) < high:
        return int(word[1:])
    return low + zlib.crc32(word.encode()) % (high - low)


def fixed_output(model: ModelProfile, max_new_tokens: int) -> PlannedOutput:
    """The small constant output of the fixed-latency mode: four ids and the end id."""
    low = model.sim_content_ids[0]
    return _finish([low, low + 1, low + 2, low + 3], model.end_ids[0], max_new_tokens)
