"""Tool calls of the simulator's replies: prompts rendered with the example tokenizer's chat
template (tools declared), the replies planned in-process and served by the ASGI app.

The ids decode (the example tokenizer joins tokens with spaces) to a Kimi call id that reads
`functions.NAME:IDX` once the whitespace is removed, and to arguments that `json.loads`
reads as they are: keys and string values carry a space on each side (`" location "`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from workbench.profiles import ModelProfile, get_profile
from workbench.sim import SimConfig, add_sim_arguments, config_from_args, create_app
from workbench.sim.drift import diverge
from workbench.sim.outputs import PlannedOutput, output_seed, plan_output, render_text
from workbench.sim.profiles import get_sim_profile
from workbench.sim.tools import plan_call, read_prompt
from workbench.tokenizer import encode_messages, load_tokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "tokenizer"
KIMI = get_profile("kimi-k2.5")
QWEN = get_profile("qwen3")
SHAPE = get_sim_profile("fast").output
SEEDS = range(300)


def schema(name: str, description: str, **params: str) -> dict[str, Any]:
    """An OpenAI tool schema; `params` maps each parameter to its JSON Schema type."""
    properties: dict[str, Any] = {}
    for param, kind in params.items():
        items = {"items": {"type": "string"}} if kind == "array" else {}
        properties[param] = {"type": kind, **items, "description": f"the {param}"}
    parameters = {"type": "object", "properties": properties, "required": list(params)[:1]}
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [
    schema("get_weather", "Get the current weather for a city", location="string",
           unit="string"),
    schema("search_recipes", "Search recipes by ingredients", ingredients="array",
           diet="string"),
    schema("calculate_tip", "Calculate the tip for a bill", bill_amount="number",
           tip_percentage="integer", include_symbols="boolean"),
]
PARAMETERS = {
    "get_weather": {"location", "unit"},
    "search_recipes": {"ingredients", "diet"},
    "calculate_tip": {"bill_amount", "tip_percentage", "include_symbols"},
}
ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "What is the weather in Paris today?"}]
CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}
RESULT = {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather",
          "content": '{"temperature": 20}'}
AFTER_RESULT = [*ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}, RESULT]
SECOND_ASK = [*AFTER_RESULT, {"role": "assistant", "content": "It is sunny."},
              {"role": "user", "content": "Find a recipe with rice for dinner."}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(TOKENIZER)


def prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any] | None = TOOLS,
           thinking: bool = True) -> list[int]:
    return encode_messages(tokenizer, messages, {"thinking": thinking}, tools)


def reply(model: ModelProfile, ids: list[int], seed: int, rate: float = 0.7,
          max_new_tokens: int = 100_000) -> PlannedOutput:
    """The reply the server plans (server.start_job): the call, then the output around it."""
    call = plan_call(model, ids, seed, rate)
    return plan_output(model, SHAPE, seed, max_new_tokens, call)


def seed_of(ids: list[int], sample: int) -> int:
    return output_seed(0, ids, 0.7, 0.9, 20, sample)


def kimi_calls(tokenizer: Any, ids: list[int]) -> list[tuple[str, str]]:
    """(call id without whitespace, arguments text) of each call in a Kimi reply."""
    markers = KIMI.tool_markers
    assert markers is not None and markers.argument_begin is not None
    calls = []
    for at, token in enumerate(ids):
        if token == markers.call_begin:
            cut = ids.index(markers.argument_begin, at)
            end = ids.index(markers.call_end, cut)
            call_id = "".join(tokenizer.decode(ids[at + 1 : cut]).split())
            calls.append((call_id, tokenizer.decode(ids[cut + 1 : end])))
    return calls


def stripped(arguments: str) -> dict[str, Any]:
    """The arguments' JSON object, its keys and string values without their spaces."""
    data = json.loads(arguments)
    return {key.strip(): value.strip() if isinstance(value, str) else value
            for key, value in data.items()}


# --- reading the prompt --------------------------------------------------------------------


def test_the_prompt_declares_its_tools_and_parameters(tokenizer: Any) -> None:
    read = read_prompt(prompt(tokenizer, ASK))
    assert read is not None and read.user_last and read.calls_before == 0
    found = {tokenizer.decode(list(tool.name)): {tokenizer.decode(list(key)): kind
                                                 for key, kind in tool.parameters}
             for tool in read.tools}
    assert found == {
        "get_weather": {"location": "string", "unit": "string"},
        "search_recipes": {"ingredients": "array", "diet": "string"},  # not `items`
        "calculate_tip": {"bill_amount": "number", "tip_percentage": "integer",
                          "include_symbols": "boolean"},
    }
    assert {"weather", "paris"} <= read.user_words


def test_who_spoke_last(tokenizer: Any) -> None:
    after = read_prompt(prompt(tokenizer, AFTER_RESULT))
    assert after is not None and not after.user_last and after.calls_before == 1
    second = read_prompt(prompt(tokenizer, SECOND_ASK))
    assert second is not None and second.user_last and "rice" in second.user_words
    assert read_prompt(prompt(tokenizer, ASK, tools=None)) is None


# --- replying with calls -------------------------------------------------------------------


def test_a_share_of_replies_call_a_declared_tool_in_kimis_format(tokenizer: Any) -> None:
    ids = prompt(tokenizer, ASK)
    markers = KIMI.tool_markers
    assert markers is not None
    calls = parallel = 0
    for sample in SEEDS:
        out = reply(KIMI, ids, seed_of(ids, sample))
        if out.finish == "length":
            continue
        assert out.finish == "stop" and out.matched == KIMI.end_ids[0] == out.output_ids[-1]
        if markers.section_begin not in out.output_ids:
            continue
        calls += 1
        answer = out.output_ids[out.output_ids.index(KIMI.think_end) + 1 :]
        section = answer[answer.index(markers.section_begin) :]
        assert section[1] == markers.call_begin and section[-2:] == [markers.section_end,
                                                                      KIMI.end_ids[0]]
        found = kimi_calls(tokenizer, section)
        parallel += len(found) == 2
        for index, (call_id, arguments) in enumerate(found):
            name = call_id.removeprefix("functions.").rsplit(":", 1)[0]
            assert call_id == f"functions.{name}:{index}" and name in PARAMETERS
            assert set(stripped(arguments)) == PARAMETERS[name]
        assert found[0][0] == "functions.get_weather:0"  # the user asked about the weather
    assert 0.55 * len(SEEDS) <= calls <= 0.85 * len(SEEDS)
    assert 0.08 * calls <= parallel <= 0.35 * calls


def test_argument_values_follow_the_parameter_types(tokenizer: Any) -> None:
    ids = prompt(tokenizer, [ASK[0], {"role": "user", "content": "Calculate the tip for me."}])
    values = []
    for sample in range(40):
        out = reply(KIMI, ids, seed_of(ids, sample), rate=1.0)
        values += [stripped(arguments) for call_id, arguments in kimi_calls(tokenizer,
                   out.output_ids) if call_id.startswith("functions.calculate_tip:")]
    assert len(values) > 30 and all(set(value) == PARAMETERS["calculate_tip"] for value in values)
    for value in values:
        assert isinstance(value["bill_amount"], int) and isinstance(value["tip_percentage"], int)
        assert isinstance(value["include_symbols"], bool)


def test_later_calls_are_numbered_after_the_prompts_calls(tokenizer: Any) -> None:
    ids = prompt(tokenizer, SECOND_ASK)
    out = next(o for o in (reply(KIMI, ids, seed_of(ids, s), rate=1.0) for s in SEEDS)
               if o.finish == "stop")
    found = kimi_calls(tokenizer, out.output_ids)
    assert found[0][0] == "functions.search_recipes:1"  # rice, a recipe: the second call
    assert stripped(found[0][1])["ingredients"]


def test_after_a_tool_result_the_model_answers(tokenizer: Any) -> None:
    ids = prompt(tokenizer, AFTER_RESULT)
    markers = set(KIMI.reply_special_ids)
    for sample in range(50):
        seed = seed_of(ids, sample)
        assert plan_call(KIMI, ids, seed, 1.0) is None
        assert not markers & set(reply(KIMI, ids, seed, rate=1.0).output_ids)


def test_without_tools_replies_are_unchanged(tokenizer: Any) -> None:
    ids = prompt(tokenizer, ASK, tools=None)
    for sample in range(50):
        seed = seed_of(ids, sample)
        assert plan_call(KIMI, ids, seed, 1.0) is None
        assert reply(KIMI, ids, seed, rate=1.0) == plan_output(KIMI, SHAPE, seed, 100_000)
    assert plan_call(KIMI, "a text prompt", 1, 1.0) is None


def test_replies_that_do_not_call_are_unchanged(tokenizer: Any) -> None:
    ids = prompt(tokenizer, ASK)
    for sample in range(50):
        seed = seed_of(ids, sample)
        if plan_call(KIMI, ids, seed, 0.7) is None:
            assert reply(KIMI, ids, seed) == plan_output(KIMI, SHAPE, seed, 100_000)
        assert reply(KIMI, ids, seed) == reply(KIMI, ids, seed)  # deterministic
        assert plan_call(KIMI, ids, seed, 0.0) is None


def test_a_call_cut_by_max_new_tokens_finishes_with_length(tokenizer: Any) -> None:
    ids = prompt(tokenizer, ASK, thinking=False)
    seed = next(seed_of(ids, s) for s in SEEDS if plan_call(KIMI, ids, seed_of(ids, s), 1.0))
    full = reply(KIMI, ids, seed, rate=1.0)
    section = full.output_ids.index(163595)
    cut = reply(KIMI, ids, seed, rate=1.0, max_new_tokens=section + 4)
    assert cut.finish == "length" and cut.matched is None
    assert cut.output_ids == full.output_ids[: section + 4]


def test_qwen3_calls_are_json_in_tool_call_tags(tokenizer: Any) -> None:
    ids = prompt(tokenizer, ASK)
    markers = QWEN.tool_markers
    assert markers is not None
    seen = 0
    for sample in range(60):
        out = reply(QWEN, ids, seed_of(ids, sample), rate=1.0)
        if out.finish != "stop":
            continue
        begin = out.output_ids.index(markers.call_begin)
        end = out.output_ids.index(markers.call_end)
        data = json.loads(tokenizer.decode(out.output_ids[begin + 1 : end]))
        name = data[" name "].strip()
        assert name in PARAMETERS and set(stripped(json.dumps(data[" parameters "]))) == \
            PARAMETERS[name]
        seen += 1
    assert seen > 30


def test_drift_leaves_a_call_whole(tokenizer: Any) -> None:
    ids = prompt(tokenizer, ASK)
    out = next(o for o in (reply(KIMI, ids, seed_of(ids, s), rate=1.0) for s in SEEDS)
               if o.finish == "stop")
    section = out.output_ids.index(163595)
    flipped = diverge(out.output_ids, 0, KIMI, 5)
    assert flipped[section:] == out.output_ids[section:]
    assert flipped[:section] != out.output_ids[:section]


# --- served ------------------------------------------------------------------------------


def test_the_flag_sets_the_rate() -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    assert config_from_args(parser.parse_args(["--tool-call-rate", "0.25"])).tool_call_rate == 0.25
    assert config_from_args(parser.parse_args([])).tool_call_rate is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--tool-call-rate", "1.5"])


@pytest.mark.anyio
async def test_generate_answers_with_a_call(tokenizer: Any) -> None:
    transport = httpx.ASGITransport(app=create_app(SimConfig(tool_call_rate=1.0)))
    ids = prompt(tokenizer, ASK)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4000, "temperature": 0}}
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        replies = [(await client.post("/generate", json={**body, "sampling_params": {
            **body["sampling_params"], "temperature": 0.7}, "rid": str(n)})).json()
            for n in range(6)]
    stopped = [r for r in replies if r["meta_info"]["finish_reason"]["type"] == "stop"]
    assert stopped
    for one in stopped:
        assert one["meta_info"]["finish_reason"]["matched"] == KIMI.end_ids[0]
        assert kimi_calls(tokenizer, one["output_ids"])[0][0] == "functions.get_weather:0"
        assert "tool_call" not in one["text"]  # special tokens skipped in the text
        assert "functions . get_weather : 0" in one["text"]
    assert "<|tool_call_begin|>" in render_text(stopped[0]["output_ids"], KIMI)
