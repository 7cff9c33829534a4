"""The simulator's output fidelity at temperature 0: fp8 KV flips replies at a rate that grows
with the position, bf16 kernels' batch dependence gives a small noise floor that
--enable-deterministic-inference removes (at a step-time cost), and a corrupted host-tier
prefix flips a reply from its first token."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from workbench.profiles import get_profile
from workbench.sim import SimConfig, create_app
from workbench.sim.drift import DriftSettings, diverge, flip_at, perturbed
from workbench.sim.profiles import Fidelity, flip_position, get_sim_profile, step_seconds
from workbench.tune.fidelity import ProbeReply, drift

FIDELITY = Fidelity()
PROMPTS = [[100 + i, 200 + i, 300 + (i * 7) % 50] for i in range(120)]


def test_the_flip_law() -> None:
    """P(flipped by L) = 1 - exp(-rate * (L/1000)^2), drawn per key."""
    keys = [f"k{i}".encode() for i in range(20_000)]
    positions = [flip_position(k, 0.5) for k in keys]
    for length in (400, 1000, 2000):
        share = sum(p < length for p in positions) / len(positions)
        assert share == pytest.approx(1 - math.exp(-0.5 * (length / 1000) ** 2), abs=0.01)
    assert flip_position(b"k1", 0.5) == positions[1]  # the same key, the same place
    assert flip_position(b"k1", 0.0) == math.inf


def test_where_a_reply_flips() -> None:
    fp8 = DriftSettings(fp8=True, deterministic=True)
    bf16 = DriftSettings(fp8=False, deterministic=True)
    seeds = range(5000)
    assert all(flip_at(FIDELITY, bf16, s, batch=3, host_hit=False) is None for s in seeds)
    flips = [flip_at(FIDELITY, fp8, s, batch=3, host_hit=False) for s in seeds]
    assert flips == [flip_at(FIDELITY, fp8, s, batch=9, host_hit=False) for s in seeds]
    assert sum(f is not None and f < 512 for f in flips) / 5000 == pytest.approx(0.41, abs=0.02)
    # batch dependence: the same prompt in another batch may part; the same batch does not
    noisy = DriftSettings(fp8=False, deterministic=False)
    alone = [flip_at(FIDELITY, noisy, s, batch=0, host_hit=False) for s in seeds]
    assert alone == [flip_at(FIDELITY, noisy, s, batch=0, host_hit=False) for s in seeds]
    assert sum(f is not None and f < 1000 for f in alone) / 5000 == pytest.approx(0.05, abs=0.01)
    # a corrupted host-tier prefix flips at 0, at the fault's rate, only when read from host
    corrupt = DriftSettings(fp8=False, deterministic=True, corrupt_rate=0.3)
    hits = [flip_at(FIDELITY, corrupt, s, batch=0, host_hit=True) for s in seeds]
    assert set(hits) == {0, None} and hits.count(0) / 5000 == pytest.approx(0.3, abs=0.02)
    assert all(flip_at(FIDELITY, corrupt, s, batch=0, host_hit=False) is None for s in seeds)


def test_a_flip_rewrites_the_content_from_there_and_keeps_the_shape() -> None:
    model = get_profile("kimi-k2.5")
    assert model.think_end is not None
    ids = [5000 + i for i in range(10)] + [model.think_end] + [6000 + i for i in range(5)]
    reply = [*ids, model.end_ids[0]]
    out = diverge(reply, 4, model, seed=7)
    assert out[:4] == reply[:4]
    assert all(a != b for a, b in zip(out[4:10], reply[4:10], strict=True))
    assert out[10] == model.think_end and out[-1] == model.end_ids[0] and len(out) == len(reply)
    assert diverge(reply, 99, model, seed=7) == reply


def test_fp8_moves_logprobs_within_its_noise() -> None:
    moved = [perturbed(-1.0, p, 42, 0.03) for p in range(1000)]
    assert all(abs(m + 1.0) <= 0.03 for m in moved) and len(set(moved)) > 900
    assert perturbed(-1.0, 3, 42, 0.0) == -1.0 and perturbed(-0.01, 3, 42, 0.5) < 0


def test_deterministic_inference_costs_step_time() -> None:
    profile = get_sim_profile("fast")
    plain = step_seconds(profile, "bf16", 8, 100, 0)
    assert step_seconds(profile, "bf16", 8, 100, 0, deterministic=True) == pytest.approx(
        plain * FIDELITY.deterministic_step_factor)


async def probe(config: SimConfig) -> dict[str, ProbeReply]:
    """The probe prompts one at a time (the same batch each time), at temperature 0."""
    replies = {}
    transport = httpx.ASGITransport(app=create_app(config))
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        for index, prompt in enumerate(PROMPTS):
            body: dict[str, Any] = {"input_ids": prompt, "return_logprob": True,
                                    "sampling_params": {"temperature": 0.0, "max_new_tokens": 400,
                                                        "ignore_eos": True}}
            meta = (await client.post("/generate", json=body)).json()["meta_info"]
            logprobs = [entry[0] for entry in meta["output_token_logprobs"]]
            ids = [entry[1] for entry in meta["output_token_logprobs"]]
            replies[str(index)] = ProbeReply(ids, logprobs)
    return replies


@pytest.mark.anyio
async def test_a_probe_of_fp8_against_bf16_over_http() -> None:
    def config(**more: Any) -> SimConfig:
        return SimConfig(profile="fast", speed=1000.0, **more)

    bf16 = await probe(config(kv_cache_dtype="bf16"))
    again = await probe(config(kv_cache_dtype="bf16"))
    fp8 = await probe(config(kv_cache_dtype="fp8_e4m3"))
    floor = drift(bf16, again)
    assert floor.identical_share == 1.0  # one at a time: the same batch, the same replies
    measured = drift(bf16, fp8)
    expected = 1 - math.exp(-FIDELITY.fp8_flip_rate * 0.4**2)  # flipped by token 400: 27%
    assert measured.differing_share == pytest.approx(expected, abs=0.1)
    assert measured.mean_first_divergence is not None and measured.mean_first_divergence > 100
    assert measured.logprob_diff is not None
    assert 0.005 < measured.logprob_diff <= FIDELITY.fp8_logprob_noise
