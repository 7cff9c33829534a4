"""Turns: which turns a row asks for, each turn's history against the model's own replies,
the tool results paired with the model's calls, and why a conversation ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workbench.chat import (
    END_REASONS,
    ChatRow,
    Ended,
    Reply,
    ToolCall,
    generation_points,
    last_turn_messages,
    next_turn,
    parse_messages,
    parse_reply,
)
from workbench.profiles import get_profile
from workbench.tokenizer import decode, encode_messages, load_tokenizer

TOKENIZER = str(Path(__file__).resolve().parents[2] / "examples" / "tokenizer")
THINK_END, IM_END = 163607, 163586
SECTION, SECTION_END, CALL, ARGS, CALL_END = 163595, 163596, 163597, 163598, 163599


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def calls(*names: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": name, "arguments": "{}"}} for name in names]}


def result(text: str, **fields: Any) -> dict[str, Any]:
    return {"role": "tool", "content": text, **fields}


def said(text: str, reasoning: str | None = "i think") -> Reply:
    return Reply(reasoning, text, (), None)


def called(*names: str, reasoning: str | None = "i think") -> Reply:
    return Reply(reasoning, "", tuple(ToolCall(f"call_{i}", n, '{"x": 1}')
                                     for i, n in enumerate(names)), None)


def row_of(*messages: dict[str, Any]) -> ChatRow:
    return parse_messages(list(messages), None)


PLAIN = row_of({"role": "system", "content": "be brief"}, user("one"), answer("data one"),
               user("two"), answer("data two"), user("three"))
TOOL_LOOP = row_of(user("weather in paris?"), calls("get_weather"), result("sunny"),
                   answer("it is sunny"), user("thanks"), answer("you are welcome"))


# ------------------------------------------------------------------------- the turns asked


def test_generation_points() -> None:
    assert generation_points(PLAIN, "last") == 1
    assert generation_points(PLAIN, "each") == 3  # two answers, and the last user turn
    assert generation_points(TOOL_LOOP, "each") == 3
    assert generation_points(row_of(user("x"), calls("f"), result("r")), "each") == 2
    assert generation_points(row_of({"role": "system", "content": "s"}), "each") == 0


def test_last_turn_drops_trailing_answers() -> None:
    assert last_turn_messages(TOOL_LOOP) == TOOL_LOOP.messages[:5]
    assert last_turn_messages(PLAIN) == PLAIN.messages
    assert last_turn_messages(row_of(answer("a"), answer("b"))) == []


# --------------------------------------------------------------------------------- histories


def test_a_plain_chat_is_answered_turn_by_turn_with_the_models_own_replies() -> None:
    assert next_turn(PLAIN, []) == PLAIN.messages[:2]
    mine = [said("my one"), said("my two"), said("my three")]
    assert next_turn(PLAIN, mine[:1]) == [
        *PLAIN.messages[:2],
        {"role": "assistant", "content": "my one", "reasoning_content": "i think"},
        user("two"),
    ]
    history = next_turn(PLAIN, mine[:2])
    assert isinstance(history, list)
    assert [m["content"] for m in history] == ["be brief", "one", "my one", "two", "my two",
                                               "three"]
    assert next_turn(PLAIN, mine) is None


def test_a_tool_loop_pairs_the_data_result_with_the_models_call() -> None:
    history = next_turn(TOOL_LOOP, [called("get_weather")])
    assert history == [
        user("weather in paris?"),
        {"role": "assistant", "content": "", "reasoning_content": "i think", "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_0", "name": "get_weather"},
    ]
    later = next_turn(TOOL_LOOP, [called("get_weather"), said("sunny it is")])
    assert isinstance(later, list)
    assert later[3:] == [{"role": "assistant", "content": "sunny it is",
                          "reasoning_content": "i think"}, user("thanks")]
    assert next_turn(TOOL_LOOP, [called("get_weather"), said("a"), said("b")]) is None


def test_parallel_calls_take_their_results_by_name() -> None:
    row = row_of(user("paris weather and stock?"), calls("get_weather", "get_stock_price"),
                 result("up", name="get_stock_price"), result("sunny", name="get_weather"),
                 answer("sunny and up"))
    history = next_turn(row, [called("get_weather", "get_stock_price")])
    assert isinstance(history, list)
    assert [(m["tool_call_id"], m["name"], m["content"]) for m in history[2:]] == [
        ("call_0", "get_weather", "sunny"), ("call_1", "get_stock_price", "up")]


def test_a_results_name_comes_from_the_data_call_its_id_names() -> None:
    row = row_of(user("x"), calls("get_weather", "get_stock_price"),
                 result("up", tool_call_id="functions.get_stock_price:1"),
                 result("sunny", tool_call_id="functions.get_weather:0"))
    history = next_turn(row, [called("get_stock_price", "get_weather")])
    assert isinstance(history, list)
    assert [(m["name"], m["content"]) for m in history[2:]] == [
        ("get_stock_price", "up"), ("get_weather", "sunny")]


def test_a_row_ending_in_a_tool_result_is_answered_after_the_models_call() -> None:
    row = row_of(user("x"), calls("get_weather"), result("sunny"))
    assert next_turn(row, []) == [user("x")]
    history = next_turn(row, [called("get_weather")])
    assert isinstance(history, list) and history[-1]["content"] == "sunny"
    assert next_turn(row, [said("no tool")]) == Ended(
        "no_call", "the data answers with the result of get_weather but the model called no tool")


# ------------------------------------------------------------------------------------ endings

ENDINGS = [
    (TOOL_LOOP, [said("it is sunny, probably")], None,
     Ended("no_call", "the data answers with the result of get_weather but the model called "
                      "no tool")),
    (PLAIN, [called("get_weather")], None,
     Ended("no_result", "the model called get_weather and the data has no result for it")),
    (TOOL_LOOP, [called("get_stock_price")], None,
     Ended("name_mismatch", "the model called get_stock_price and the data's results left are "
                            "for get_weather")),
    (TOOL_LOOP, [called("get_weather", "get_weather")], None,
     Ended("more_calls", "the model made 2 calls and the data has 1 results")),
    (row_of(user("x"), calls("get_weather", "get_stock_price"), result("a"), result("b"),
            answer("c")), [called("get_stock_price")], None,
     Ended("fewer_calls", "the model made 1 calls and the data has 2 results (none for "
                          "get_weather)")),
    (TOOL_LOOP, [Reply("x", "", (), "tool call 1: no <|tool_call_end|>")], None,
     Ended("unparseable", "turn 0: tool call 1: no <|tool_call_end|>")),
    (PLAIN, [said("a"), said("cut sho")], ["stop", "length"],
     Ended("truncated", "turn 1 was cut at max_new_tokens")),
]


@pytest.mark.parametrize(("row", "replies", "finishes", "ended"), ENDINGS,
                         ids=[e.reason for *_, e in ENDINGS])
def test_each_ending(row: ChatRow, replies: list[Reply], finishes: list[str] | None,
                     ended: Ended) -> None:
    assert next_turn(row, replies, finish_reasons=finishes) == ended
    assert ended.reason in END_REASONS


def test_a_cut_last_turn_is_no_ending() -> None:
    assert next_turn(PLAIN, [said("a"), said("b"), said("c")],
                     finish_reasons=["stop", "stop", "length"]) is None


def test_every_end_reason_has_a_meaning() -> None:
    assert set(END_REASONS) == {"no_call", "no_result", "name_mismatch", "more_calls",
                                "fewer_calls", "unparseable", "truncated", "failed", "unrenderable"}
    assert all(meaning and "\n" not in meaning for meaning in END_REASONS.values())


# ------------------------------------------------------ rendered through the chat template


def test_the_template_keeps_reasoning_only_for_the_tool_loop_in_flight() -> None:
    tok = load_tokenizer(TOKENIZER)
    weather = {"name": "get_weather", "description": "the weather", "parameters": {}}
    row = parse_messages([user("weather in paris"), calls("get_weather"), result("sunny"),
                          answer("it is sunny"), user("and in rome"), calls("get_weather"),
                          result("rainy"), answer("rainy")], [weather])

    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def reply(output: list[int]) -> Reply:
        return parse_reply(output, get_profile("kimi-k2.5"), lambda part: decode(tok, part))

    def call(index: int) -> list[int]:
        return [SECTION, CALL, *ids(f"functions.get_weather:{index}"), ARGS, *ids("paris"),
                CALL_END, SECTION_END, IM_END]

    replies = [reply([*ids("first thought"), THINK_END, *call(0)]),
               reply([*ids("second thought"), THINK_END, *ids("it is the weather"), IM_END]),
               reply([*ids("final thought"), THINK_END, *call(1)])]
    assert replies[0].tool_calls[0].name == "get_weather"

    def rendered(turn: int) -> str:
        history = next_turn(row, replies[:turn])
        assert isinstance(history, list)
        return decode(tok, encode_messages(tok, history, {"thinking": True}, tools=row.tools))

    in_flight = rendered(1)
    assert "first thought" in in_flight and "return of functions . get_weather : 0" in in_flight
    assert in_flight.startswith("tool_declare")  # the tools are declared
    finished = rendered(3)
    assert "first thought" not in finished and "second thought" not in finished
    assert "final thought" in finished  # the loop of the turn being generated
    assert "it is the weather" in finished and "it is sunny" not in finished  # the model's own
