"""Replies: reasoning, content and tool calls split at the id level, per model profile.

Kimi-K2.5 replies go through the shipped example tokenizer (word-level, Kimi's special ids:
it decodes ``functions.get_weather:0`` as ``functions . get_weather : 0``); Qwen3 replies
through a fake decode whose ids are the words of a small table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench.chat import Reply, ToolCall, assistant_message, parse_reply
from workbench.profiles import get_profile
from workbench.tokenizer import decode, load_tokenizer

TOKENIZER = str(Path(__file__).resolve().parents[2] / "examples" / "tokenizer")
KIMI = get_profile("kimi-k2.5")
QWEN = get_profile("qwen3")
# Kimi-K2.5 special ids (as in the example tokenizer)
THINK, THINK_END, IM_END, EOS = 163606, 163607, 163586, 163585
SECTION, SECTION_END, CALL, ARGS, CALL_END = 163595, 163596, 163597, 163598, 163599


def tok() -> Any:
    return load_tokenizer(TOKENIZER)


def words(text: str) -> list[int]:
    return list(tok()(text, add_special_tokens=False)["input_ids"])


def kimi(ids: list[int], **kwargs: Any) -> Reply:
    return parse_reply(ids, KIMI, lambda part: decode(tok(), part), **kwargs)


def kimi_call(call_id: str, arguments: str) -> list[int]:
    return [CALL, *words(call_id), ARGS, *words(arguments), CALL_END]


# ------------------------------------------------------------------------------ reasoning


def test_reasoning_and_answer_split_at_the_think_end_id() -> None:
    reply = kimi([*words("i think so"), THINK_END, *words("the answer"), IM_END])
    assert reply == Reply("i think so", "the answer", (), None)


def test_a_leading_think_start_is_dropped_and_ids_after_the_end_are_not_read() -> None:
    reply = kimi([THINK, *words("so i think"), THINK_END, *words("yes"), EOS, *words("more words")])
    assert reply == Reply("so i think", "yes", (), None)


def test_an_unclosed_reasoning_is_all_reasoning() -> None:
    assert kimi([*words("i think and think"), IM_END]) == Reply("i think and think", "", (), None)


def test_without_thinking_there_is_no_reasoning_part() -> None:
    assert kimi([*words("just the answer"), IM_END], thinking=False) == Reply(
        None, "just the answer", (), None)
    plain = get_profile("plain")
    assert parse_reply([5, 6, 2, 7], plain, lambda ids: " ".join(map(str, ids))) == Reply(
        None, "5 6", (), None)


# ------------------------------------------------------------------------------- kimi_k2


def test_kimi_calls_keep_the_written_id_and_the_arguments_as_text() -> None:
    ids = [*words("let me see"), THINK_END, *words("let me check"), SECTION,
           *kimi_call("functions.get_weather:0", '{"city": "paris"}'),
           *kimi_call("functions.get_stock_price:1", "{}"), SECTION_END, IM_END]
    reply = kimi(ids)
    assert reply.reasoning == "let me see" and reply.content == "let me check"
    assert reply.tool_calls == (
        ToolCall("functions.get_weather:0", "get_weather", 'city ": " paris'),  # [UNK] skipped
        ToolCall("functions.get_stock_price:1", "get_stock_price", ""),
    )
    assert reply.problem is None


def test_a_call_name_runs_to_the_last_colon() -> None:
    reply = kimi([THINK_END, SECTION, *kimi_call("functions.get_weather:12", "x"), SECTION_END])
    assert reply.tool_calls == (ToolCall("functions.get_weather:12", "get_weather", ""),)


KIMI_PROBLEMS = [
    ([SECTION, *kimi_call("functions.get_weather:0", "x")],
     1, "the tool-call section has no <|tool_calls_section_end|>"),
    ([SECTION, *kimi_call("functions.get_weather:0", "x"), CALL,
      *words("functions.get_stock_price:1"), ARGS, SECTION_END],
     1, "tool call 2: no <|tool_call_end|>"),
    ([SECTION, *kimi_call("functions.get_weather:0", "x"), CALL,
      *words("functions.get_stock_price:1"), CALL_END, SECTION_END],
     1, "tool call 2: no <|tool_call_argument_begin|>"),
    ([SECTION, *words("get_weather"), ARGS, CALL_END, SECTION_END],
     0, "tool call 1: no <|tool_call_begin|>"),
    ([SECTION, *kimi_call("functions.get_weather:0", "x"), *words("and"),
      *kimi_call("functions.get_weather:1", "x"), SECTION_END],
     1, "tool call 2: text before <|tool_call_begin|>"),
    ([SECTION, *kimi_call("functions.get_weather:0", "x"), *words("more"), SECTION_END],
     1, "tool call 2: no <|tool_call_begin|>"),
    ([SECTION, *kimi_call("get_weather", "x"), SECTION_END],
     0, "tool call 1: id 'get_weather' is not functions.NAME:INDEX"),
    ([CALL, *words("functions.get_weather:0"), ARGS, CALL_END],
     0, "a tool-call marker outside a <|tool_calls_section_begin|> section"),
]


@pytest.mark.parametrize(("answer", "kept", "problem"), KIMI_PROBLEMS,
                         ids=[p for _, _, p in KIMI_PROBLEMS])
def test_a_kimi_section_that_cannot_be_read_says_why(
    answer: list[int], kept: int, problem: str
) -> None:
    reply = kimi([THINK_END, *words("let me check"), *answer, IM_END])
    assert reply.problem == problem
    assert len(reply.tool_calls) == kept and reply.content == "let me check"


# -------------------------------------------------------------------------------- qwen25

QWEN_WORDS = {1: "hmm", 2: "sure", 3: '{"name": "get_weather", "arguments": {"city": "paris"}}',
              4: '{"name": "get_stock_price", "arguments": "{}"}', 5: "{oops",
              6: '{"arguments": {}}',
              7: '{"name": "search", "parameters": {"q": "héllo"}}', 8: "\n",
              9: '{ " name ": " get_weather ", " parameters ": { " city ": " paris " } }'}
T_START, T_END, CALLQ, CALLQ_END, Q_END = 151667, 151668, 151657, 151658, 151645


def fake_decode(ids: list[int]) -> str:
    """The words of the table, special ids (not in it) skipped."""
    return " ".join(QWEN_WORDS[i] for i in ids if i in QWEN_WORDS)


def qwen(ids: list[int]) -> Reply:
    return parse_reply(ids, QWEN, fake_decode)


def test_qwen_calls_read_their_json() -> None:
    reply = qwen([T_START, 1, T_END, 2, CALLQ, 3, CALLQ_END, 8, CALLQ, 4, CALLQ_END, 8,
                  CALLQ, 7, CALLQ_END, Q_END])
    assert reply == Reply("hmm", "sure", (
        ToolCall("call_0", "get_weather", '{"city": "paris"}'),
        ToolCall("call_1", "get_stock_price", "{}"),
        ToolCall("call_2", "search", '{"q": "héllo"}'),
    ), None)


def test_qwen_calls_decoded_with_spaced_keys_are_read() -> None:
    """A word-level tokenizer decodes every key and name with spaces around it."""
    reply = qwen([T_START, 1, T_END, CALLQ, 9, CALLQ_END, Q_END])
    assert reply.problem is None
    assert reply.tool_calls == (ToolCall("call_0", "get_weather", '{" city ": " paris "}'),)


def test_qwen_reasoning_that_never_closes() -> None:
    assert qwen([T_START, 1, 1]) == Reply("hmm hmm", "", (), None)


QWEN_PROBLEMS = [
    ([CALLQ, 3, CALLQ_END, CALLQ, 5, CALLQ_END], 1,
     "tool call 2: not JSON: Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)"),
    ([CALLQ, 6, CALLQ_END], 0, "tool call 1: not an object with a string 'name'"),
    ([CALLQ, 3, CALLQ_END, CALLQ, 4], 1, "tool call 2: no </tool_call>"),
    ([CALLQ, 3, CALLQ_END, 4, CALLQ_END], 1, "tool call 2: no <tool_call>"),
]


@pytest.mark.parametrize(("answer", "kept", "problem"), QWEN_PROBLEMS,
                         ids=[p for _, _, p in QWEN_PROBLEMS])
def test_qwen_calls_that_cannot_be_read_say_why(answer: list[int], kept: int, problem: str) -> None:
    reply = qwen([T_START, 1, T_END, 2, *answer, Q_END])
    assert reply.problem == problem
    assert len(reply.tool_calls) == kept and reply.content == "sure"


# ------------------------------------------------------------------------ assistant_message


def test_assistant_message_in_the_openai_layout() -> None:
    assert assistant_message(Reply(None, "hi", (), None)) == {"role": "assistant", "content": "hi"}
    message = assistant_message(Reply("why", "", (ToolCall("call_0", "f", '{"a": 1}'),), None))
    assert message == {
        "role": "assistant", "content": "", "reasoning_content": "why",
        "tool_calls": [{"id": "call_0", "type": "function",
                        "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
