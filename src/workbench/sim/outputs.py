"""Deterministic simulated outputs, shaped like a reasoning model's.

A completion for a thinking-mode prompt is: reasoning ids, the think-end id, answer ids, then the
end id (`end_ids[0]`); profiles whose
chat template does not open the reasoning block (`think_in_template=False`) start with the
think-start id, and non-reasoning profiles produce only an answer and the end id. Lengths come
from the simulator profile's `OutputShape`. A seeded fraction (`unclosed_rate`) reasons until
`max_new_tokens`. Anything cut at `max_new_tokens` finishes with "length", otherwise "stop".
A reply that calls tools (`call`, written by `workbench.sim.tools`) holds the call's ids where
the answer would be: reasoning, the think-end id, the call, the end id.

Reasoning and answer are each a seeded walk over the example text's ids (`corpus.json`,
written by scripts/make_examples.py from a public-domain book with the example tokenizer's
vocabulary), close to sampling the text's bigram model (the one `workbench.sim.completion`
scores input logprobs with): from a seeded sentence start the walk copies a run of the text (a
geometric length, `RUN_MEAN` ids on average), then goes on after another occurrence of the
run's last id (`CONTINUE_SHARE` of the moves, so the id pair across the move is one of the
text's) or at any position of the text (the others). So decoded replies read as the book over a
few words, score as likely text, and two seeds' replies share few 3-id shingles: their Jaccard
is about 0.05 at 300 ids, 0.2 at 1,200 and 0.35 at 3,000, at most about 0.45 (near 6,000 ids;
the text holds about 2,000), under the 0.5 of a near duplicate. The same seed, prompt and
sampling parameters always give the same ids (the request id plays no part); a larger
`max_new_tokens` extends, never changes, a shorter output's ids (`text_run` takes one draw
from its generator whatever its length).
`render_text` writes ids as the vocabulary's words (special ids by name), space-separated, as
the example tokenizer decodes them; `tokenize_text` splits text as that tokenizer does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import re
import zlib
from array import array
from importlib import resources
from typing import Literal, NamedTuple

from workbench.profiles import ModelProfile
from workbench.sim.markers import call_format
from workbench.sim.profiles import OutputShape

__all__ = [
    "PlannedOutput",
    "fixed_output",
    "output_seed",
    "plan_output",
    "render_text",
    "text_run",
    "tokenize_text",
]


class PlannedOutput(NamedTuple):
    """The ids a request will generate and how it ends."""

    output_ids: list[int]
    finish: Literal["stop", "length"]
    matched: int | None


def output_seed(
    seed: int,
    prompt: list[int] | str,
    temperature: float,
    top_p: float,
    top_k: int,
    sample: int = 0,
) -> int:
    """A 64-bit seed for one (server seed, prompt, sampling) triple; greedy ignores top_p/top_k.

    `sample` tells apart the n samples of one prompt (0 for the first, as for n = 1).
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(seed.to_bytes(8, "little", signed=True))
    if isinstance(prompt, str):
        digest.update(b"text:" + prompt.encode())
    else:
        digest.update(b"ids:" + array("q", prompt).tobytes())
    sampling = (0.0,) if temperature == 0 else (temperature, top_p, top_k)
    digest.update(repr(sampling).encode())
    if sample:
        digest.update(b"sample:%d" % sample)
    return int.from_bytes(digest.digest(), "little")


def plan_output(
    model: ModelProfile,
    shape: OutputShape,
    seed: int,
    max_new_tokens: int,
    call: list[int] | None = None,
    *,
    thinking: bool = True,
) -> PlannedOutput:
    """The output for one seed, cut at `max_new_tokens`; `call` (a tool call's ids) replaces
    the answer. Without `thinking` (the prompt closed the reasoning block: thinking switched
    off in the chat template) a reasoning model answers at once, as a plain one does."""
    rng = random.Random(seed)
    head = _head(model)
    think_end = model.think_end if thinking else None
    if think_end is not None and rng.random() < shape.unclosed_rate:
        ids = head + text_run(rng, max(0, max_new_tokens - len(head)))
        return PlannedOutput(ids[:max_new_tokens], "length", None)
    answer = _length(rng, shape.answer_median, shape.answer_sigma)
    if think_end is None:
        body = _answer(rng, min(answer, max_new_tokens), max_new_tokens, call)
        return _finish(body, model.end_ids[0], max_new_tokens)
    reasoning = _length(rng, shape.reasoning_median, shape.reasoning_sigma)
    ids = head + text_run(rng, min(reasoning, max_new_tokens))
    if len(ids) < max_new_tokens:
        ids.append(think_end)
        room = max_new_tokens - len(ids)
        ids += _answer(rng, min(answer, room), room, call)
    return _finish(ids, model.end_ids[0], max_new_tokens)


def prompt_thinks(model: ModelProfile, prompt: list[int] | str) -> bool:
    """Whether a prompt leaves the model to reason: False when its generation prompt already
    closed the reasoning block (Kimi's ``<think></think>``, Qwen3's ``<think>\n\n</think>\n\n``
    with thinking off), i.e. a think-end id among its last few ids (for text, ``</think>``
    at its end)."""
    if model.think_end is None:
        return False
    if isinstance(prompt, str):
        return not prompt.rstrip().endswith("</think>")
    return model.think_end not in prompt[-_CLOSED_WITHIN:]


_CLOSED_WITHIN = 4  # ids after the think-end id a closed generation prompt may hold


def _answer(rng: random.Random, length: int, room: int, call: list[int] | None) -> list[int]:
    """`length` ids of the text, or the call's ids when there is one (at most `room`)."""
    return text_run(rng, length) if call is None else call[:room]


def _head(model: ModelProfile) -> list[int]:
    """The think-start id when the completion itself opens the reasoning block."""
    if model.think_in_template or model.think_start is None or model.think_end is None:
        return []
    return [model.think_start]


def _length(rng: random.Random, median: float, sigma: float) -> int:
    return max(1, int(rng.lognormvariate(math.log(median), sigma)))


class Corpus(NamedTuple):
    """The example text: vocabulary (id -> token), the text as ids and its sentence starts."""

    tokens: list[str]
    ids: list[int]
    starts: list[int]
    by_token: dict[str, int]


@functools.cache
def corpus() -> Corpus:
    """The simulator's text, read once from the package's `corpus.json`."""
    data = json.loads(resources.files("workbench.sim").joinpath("corpus.json").read_bytes())
    tokens: list[str] = data["tokens"]
    ids: list[int] = data["text_ids"]
    ends = {i for i, token in enumerate(tokens) if any(mark in token for mark in ".!?")}
    starts = [0] + [at + 1 for at, token in enumerate(ids[:-1]) if token in ends]
    return Corpus(tokens, ids, starts, {token: i for i, token in enumerate(tokens)})


RUN_MEAN = 4.0  # ids the walk copies from the text between moves, on average (geometric)
CONTINUE_SHARE = 0.9  # moves that continue the text after the last id; the others jump anywhere
_CONTINUE_OF_1024 = round(CONTINUE_SHARE * 1024)
_RUN_QUANTILES = 256  # run lengths are drawn from this many quantiles of their geometric law


class _Walk(NamedTuple):
    """The text prepared for the walk of `text_run`."""

    after: tuple[tuple[int, ...], ...]  # id -> the positions just after its occurrences, ascending
    runs: tuple[int, ...]  # _RUN_QUANTILES quantiles of the run length (geometric, mean RUN_MEAN)


@functools.cache
def _walk() -> _Walk:
    text = corpus()
    after: list[list[int]] = [[] for _ in text.tokens]
    for position, token in enumerate(text.ids[:-1]):
        after[token].append(position + 1)
    stay = math.log(1 - 1 / RUN_MEAN)
    runs = tuple(1 + int(math.log1p(-(index + 0.5) / _RUN_QUANTILES) / stay)
                 for index in range(_RUN_QUANTILES))
    return _Walk(tuple(map(tuple, after)), runs)


def text_run(rng: random.Random, count: int) -> list[int]:
    """`count` ids of the text model (module docstring), seeded by one draw from `rng` whatever
    `count` is: a larger `count` extends a smaller one's ids."""
    walker = random.Random(rng.getrandbits(64))
    text, walk = corpus(), _walk()
    at = text.starts[walker.randrange(len(text.starts))]
    out: list[int] = []
    while len(out) < count:
        draw = walker.getrandbits(40)
        piece = text.ids[at : at + walk.runs[draw % _RUN_QUANTILES]]
        out += piece
        at = _moved(walk.after[piece[-1]], at + len(piece), draw >> 8, len(text.ids))
    del out[count:]
    return out


def _moved(after: tuple[int, ...], end: int, draw: int, size: int) -> int:
    """Where the walk goes on from a run ending before `end`, `after` being the positions that
    follow its last id in the text: after another occurrence of that id for CONTINUE_SHARE of
    the 32-bit `draw`s (this one when the text holds no other), else anywhere in the text."""
    pick = draw >> 10
    if not after or draw % 1024 >= _CONTINUE_OF_1024:
        return pick % size
    if len(after) == 1 or end >= size:
        return after[pick % len(after)]
    index = pick % (len(after) - 1)  # among the other occurrences: skip the one at `end`
    return after[index + (after[index] >= end)]


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
    calls = call_format(model)
    if calls is not None:
        names.update(calls.names)
    return names


_WORDS = re.compile(r"\w+|[^\w\s]+")  # the example tokenizer's pre-tokens (words, punctuation)


@functools.cache
def _special_split(model: ModelProfile) -> re.Pattern[str]:
    names = sorted(_special_names(model).values(), key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(name) for name in names) + ")")


def render_text(ids: list[int], model: ModelProfile) -> str:
    """Ids as the example tokenizer decodes them: tokens and special names, space-separated."""
    names = _special_names(model)
    tokens = corpus().tokens
    return " ".join(
        names.get(token) or (tokens[token] if 0 <= token < len(tokens) else f"<{token}>")
        for token in ids
    )


def tokenize_text(text: str, model: ModelProfile) -> list[int]:
    """Text as the example tokenizer encodes it; words outside its vocabulary are hashed in."""
    specials = {name: token for token, name in _special_names(model).items()}
    text_corpus = corpus()
    ids: list[int] = []
    for piece in _special_split(model).split(text):
        if piece in specials:
            ids.append(specials[piece])
            continue
        for word in _WORDS.findall(piece.lower()):
            token = text_corpus.by_token.get(word)
            ids.append(token if token is not None else _hashed(word, len(text_corpus.tokens)))
    return ids


def _hashed(word: str, size: int) -> int:
    return zlib.crc32(word.encode()) % size


def fixed_output(model: ModelProfile, max_new_tokens: int) -> PlannedOutput:
    """The small constant output of the fixed-latency mode: the text's first four ids, the end id."""
    return _finish(corpus().ids[:4], model.end_ids[0], max_new_tokens)
