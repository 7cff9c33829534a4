"""The fidelity probe in a sweep: the same prompts at temperature 0 to every configuration.

After a configuration's points (its caches as the load left them: a prefix read back from a
host tier is read back here too), `FidelityParams.prompts` of the load's prompts (a seeded
draw) are sent `concurrency` at a time with `return_logprob`,
`max_new_tokens` each; the replies go to ``CONFIG/probe.jsonl`` (one line per prompt: its
`sample_id`, `output_ids` and the chosen tokens' `logprobs`, or the `error` that ended it).
The baseline configuration is started once more after its points and probed again on the
fresh server (``probe-again.jsonl``): its own noise floor. :func:`sweep_fidelity` reads them back as each
configuration's :class:`~workbench.tune.fidelity.Drift` against the baseline's first probe.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from workbench.errors import RequestFailed
from workbench.rundir.files import write_atomic
from workbench.server.client import SGLangClient
from workbench.tune.fidelity import Drift, ProbeReply, drift
from workbench.tune.load import LoadPrompt
from workbench.tune.measurement import PointResult
from workbench.tune.parameters import FidelityParams

__all__ = [
    "PROBE_AGAIN_FILE",
    "PROBE_FILE",
    "ConfigFidelity",
    "ProbeLine",
    "probe_set",
    "read_probe",
    "run_probe",
    "sweep_fidelity",
    "with_fidelity",
    "write_probe",
]

PROBE_FILE = "probe.jsonl"
PROBE_AGAIN_FILE = "probe-again.jsonl"


class ProbeLine(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One probe prompt's reply (or the error that ended it)."""

    sample_id: int | str
    output_ids: list[int] = []
    logprobs: list[float] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ConfigFidelity:
    """A configuration's drift against the baseline's first probe, and the baseline's own
    (its noise floor); None where a probe is missing."""

    drift: Drift | None
    floor: Drift | None


def probe_set(prompts: Sequence[LoadPrompt], params: FidelityParams) -> list[LoadPrompt]:
    """`params.prompts` of the load's prompts, drawn with `params.seed` (all when fewer)."""
    count = min(params.prompts, len(prompts))
    return random.Random(params.seed).sample(list(prompts), count)


def _payload(prompt: LoadPrompt, params: FidelityParams) -> dict[str, Any]:
    body: dict[str, Any] = ({"input_ids": prompt.input_ids} if prompt.input_ids is not None
                            else {"text": prompt.text})
    return {**body, "sampling_params": {"temperature": 0.0,
                                        "max_new_tokens": params.max_new_tokens},
            "return_logprob": True, "logprob_start_len": -1}


async def run_probe(client: SGLangClient, prompts: Sequence[LoadPrompt],
                    params: FidelityParams) -> tuple[list[ProbeLine], float]:
    """The probe's replies (in prompt order) and how long it took (seconds)."""
    gate = asyncio.Semaphore(params.concurrency)
    started = time.perf_counter()

    async def one(prompt: LoadPrompt) -> ProbeLine:
        async with gate:
            try:
                result = await client.generate(_payload(prompt, params))
            except RequestFailed as exc:
                return ProbeLine(sample_id=prompt.sample_id, error=str(exc)[:500])
        return ProbeLine(sample_id=prompt.sample_id, output_ids=result.output_ids,
                         logprobs=result.output_logprobs)

    lines = await asyncio.gather(*(one(p) for p in prompts))
    return list(lines), time.perf_counter() - started


def write_probe(path: Path, lines: Sequence[ProbeLine]) -> None:
    encoder = msgspec.json.Encoder()
    write_atomic(path, b"".join(encoder.encode(line) + b"\n" for line in lines))


def read_probe(path: Path) -> dict[str, ProbeReply] | None:
    """The answered prompts of a probe file by sample id; None without the file (an
    unreadable line is left out, like an unanswered prompt)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    decoder = msgspec.json.Decoder(ProbeLine)
    replies: dict[str, ProbeReply] = {}
    for raw in data.splitlines():
        try:
            line = decoder.decode(raw)
        except msgspec.DecodeError:
            continue
        if line.error is None:
            replies[str(line.sample_id)] = ProbeReply(line.output_ids, line.logprobs)
    return replies


def _drift(base: Mapping[str, ProbeReply] | None,
           other: Mapping[str, ProbeReply] | None) -> Drift | None:
    if not base or not other:
        return None
    try:
        return drift(base, other)
    except ValueError:
        return None


def sweep_fidelity(out: Path, configs: Sequence[str],
                   baseline: str | None) -> dict[str, ConfigFidelity]:
    """Each configuration's drift against `baseline`'s first probe (the baseline's own is
    its second probe's), with the noise floor; empty without a baseline probe."""
    if baseline is None:
        return {}
    base = read_probe(out / baseline / PROBE_FILE)
    if base is None:
        return {}
    floor = _drift(base, read_probe(out / baseline / PROBE_AGAIN_FILE))
    found = {}
    for config in configs:
        other = (read_probe(out / config / PROBE_AGAIN_FILE) if config == baseline
                 else read_probe(out / config / PROBE_FILE))
        found[config] = ConfigFidelity(_drift(base, other), floor)
    return found


def with_fidelity(results: Sequence[PointResult], fidelity: Mapping[str, ConfigFidelity]) -> None:
    """Set each point's fidelity columns from its configuration's probe (in place)."""
    for result in results:
        found = fidelity.get(result.config)
        measured = found.drift if found is not None else None
        floor = found.floor if found is not None else None
        result.identical_share = None if measured is None else round(measured.identical_share, 4)
        result.first_divergence = (None if measured is None or measured.mean_first_divergence
                                   is None else round(measured.mean_first_divergence, 1))
        result.agreement = None if measured is None else round(measured.agreement, 4)
        result.logprob_diff = (None if measured is None or measured.logprob_diff is None
                               else round(measured.logprob_diff, 5))
        result.floor_identical_share = None if floor is None else round(floor.identical_share, 4)
