"""Prompt loading: input modes, JSONL and Parquet, the chat template, bad rows, the examples."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import EXAMPLES, ROOT

from workbench.chat import last_turn_messages, parse_conversations, parse_messages
from workbench.config import CHAT_INPUTS, DatasetSpec
from workbench.errors import ConfigError, DataError
from workbench.generate.prompts import Prompt, estimate_text_tokens, load_prompts
from workbench.profiles import get_profile
from workbench.tokenizer import encode_messages, load_tokenizer

TOKENIZER = str(EXAMPLES / "tokenizer")
KIMI = get_profile("kimi-k2.5")
THINK, THINK_END, IM_END = 163606, 163607, 163586  # Kimi-K2.5 ids, as in the example tokenizer


def spec(path: Path, input: Any = "input_ids", **fields: Any) -> DatasetSpec:
    tokenizer = TOKENIZER if input in CHAT_INPUTS else None
    return DatasetSpec(name="d", path=str(path), input=input, tokenizer=tokenizer, **fields)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows as JSONL; a str row is written as the raw line."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def data_error(ds: DatasetSpec, **kwargs: Any) -> str:
    with pytest.raises(DataError) as info:
        load_prompts(ds, KIMI, **kwargs)
    return str(info.value)


def ids_of(*tokens: str) -> list[int]:
    return list(load_tokenizer(TOKENIZER).convert_tokens_to_ids(list(tokens)))


# ----------------------------------------------------------------------------- input modes


def test_input_ids(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"sample_id": 1, "input_ids": [5, 6, 7]}, {"sample_id": "b", "input_ids": [163839]}],
    )
    assert load_prompts(spec(path), KIMI) == [
        Prompt(1, [5, 6, 7], None, 3),
        Prompt("b", [163839], None, 1),
    ]


def test_text_estimates_tokens(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"sample_id": 0, "text": "héllo world"}])
    (prompt,) = load_prompts(spec(path, "text"), KIMI)
    assert prompt == Prompt(0, None, "héllo world", len("héllo world".encode()) // 4 + 1)
    assert estimate_text_tokens("x" * 400) == 101


def test_messages_through_the_example_tokenizer_exact_ids(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"sample_id": 0, "messages": [{"role": "user", "content": "hello world"}]}],
    )
    (prompt,) = load_prompts(spec(path, "messages", chat_template_kwargs={"thinking": True}), KIMI)
    expected = ids_of(
        "<|im_system|>",
        "system",
        "<|im_middle|>",
        "you",
        "are",
        "kimi",
        ",",
        "an",
        "ai",
        "assistant",
        "created",
        "by",
        "moonshot",
        "ai",
        ".",
        "<|im_end|>",
        "<|im_user|>",
        "user",
        "<|im_middle|>",
        "hello",
        "world",
        "<|im_end|>",
        "<|im_assistant|>",
        "assistant",
        "<|im_middle|>",
        "<think>",
    )
    assert prompt.input_ids == expected
    assert prompt.input_ids[-1] == THINK and prompt.prompt_tokens == len(expected)
    assert load_tokenizer(TOKENIZER).unk_token_id not in expected


@pytest.mark.parametrize(
    ("kwargs", "tail"),
    [
        ({"thinking": True}, ["<|im_assistant|>", "assistant", "<|im_middle|>", "<think>"]),
        ({}, ["<|im_assistant|>", "assistant", "<|im_middle|>", "<think>"]),  # the default
        ({"thinking": False}, ["<|im_middle|>", "<think>", "</think>"]),
    ],
)
def test_thinking_switch_ends_the_generation_prompt(
    tmp_path: Path, kwargs: dict[str, Any], tail: list[str]
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is the weather"},
    ]
    path = write_jsonl(tmp_path / "p.jsonl", [{"sample_id": 0, "messages": messages}])
    (prompt,) = load_prompts(spec(path, "messages", chat_template_kwargs=kwargs), KIMI)
    assert prompt.input_ids is not None
    assert prompt.input_ids[-len(tail) :] == ids_of(*tail)
    assert prompt.input_ids.count(IM_END) == 2
    assert THINK_END not in prompt.input_ids or kwargs == {"thinking": False}


def test_encode_messages_accepts_both_transformers_return_shapes() -> None:
    class Fake:
        def __init__(self, result: Any) -> None:
            self.result = result

        def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
            assert kwargs == {"add_generation_prompt": True, "tokenize": True, "thinking": True}
            return self.result

    messages = [{"role": "user", "content": "x"}]
    assert encode_messages(Fake([1, 2]), messages, {"thinking": True}) == [1, 2]
    assert encode_messages(
        Fake({"input_ids": [3], "attention_mask": [1]}), messages, {"thinking": True}
    ) == [3]


def test_encode_messages_passes_tools_only_when_given() -> None:
    seen: list[dict[str, Any]] = []

    class Fake:
        def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
            seen.append(kwargs)
            return [1]

    messages = [{"role": "user", "content": "x"}]
    encode_messages(Fake(), messages, {"thinking": True})
    encode_messages(Fake(), messages, {"thinking": True}, tools=[WEATHER_TOOL])
    assert seen == [
        {"add_generation_prompt": True, "tokenize": True, "thinking": True},
        {"add_generation_prompt": True, "tokenize": True, "thinking": True,
         "tools": [WEATHER_TOOL]},
    ]


# ------------------------------------------------------------------------------ conversations

WEATHER = {"name": "get_weather", "description": "the weather", "parameters": {"type": "object"}}
WEATHER_TOOL = {"type": "function", "function": WEATHER}
TOOL_MESSAGES = [
    {"role": "user", "content": "what is the weather in paris"},
    {"role": "assistant", "content": "let me check", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "paris"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "it is sunny"},
]
TOOL_CONVERSATIONS = [
    {"from": "human", "value": "what is the weather in paris"},
    {"from": "gpt", "value": "let me check"},
    {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "paris"}}'},
    {"from": "observation", "value": "sunny"},
    {"from": "gpt", "value": "it is sunny"},
]


def decoded(ids: list[int] | None) -> str:
    assert ids is not None
    return str(load_tokenizer(TOKENIZER).decode(ids))


def test_a_tool_row_renders_its_tools_without_the_last_answer(tmp_path: Path) -> None:
    row = {"sample_id": 0, "messages": TOOL_MESSAGES, "tools": json.dumps([WEATHER])}
    path = write_jsonl(tmp_path / "p.jsonl", [row])
    (prompt,) = load_prompts(spec(path, "messages", chat_template_kwargs={"thinking": True}), KIMI)
    chat = parse_messages(TOOL_MESSAGES, [WEATHER])
    expected = encode_messages(load_tokenizer(TOKENIZER), last_turn_messages(chat),
                               {"thinking": True}, tools=[WEATHER_TOOL])
    assert prompt == Prompt(0, expected, None, len(expected), messages=last_turn_messages(chat),
                            tools=[WEATHER_TOOL])
    text = decoded(prompt.input_ids)
    assert text.startswith("<|im_system|> tool_declare <|im_middle|>")
    assert "<|tool_call_begin|> functions . get_weather : 0 <|tool_call_argument_begin|>" in text
    assert "return of functions . get_weather : 0" in text
    assert "it is sunny" not in text and text.endswith("<|im_middle|> <think>")


def test_conversations_render_like_the_same_messages(tmp_path: Path) -> None:
    rows = [{"sample_id": 0, "conversations": TOOL_CONVERSATIONS, "functions": [WEATHER]},
            {"sample_id": 1, "messages": TOOL_MESSAGES, "functions": [WEATHER_TOOL]}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    (shared,) = load_prompts(spec(path, "conversations", tools_field="functions"), KIMI, limit=1)
    path = write_jsonl(tmp_path / "q.jsonl", rows[1:])
    (openai,) = load_prompts(spec(path, "messages", tools_field="functions"), KIMI)
    assert shared.input_ids == openai.input_ids
    assert "tool_declare" in decoded(shared.input_ids)


def test_turns_each_sends_turn_zero_and_keeps_the_conversation(tmp_path: Path) -> None:
    rows = [{"sample_id": "a", "conversations": TOOL_CONVERSATIONS, "tools": [WEATHER]}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    (prompt,) = load_prompts(spec(path, "conversations", turns="each"), KIMI)
    chat = parse_conversations(TOOL_CONVERSATIONS, [WEATHER])
    expected = encode_messages(load_tokenizer(TOKENIZER), chat.messages[:1], {},
                               tools=[WEATHER_TOOL])
    assert prompt == Prompt("a", expected, None, len(expected), chat=chat, turn=0,
                            messages=chat.messages[:1], tools=[WEATHER_TOOL])
    path = write_jsonl(tmp_path / "q.jsonl", [
        {"sample_id": 0, "messages": [{"role": "user", "content": "x"}]},
        {"sample_id": 1, "messages": [{"role": "system", "content": "be brief"}]}])
    assert data_error(spec(path, "messages", turns="each")) == (
        f"{path}:2: messages: no turn to generate (turns: each needs an assistant message, or a "
        "user or tool message last)")


BAD_CHAT_ROWS = [
    ("messages", {"messages": [TOOL_MESSAGES[0], TOOL_MESSAGES[1], {
        "role": "assistant", "tool_calls": [{"function": {"name": None, "arguments": "{}"}}]}]},
     "messages[2].tool_calls[0].function.name: expected a string, got null"),
    ("messages", {"messages": TOOL_MESSAGES, "tools": [WEATHER, {"type": "function"}]},
     "tools[1].name: expected a string, got null"),
    ("messages", {"messages": TOOL_MESSAGES, "tools": "[{"},
     "tools: not a JSON list: Expecting property name enclosed in double quotes: line 1 "
     "column 3 (char 2)"),
    ("conversations", {"conversations": [{"from": "function_call", "value": "{}"}]},
     "conversations[0].value.name: expected a string, got null"),
]


@pytest.mark.parametrize(("mode", "row", "message"), BAD_CHAT_ROWS,
                         ids=[m for _, _, m in BAD_CHAT_ROWS])
def test_a_bad_conversation_names_the_line_and_the_key_path(
    tmp_path: Path, mode: str, row: dict[str, Any], message: str
) -> None:
    good = TOOL_MESSAGES if mode == "messages" else TOOL_CONVERSATIONS
    path = write_jsonl(tmp_path / "glaive.jsonl",
                       [{"sample_id": 0, mode: good}, {"sample_id": 1, **row}])
    assert data_error(spec(path, mode)) == f"{path}:2: {message}"


def test_conversations_need_a_tokenizer(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"sample_id": 0, "conversations": []}])
    with pytest.raises(ConfigError) as info:
        load_prompts(DatasetSpec(name="d", path=str(path), input="conversations"), KIMI)
    assert str(info.value) == "tokenizer: dataset 'd' has input 'conversations' but no tokenizer"


def test_parquet_conversations_with_tool_calls_and_a_tools_column(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet", {
        "sample_id": [0, 1],
        "messages": [TOOL_MESSAGES[:1], [*TOOL_MESSAGES[:2],
                                         {"role": "tool", "content": "sunny"}]],
        "tools": [None, json.dumps([WEATHER])],
    })
    first, second = load_prompts(spec(path, "messages"), KIMI)
    assert "tool_declare" not in decoded(first.input_ids)
    text = decoded(second.input_ids)
    assert "tool_declare" in text and "return of functions . get_weather : 0" in text


# ----------------------------------------------------------------------------------- Parquet


def write_parquet(path: Path, columns: dict[str, list[Any]]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_in_every_mode(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "p.parquet",
        {
            "id": ["a", "b"],
            "input_ids": [[1, 2], [3]],
            "text": ["one", "two"],
            "messages": [
                [{"role": "user", "content": "hello"}],
                [{"role": "user", "content": "world"}],
            ],
        },
    )
    assert [p.input_ids for p in load_prompts(spec(path, id_field="id"), KIMI)] == [[1, 2], [3]]
    assert [p.text for p in load_prompts(spec(path, "text", id_field="id"), KIMI)] == ["one", "two"]
    prompts = load_prompts(spec(path, "messages", id_field="id"), KIMI)
    assert [p.sample_id for p in prompts] == ["a", "b"]
    assert all(p.input_ids and p.input_ids[-1] == THINK for p in prompts)


def test_parquet_bad_row_names_the_row(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "p.parquet", {"sample_id": [1, 2, 3], "input_ids": [[1], [], [2]]}
    )
    assert (
        data_error(spec(path))
        == f"{path}:2: row 2: input_ids must be a non-empty list of ints, got an empty list"
    )


def test_parquet_duplicate_and_null_ids(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "p.parquet", {"sample_id": [1, 2, 1], "input_ids": [[1], [2], [3]]}
    )
    assert data_error(spec(path)) == f"{path}:3: row 3: duplicate sample_id 1 (first at row 1)"
    path = write_parquet(tmp_path / "q.parquet", {"sample_id": [1, None], "input_ids": [[1], [2]]})
    assert (
        data_error(spec(path)) == f"{path}:2: row 2: sample_id must be an int or a string, got null"
    )


def test_parquet_missing_column(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet", {"sample_id": [1], "tokens": [[1]]})
    assert (
        data_error(spec(path)) == f"{path}: missing column 'input_ids' (columns: sample_id, tokens)"
    )


def test_not_a_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    path.write_text("not parquet")
    assert data_error(spec(path)).startswith(f"{path}: cannot read the Parquet file: ")


# ------------------------------------------------------------------------------ bad JSONL rows

BAD_LINES = [
    ("[1, 2]", "expected a JSON object, got a list"),
    ('"text"', "expected a JSON object, got a string"),
    ('{"input_ids": [1]}', "missing 'sample_id'"),
    ('{"sample_id": 1.5, "input_ids": [1]}', "sample_id must be an int or a string, got a float"),
    (
        '{"sample_id": true, "input_ids": [1]}',
        "sample_id must be an int or a string, got a boolean",
    ),
    ('{"sample_id": [2], "input_ids": [1]}', "sample_id must be an int or a string, got a list"),
    ('{"sample_id": 2}', "missing 'input_ids'"),
    (
        '{"sample_id": 2, "input_ids": []}',
        "input_ids must be a non-empty list of ints, got an empty list",
    ),
    (
        '{"sample_id": 2, "input_ids": "1 2"}',
        "input_ids must be a non-empty list of ints, got a string",
    ),
    ('{"sample_id": 2, "input_ids": null}', "input_ids must be a non-empty list of ints, got null"),
    ('{"sample_id": 2, "input_ids": [1, "2"]}', "input_ids[1] must be an int, got a string"),
    ('{"sample_id": 2, "input_ids": [1, 2.0]}', "input_ids[1] must be an int, got a float"),
    ('{"sample_id": 2, "input_ids": [true]}', "input_ids[0] must be an int, got a boolean"),
    (
        '{"sample_id": 2, "input_ids": [1, 163840]}',
        "input_ids[1]: token id 163840 is outside [0, 163840) of model profile 'kimi-k2.5'",
    ),
    (
        '{"sample_id": 2, "input_ids": [-1]}',
        "input_ids[0]: token id -1 is outside [0, 163840) of model profile 'kimi-k2.5'",
    ),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[m for _, m in BAD_LINES])
def test_bad_jsonl_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"sample_id": 1, "input_ids": [1]}, line])
    assert data_error(spec(path)) == f"{path}:2: {message}"


def test_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl", [{"sample_id": 1, "input_ids": [1]}, '{"sample_id": 2,']
    )
    assert data_error(spec(path)).startswith(f"{path}:2: invalid JSON: ")


BAD_INPUTS = [
    ("text", "", "text must be a non-empty string, got an empty string"),
    ("text", 5, "text must be a non-empty string, got an int"),
    ("text", {"a": 1}, "text must be a non-empty string, got an object"),
    ("messages", [], "messages: expected a non-empty list, got an empty list"),
    ("messages", "hello", "messages: expected a list, got a string"),
    (
        "messages",
        [{"role": "user"}],
        "messages[0].content: expected a string or a list of text parts, got null",
    ),
    ("messages", [{"role": "user", "content": "x"}, "y"],
     "messages[1]: expected an object, got a string"),
    ("messages", [{"role": "user", "content": ["x"]}],
     "messages[0].content[0]: expected an object, got a string"),
    ("conversations", [{"from": "bot", "value": "x"}],
     "conversations[0].from: unknown role 'bot' (known: system, human, user, gpt, assistant, "
     "chatgpt, model, function_call, observation, tool, function_response)"),
]


@pytest.mark.parametrize(
    ("mode", "value", "message"), BAD_INPUTS, ids=[m for _, _, m in BAD_INPUTS]
)
def test_bad_text_and_messages(tmp_path: Path, mode: str, value: Any, message: str) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"sample_id": 0, mode: value}])
    assert data_error(spec(path, mode)) == f"{path}:1: {message}"


def test_duplicate_ids_name_both_lines(tmp_path: Path) -> None:
    rows = [
        {"sample_id": 7, "input_ids": [1]},
        {"sample_id": "7", "input_ids": [1]},
        {"sample_id": 7, "input_ids": [2]},
    ]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    assert data_error(spec(path)) == (
        f"{path}:2: sample_id '7' collides with sample_id 7 at line 1 (ids must stay distinct as text)")
    path = write_jsonl(tmp_path / "p.jsonl", [rows[0], {"sample_id": 8, "input_ids": [1]}, rows[2]])
    assert data_error(spec(path)) == f"{path}:3: duplicate sample_id 7 (first at line 1)"


def test_custom_id_field_and_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"uid": "a", "input_ids": [1]}, "", "  ", {"uid": "a", "input_ids": [2]}],
    )
    assert (
        data_error(spec(path, id_field="uid")) == f"{path}:4: duplicate uid 'a' (first at line 1)"
    )


def test_chat_template_failure_names_the_line(tmp_path: Path) -> None:
    tokenizer = tmp_path / "tok"
    shutil.copytree(TOKENIZER, tokenizer)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('only user turns') }}"
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    path = write_jsonl(
        tmp_path / "p.jsonl", [{"sample_id": 0, "messages": [{"role": "user", "content": "x"}]}]
    )
    ds = DatasetSpec(name="d", path=str(path), input="messages", tokenizer=str(tokenizer))
    assert data_error(ds) == f"{path}:1: the chat template failed: only user turns"


# -------------------------------------------------------------------------------------- limits


def test_limit_stops_before_later_bad_rows(tmp_path: Path) -> None:
    rows = [{"sample_id": i, "input_ids": [i + 1]} for i in range(5)] + ["not json"]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    assert [p.sample_id for p in load_prompts(spec(path), KIMI, limit=2)] == [0, 1]
    assert len(load_prompts(spec(path, max_samples=3), KIMI)) == 3
    assert len(load_prompts(spec(path, max_samples=3), KIMI, limit=5)) == 5  # limit wins
    assert data_error(spec(path)).startswith(f"{path}:6: invalid JSON")


def test_missing_file(tmp_path: Path) -> None:
    assert (
        data_error(spec(tmp_path / "nope.jsonl"))
        == f"{tmp_path / 'nope.jsonl'}: cannot read the file: No such file or directory"
    )


# ----------------------------------------------------------------------------------- tokenizer


def test_tokenizer_is_loaded_once_per_directory() -> None:
    assert load_tokenizer(TOKENIZER) is load_tokenizer(Path(TOKENIZER) / ".." / "tokenizer")


def test_tokenizer_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_tokenizer(tmp_path / "none")
    assert str(info.value) == f"tokenizer: directory not found: {tmp_path / 'none'}"
    with pytest.raises(ConfigError) as info:
        load_tokenizer(tmp_path)
    assert str(info.value).startswith(f"tokenizer: cannot load a tokenizer from {tmp_path}: ")
    broken = tmp_path / "broken"
    shutil.copytree(TOKENIZER, broken)
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    with pytest.raises(ConfigError) as info:
        load_tokenizer(broken)
    assert str(info.value).startswith(f"tokenizer: cannot load a tokenizer from {broken}: ")


def test_missing_transformers_gives_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError) as info:
        load_tokenizer(tmp_path)
    assert (
        str(info.value)
        == "tokenizer: input 'messages' needs transformers: pip install 'workbench[tokenizers]'"
    )


def test_loading_a_tokenizer_prints_nothing() -> None:
    code = f"from workbench.tokenizer import load_tokenizer; load_tokenizer({TOKENIZER!r})"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert (result.stdout, result.stderr) == ("", "")


# ------------------------------------------------------------------------------------ examples


def test_make_examples_reproduces_the_committed_files(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "make_examples.py"
    module_spec = importlib.util.spec_from_file_location("make_examples", script)
    assert module_spec and module_spec.loader
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    sim_dir = tmp_path / "sim"
    written = module.make_examples(tmp_path, sim_dir)
    assert len(written) == 8
    for path in written:
        if path.parent == sim_dir:
            committed = ROOT / "src" / "workbench" / "sim" / path.name
        else:
            committed = EXAMPLES / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed} is out of date: rerun the script"
        )
        assert committed.stat().st_size < 1_500_000


def test_examples_load_in_their_modes() -> None:
    data = EXAMPLES / "data"
    pretok = load_prompts(spec(data / "pretokenized.jsonl"), KIMI)
    assert len(pretok) >= 300 and sum(p.prompt_tokens > 4096 for p in pretok) >= 5
    assert all(p.input_ids and p.input_ids[-1] == THINK for p in pretok)
    texts = load_prompts(spec(data / "texts.jsonl", "text"), KIMI)
    assert len(texts) == 50


def test_simulated_replies_decode_to_words_of_the_shipped_text() -> None:
    from workbench.sim.outputs import plan_output, render_text
    from workbench.sim.profiles import get_sim_profile

    tokenizer = load_tokenizer(TOKENIZER)
    book = (EXAMPLES / "text" / "alice_chapter_1.txt").read_text(encoding="utf-8").lower()
    words = set(re.findall(r"\w+|[^\w\s]+", book))
    shape = get_sim_profile("fast").output
    for seed in range(10):
        ids = plan_output(KIMI, shape, seed, 3000).output_ids
        text = tokenizer.decode(ids, skip_special_tokens=False)
        assert text == render_text(ids, KIMI)
        plain = tokenizer.decode(ids, skip_special_tokens=True).split()
        assert plain and set(plain) <= words
