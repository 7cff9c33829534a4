"""Rows: the OpenAI and ShareGPT layouts read into one layout, tool schemas, bad rows by key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workbench.chat import ChatRow, RowError, parse_conversations, parse_messages, parse_tools
from workbench.chat.rows import SHAREGPT_ROLES

WEATHER = {"name": "get_weather", "description": "the weather", "parameters": {"type": "object"}}
OPENAI_WEATHER = {"type": "function", "function": WEATHER}


def row_error(parse: Any, value: Any, tools: Any = None) -> str:
    with pytest.raises(RowError) as info:
        parse(value, tools)
    assert str(info.value) == f"{info.value.key}: {info.value.message}"
    return str(info.value)


# ---------------------------------------------------------------------------- OpenAI layout


def test_plain_messages_are_kept_as_they_are() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "hello"},
    ]
    assert parse_messages(messages, None) == ChatRow(messages, None)


def test_text_parts_are_joined() -> None:
    content = [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]
    row = parse_messages([{"role": "user", "content": content}], None)
    assert row.messages == [{"role": "user", "content": "a b"}]


def test_tool_calls_get_ids_types_and_string_arguments() -> None:
    row = parse_messages([
        {"role": "user", "content": "weather in paris and rome?"},
        {"role": "assistant", "content": None, "reasoning_content": "two cities",
         "tool_calls": [
             {"function": {"name": "get_weather", "arguments": {"city": "paris"}}},
             {"id": "mine", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "rome"}'}},
         ]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rainy", "name": "get_weather"},
        {"role": "assistant", "tool_calls": [
            {"function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "content": "noon", "tool_call_id": "functions.get_time:2"},
    ], None)
    assistant = row.messages[1]
    assert assistant == {
        "role": "assistant", "content": None, "reasoning_content": "two cities",
        "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}},
            {"id": "mine", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "rome"}'}},
        ],
    }
    assert row.messages[2] == {"role": "tool", "content": "sunny",
                               "tool_call_id": "functions.get_weather:0"}  # paired by order
    assert row.messages[3]["tool_call_id"] == "mine"
    assert row.messages[4]["tool_calls"][0]["id"] == "functions.get_time:2"  # counted in the row


def test_arguments_keep_their_characters() -> None:
    row = parse_messages([{"role": "assistant", "tool_calls": [
        {"function": {"name": "say", "arguments": {"text": "héllo"}}}]}], None)
    assert row.messages[0]["tool_calls"][0]["function"]["arguments"] == '{"text": "héllo"}'


BAD_MESSAGES = [
    ([], "messages: expected a non-empty list, got an empty list"),
    ("hello", "messages: expected a list, got a string"),
    ([{"role": "user", "content": "x"}, "y"], "messages[1]: expected an object, got a string"),
    ([{"content": "x"}], "messages[0].role: expected a string, got null"),
    ([{"role": "robot", "content": "x"}],
     "messages[0].role: unknown role 'robot' (known: system, user, assistant, tool)"),
    ([{"role": "user"}],
     "messages[0].content: expected a string or a list of text parts, got null"),
    ([{"role": "user", "content": 5}],
     "messages[0].content: expected a string or a list of text parts, got an int"),
    ([{"role": "user", "content": ["x"]}],
     "messages[0].content[0]: expected an object, got a string"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     "messages[0].content[0].type: unsupported content part 'image_url' (only 'text')"),
    ([{"role": "user", "content": [{"type": "text"}]}],
     "messages[0].content[0].text: expected a string, got null"),
    ([{"role": "user", "content": "x"}, {"role": "assistant"}],
     "messages[1].content: an assistant message needs content or tool_calls"),
    ([{"role": "assistant", "content": None, "tool_calls": []}],
     "messages[0].content: an assistant message needs content or tool_calls"),
    ([{"role": "assistant", "tool_calls": {"name": "f"}}],
     "messages[0].tool_calls: expected a list, got an object"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": None, "arguments": "{}"}}]}],
     "messages[0].tool_calls[0].function.name: expected a string, got null"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}],
     "messages[0].tool_calls[0].function.arguments: expected a JSON string or an object, "
     "got a list"),
    ([{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}],
     "messages[0].tool_calls[0].type: expected 'function', got 'code'"),
    ([{"role": "assistant", "tool_calls": [{"function": "f"}]}],
     "messages[0].tool_calls[0].function: expected an object, got a string"),
    ([{"role": "assistant", "tool_calls": [{"id": 3, "function": {"name": "f",
                                                                   "arguments": "{}"}}]}],
     "messages[0].tool_calls[0].id: expected a string, got an int"),
    ([{"role": "assistant", "content": "x", "reasoning_content": 1}],
     "messages[0].reasoning_content: expected a string, got an int"),
    ([{"role": "user", "content": "x", "name": 1}],
     "messages[0].name: expected a string, got an int"),
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}],
     "messages[1].tool_call_id: missing, and no call of the assistant turn before it is left to "
     "answer by order"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "content": "r"}, {"role": "tool", "content": "s"}],
     "messages[2].tool_call_id: missing, and no call of the assistant turn before it is left to "
     "answer by order"),
]


@pytest.mark.parametrize(("value", "message"), BAD_MESSAGES, ids=[m for _, m in BAD_MESSAGES])
def test_bad_messages_name_the_key_path(value: Any, message: str) -> None:
    assert row_error(parse_messages, value) == message


def test_the_key_names_the_row_field() -> None:
    with pytest.raises(RowError) as info:
        parse_messages([{"role": "x"}], None, key="dialog")
    assert info.value.key == "dialog[0].role"


# -------------------------------------------------------------------------- ShareGPT layout


def test_sharegpt_roles_map_to_the_openai_layout() -> None:
    row = parse_conversations([
        {"from": "system", "value": "be brief"},
        {"from": "human", "value": "hi"},
        {"from": "gpt", "value": "hello"},
        {"from": "user", "value": "and?"},
        {"from": "model", "value": "bye"},
    ], None)
    assert row.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "bye"},
    ]
    assert row.tools is None


def test_sharegpt_function_calls_merge_into_one_assistant_turn() -> None:
    call = json.dumps({"name": "get_weather", "arguments": {"city": "paris"}})
    row = parse_conversations([
        {"from": "human", "value": "weather?"},
        {"from": "gpt", "value": "checking"},
        {"from": "function_call", "value": call},
        {"from": "function_call", "value": [{"name": "get_time", "arguments": "{}"}]},
        {"from": "observation", "value": "sunny"},
        {"from": "function_response", "value": "noon"},
        {"from": "gpt", "value": "sunny at noon"},
        {"from": "human", "value": "tomorrow?"},
        {"from": "function_call", "value": {"name": "get_weather"}},
        {"from": "tool", "value": "rainy"},
    ], json.dumps([WEATHER]))
    assert row.messages == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "checking", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}},
            {"id": "functions.get_time:1", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}},
        ]},
        {"role": "tool", "content": "sunny", "tool_call_id": "functions.get_weather:0"},
        {"role": "tool", "content": "noon", "tool_call_id": "functions.get_time:1"},
        {"role": "assistant", "content": "sunny at noon"},
        {"role": "user", "content": "tomorrow?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "functions.get_weather:2", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "rainy", "tool_call_id": "functions.get_weather:2"},
    ]
    assert row.tools == [OPENAI_WEATHER]


@pytest.mark.parametrize("speaker", list(SHAREGPT_ROLES))
def test_every_sharegpt_role_is_read(speaker: str) -> None:
    value = '{"name": "g"}' if speaker == "function_call" else "x"
    items = [{"from": "function_call", "value": '{"name": "f"}'}, {"from": speaker, "value": value}]
    last = parse_conversations(items, None).messages[-1]
    if speaker == "function_call":
        assert [c["function"]["name"] for c in last["tool_calls"]] == ["f", "g"]
    else:
        assert last["role"] == SHAREGPT_ROLES[speaker]


BAD_CONVERSATIONS = [
    ([], "conversations: expected a non-empty list, got an empty list"),
    ([{"from": "bot", "value": "x"}],
     "conversations[0].from: unknown role 'bot' (known: " + ", ".join(SHAREGPT_ROLES) + ")"),
    ([{"value": "x"}], "conversations[0].from: expected a string, got null"),
    ([{"from": "human", "value": None}], "conversations[0].value: expected a string, got null"),
    ([{"from": "function_call", "value": "{oops"}],
     "conversations[0].value: not a JSON call: Expecting property name enclosed in double "
     "quotes: line 1 column 2 (char 1)"),
    ([{"from": "function_call", "value": '[{"name": "f"}, {"arguments": "{}"}]'}],
     "conversations[0].value[1].name: expected a string, got null"),
    ([{"from": "function_call", "value": "[]"}],
     "conversations[0].value: expected a call, got an empty list"),
    ([{"from": "human", "value": "x"}, {"from": "observation", "value": "r"}],
     "conversations[1].tool_call_id: missing, and no call of the assistant turn before it is "
     "left to answer by order"),
]


@pytest.mark.parametrize(("value", "message"), BAD_CONVERSATIONS,
                         ids=[m for _, m in BAD_CONVERSATIONS])
def test_bad_conversations_name_the_key_path(value: Any, message: str) -> None:
    assert row_error(parse_conversations, value) == message


# ------------------------------------------------------------------------------------ tools


@pytest.mark.parametrize("tools", [None, "", "  ", [], "[]"])
def test_no_tools_is_none(tools: Any) -> None:
    assert parse_messages([{"role": "user", "content": "x"}], tools).tools is None


def test_tools_in_both_forms_and_as_json_text() -> None:
    expected = [OPENAI_WEATHER, OPENAI_WEATHER]
    assert parse_tools([WEATHER, OPENAI_WEATHER]) == expected
    assert parse_tools(json.dumps([WEATHER, OPENAI_WEATHER])) == expected


BAD_TOOLS = [
    ("{oops", "tools: not a JSON list: Expecting property name enclosed in double quotes: "
              "line 1 column 2 (char 1)"),
    ({"name": "f"}, "tools: expected a list of tool schemas, got an object"),
    ([WEATHER, "f"], "tools[1]: expected an object, got a string"),
    ([WEATHER, WEATHER, {"type": "function", "function": {"name": None}}],
     "tools[2].function.name: expected a string, got null"),
    ([{"description": "nameless"}], "tools[0].name: expected a string, got null"),
    ([{"type": "retrieval", "function": WEATHER}],
     "tools[0].type: expected 'function', got 'retrieval'"),
]


@pytest.mark.parametrize(("tools", "message"), BAD_TOOLS, ids=[m for _, m in BAD_TOOLS])
def test_bad_tools_name_the_key_path(tools: Any, message: str) -> None:
    assert row_error(parse_messages, [{"role": "user", "content": "x"}], tools) == message


def test_the_tools_key_names_the_row_field() -> None:
    with pytest.raises(RowError) as info:
        parse_conversations([{"from": "human", "value": "x"}], 5, tools_key="functions")
    assert str(info.value) == "functions: expected a list of tool schemas, got an int"
