"""SGLang's --max-total-tokens and --disable-radix-cache in the simulator, and simulator
profiles read from YAML files (as `workbench tune fit` writes them)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from workbench.errors import ConfigError
from workbench.server.metrics import cache_hit_rate, parse_metrics
from workbench.sim import SimConfig, add_sim_arguments, config_from_args, create_app
from workbench.sim.profiles import (
    get_sim_profile,
    load_sim_profile,
    plan_sizing,
    profile_yaml,
)
from workbench.sim.request import Request
from workbench.sim.server import SimServer


def client_for(config: SimConfig) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(config)),
                             base_url="http://sim")


def metric(text: str, name: str) -> float:
    values = [sample.value for family in text_string_to_metric_families(text)
              for sample in family.samples if sample.name == name]
    assert values, f"{name} missing from /metrics"
    return sum(values)


# --- --max-total-tokens ----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
async def test_max_total_tokens_is_the_pool_in_server_info_and_metrics(path: str) -> None:
    async with client_for(SimConfig(enable_metrics=True, max_total_tokens=5000)) as client:
        info = (await client.get(path)).json()
        text = (await client.get("/metrics")).text
    assert info["max_total_tokens"] == 5000  # the flag, under SGLang's name
    assert info["max_total_num_tokens"] == 5000  # the pool it gives
    assert info["max_req_input_len"] == 4999
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] == 5000
    assert metric(text, "sglang:max_total_num_tokens") == 5000


@pytest.mark.anyio
async def test_without_the_flag_the_pool_comes_from_memory() -> None:
    expected = plan_sizing(get_sim_profile("fast"), mem_fraction_static=0.80,
                           kv_cache_dtype="auto", tp_size=1, enable_hierarchical_cache=False,
                           hicache_size_gb=0, hicache_ratio=2, max_running_requests=None,
                           chunked_prefill_size=None).max_total_num_tokens
    async with client_for(SimConfig(enable_metrics=True)) as client:
        info = (await client.get("/server_info")).json()
        text = (await client.get("/metrics")).text
    assert info["max_total_tokens"] is None
    assert info["max_total_num_tokens"] == expected == metric(text, "sglang:max_total_num_tokens")


def test_a_pool_larger_than_memory_keeps_the_memory_one_with_sglangs_warning() -> None:
    lines: list[str] = []
    dense = SimServer(SimConfig(profile="dense-8b-1x24gb"))
    asked = dense.sizing.max_total_num_tokens * 10
    server = SimServer(SimConfig(profile="dense-8b-1x24gb", max_total_tokens=asked),
                       log=lines.append)
    assert server.sizing.max_total_num_tokens == dense.sizing.max_total_num_tokens
    warning = (f"max_total_tokens={asked} is larger than the profiled value "
               f"{dense.sizing.max_total_num_tokens}. Use the profiled value instead.")
    assert lines == [warning]


def test_the_memory_check_still_applies_with_a_pool_given() -> None:
    with pytest.raises(ConfigError, match="out of memory: activations"):
        SimServer(SimConfig(profile="dense-8b-1x24gb", mem_fraction_static=0.97,
                            max_total_tokens=1000))


def admitted_after_one_step(config: SimConfig, count: int) -> tuple[int, int]:
    """(running, waiting) once `count` requests of 100 prompt tokens (100 new tokens each)
    have met one scheduler step of the server's engine."""
    engine = SimServer(config).engines[0]
    for index in range(count):
        engine.submit(Request(100, list(range(100)), 100, hashes=[index]))
    engine.step()
    return len(engine.running), len(engine.waiting)


def test_the_pool_limits_admission() -> None:
    assert admitted_after_one_step(SimConfig(), 20) == (20, 0)
    # each needs its 100 tokens plus 0.7 x 100 reserved for its output: 5 of 170 fit in 1,000
    running, waiting = admitted_after_one_step(SimConfig(max_total_tokens=1000), 20)
    assert (running, waiting) == (5, 15)


def test_the_flags_parse_with_sglangs_spellings() -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    config = config_from_args(parser.parse_args(["--max-total-tokens", "16384",
                                                 "--disable-radix-cache"]))
    assert config.max_total_tokens == 16384 and config.disable_radix_cache
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-total-tokens", "0"])


# --- --disable-radix-cache -------------------------------------------------------------------


async def cached_twice(config: SimConfig) -> tuple[list[int], dict[str, Any], str]:
    body = {"input_ids": list(range(100, 400)), "sampling_params": {"max_new_tokens": 8}}
    async with client_for(config) as client:
        before = (await client.get("/metrics")).text
        cached = [(await client.post("/generate", json=body)).json()["meta_info"]["cached_tokens"]
                  for _ in range(2)]
        info = (await client.get("/server_info")).json()
        after = (await client.get("/metrics")).text
    rate = cache_hit_rate(parse_metrics(after), parse_metrics(before))
    return cached, info, f"{rate}"


@pytest.mark.anyio
async def test_without_the_radix_cache_nothing_is_reused() -> None:
    cached, info, rate = await cached_twice(SimConfig(enable_metrics=True))
    assert cached == [0, 256] and info["disable_radix_cache"] is False and rate != "0.0"
    cached, info, rate = await cached_twice(SimConfig(enable_metrics=True,
                                                      disable_radix_cache=True))
    assert cached == [0, 0]
    assert info["disable_radix_cache"] is True
    assert rate == "0.0"


# --- profiles from files ---------------------------------------------------------------------


def write_profile(folder: Path, **changes: Any) -> Path:
    data = msgspec.to_builtins(get_sim_profile("dense-8b-1x24gb"))
    for key, value in changes.items():
        where = data
        *parents, last = key.split(".")
        for part in parents:
            where = where[part]
        if value is None:
            del where[last]
        else:
            where[last] = value
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_profile_round_trips_through_its_yaml(tmp_path: Path) -> None:
    profile = get_sim_profile("kimi-k2.5-8xrtx6000")
    path = tmp_path / "kimi.yml"
    path.write_text(profile_yaml(profile, "fitted on nothing\nsecond line"))
    assert path.read_text().startswith("# fitted on nothing\n# second line\nname: kimi-k2.5")
    assert get_sim_profile(str(path)) == profile == load_sim_profile(path)


@pytest.mark.parametrize(("changes", "key", "needle"), [
    ({"step_base": 3.0}, "step_base", "unknown key (known: activation_gb"),
    ({"step_per_req_ms": -1.0}, "step_per_req_ms", ">= 0"),
    ({"output.unclosed_rate": 2.0}, "output.unclosed_rate", "<= 1"),
    ({"output.colour": "red"}, "output.colour", "unknown key (known: answer_median"),
    ({"context_length": None}, "context_length", "missing required key"),
    ({"auto_kv_dtype": "fp4"}, "auto_kv_dtype", "expected one of bf16"),
])
def test_profile_file_errors_name_the_file_and_the_key(
        tmp_path: Path, changes: dict[str, Any], key: str, needle: str) -> None:
    path = write_profile(tmp_path, **changes)
    with pytest.raises(ConfigError) as caught:
        get_sim_profile(str(path))
    message = str(caught.value)
    assert message.startswith(str(path)), message
    assert needle in message
    assert f": {key}: " in message
    if "missing" not in message:
        assert re.match(rf"{re.escape(str(path))}:\d+: ", message), message  # and its line


def test_a_missing_profile_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        SimConfig(profile=str(tmp_path / "nowhere.yaml"))


@pytest.mark.anyio
async def test_the_simulator_runs_a_profile_file(tmp_path: Path) -> None:
    path = write_profile(tmp_path, context_length=5000, step_base_ms=2.0)
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    config = config_from_args(parser.parse_args(["--profile", str(path)]))
    async with client_for(config) as client:
        info = (await client.get("/server_info")).json()
        reply = (await client.post("/generate", json={
            "input_ids": list(range(100, 110)), "sampling_params": {"max_new_tokens": 4}})).json()
    assert info["profile"] == str(path) and info["context_length"] == 5000
    assert reply["meta_info"]["completion_tokens"] == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--profile", "no-such-profile"])


def test_a_shape_that_never_stops_cuts_every_reply_at_max_new_tokens() -> None:
    """What a fitted profile uses when the measured server ran every reply to the limit."""
    from workbench.profiles import PROFILES as MODELS
    from workbench.sim.outputs import plan_output
    from workbench.sim.profiles import OutputShape

    shape = OutputShape(1e6, 0.01, 1e6, 0.01, unclosed_rate=1.0)
    for model in MODELS.values():
        for seed in range(20):
            plan = plan_output(model, shape, seed, 37)
            assert (plan.finish, len(plan.output_ids)) == ("length", 37), model.name
