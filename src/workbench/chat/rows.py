"""A dataset row's conversation, read into one normalised layout: the OpenAI chat layout.

Two row layouts are read. ``messages`` is the OpenAI layout: roles system, user, assistant
and tool; ``content`` a string or a list of text parts (``{"type": "text", "text": ...}``,
joined into one string), null only on an assistant turn that calls tools. An assistant turn
may carry ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments"}}]``,
arguments kept as a JSON string, an object dumped into one; a missing id numbered
``functions.NAME:INDEX`` across the row) and ``reasoning_content``. A tool turn carries its
``content``, the ``tool_call_id`` of the call it answers (without one, it answers the call at
its position among the calls of the assistant turn before it) and an optional ``name``.

``conversations`` is the ShareGPT layout (items ``{"from", "value"}``), its roles mapped by
SHAREGPT_ROLES:

    from                                        becomes
    system                                      system
    human, user                                 user
    gpt, assistant, chatgpt, model              assistant
    function_call                               an assistant turn with tool_calls
    observation, tool, function_response        tool

A ``function_call`` value is a JSON object ``{"name", "arguments"}`` or a list of them (as
JSON text or as is); consecutive ``function_call`` items make one assistant turn, and a
``gpt`` item right before them becomes its content. A tool item answers the call at its
position among the calls before it.

The row's tool schemas (``tools``) are a list, or a string holding a JSON list (glaive and
LLaMA-Factory rows store them so); each is kept in the OpenAI form ``{"type": "function",
"function": {"name", ...}}`` that SGLang's chat API takes, a bare ``{"name", "description",
"parameters"}`` being wrapped into it. No tools (null, absent, empty) is None.

A row that cannot be read raises a RowError naming the key path:
``messages[2].tool_calls[0].function.name: expected a string, got null``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec

__all__ = [
    "MESSAGE_ROLES",
    "SHAREGPT_ROLES",
    "ChatRow",
    "RowError",
    "json_kind",
    "parse_conversations",
    "parse_messages",
    "parse_tools",
]

MESSAGE_ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "function_call": "function_call",  # an assistant turn with tool_calls
    "observation": "tool",
    "tool": "tool",
    "function_response": "tool",
}


class ChatRow(msgspec.Struct, frozen=True):
    """One conversation: `messages` in the normalised OpenAI layout, and its tool schemas
    (OpenAI form) or None."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


class RowError(ValueError):
    """A row that cannot be read: `key` is the key path, ``str(exc)`` is ``"{key}: {message}"``."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


def parse_messages(
    value: Any, tools: Any, key: str = "messages", tools_key: str = "tools"
) -> ChatRow:
    """The conversation of an OpenAI-layout row; RowError naming the key path when bad."""
    items = _nonempty_list(value, key)
    calls = _CallNumbering()
    messages = [_message(item, f"{key}[{i}]", calls) for i, item in enumerate(items)]
    _pair_by_order(messages, key)
    return ChatRow(messages, parse_tools(tools, tools_key))


def parse_conversations(
    value: Any, tools: Any, key: str = "conversations", tools_key: str = "tools"
) -> ChatRow:
    """The conversation of a ShareGPT-layout row; RowError naming the key path when bad."""
    items = _nonempty_list(value, key)
    calls = _CallNumbering()
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        role, text = _sharegpt_item(item, where)
        if role == "function_call":
            _add_calls(messages, _sharegpt_calls(text, f"{where}.value", calls))
        else:
            messages.append({"role": role, "content": text})
    _pair_by_order(messages, key)
    return ChatRow(messages, parse_tools(tools, tools_key))


def parse_tools(value: Any, key: str = "tools") -> list[dict[str, Any]] | None:
    """The row's tool schemas in OpenAI form, or None for no tools."""
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(key, f"not a JSON list: {exc}") from None
    if value is None:
        return None
    if not isinstance(value, list):
        raise RowError(key, f"expected a list of tool schemas, got {json_kind(value)}")
    return [_tool(item, f"{key}[{i}]") for i, item in enumerate(value)] or None


# --------------------------------------------------------------------------- OpenAI layout


class _CallNumbering:
    """Ids for calls that carry none: ``functions.NAME:INDEX``, INDEX counting the row's calls."""

    def __init__(self) -> None:
        self.count = 0

    def next_id(self, name: str) -> str:
        index, self.count = self.count, self.count + 1
        return f"functions.{name}:{index}"


def _message(item: Any, where: str, calls: _CallNumbering) -> dict[str, Any]:
    data = _object(item, where)
    role = data.get("role")
    if not isinstance(role, str):
        raise RowError(f"{where}.role", f"expected a string, got {json_kind(role)}")
    if role not in MESSAGE_ROLES:
        known = ", ".join(MESSAGE_ROLES)
        raise RowError(f"{where}.role", f"unknown role {role!r} (known: {known})")
    message: dict[str, Any] = {"role": role}
    if role == "assistant":
        message.update(_assistant(data, where, calls))
    else:
        message["content"] = _content(data.get("content"), f"{where}.content")
        if role == "tool":
            message.update(_tool_reply(data, where))
    name = _optional_string(data, "name", where)
    if name is not None:
        message["name"] = name
    return message


def _assistant(data: dict[str, Any], where: str, calls: _CallNumbering) -> dict[str, Any]:
    """content, reasoning_content and tool_calls of an assistant message."""
    content = data.get("content")
    fields: dict[str, Any] = {
        "content": None if content is None else _content(content, f"{where}.content")
    }
    reasoning = _optional_string(data, "reasoning_content", where)
    if reasoning is not None:
        fields["reasoning_content"] = reasoning
    raw_calls = data.get("tool_calls")
    if raw_calls is not None:
        items = _list(raw_calls, f"{where}.tool_calls")
        tool_calls = [_tool_call(c, f"{where}.tool_calls[{i}]", calls) for i, c in enumerate(items)]
        if tool_calls:
            fields["tool_calls"] = tool_calls
    if fields["content"] is None and "tool_calls" not in fields:
        raise RowError(f"{where}.content", "an assistant message needs content or tool_calls")
    return fields


def _tool_call(item: Any, where: str, calls: _CallNumbering) -> dict[str, Any]:
    data = _object(item, where)
    _check_function_type(data, where)
    function = _object(data.get("function"), f"{where}.function")
    name = _string(function.get("name"), f"{where}.function.name")
    arguments = _arguments(function.get("arguments"), f"{where}.function.arguments")
    call_id = data.get("id")
    if call_id is None:
        call_id = calls.next_id(name)
    else:
        call_id = _string(call_id, f"{where}.id")
        calls.count += 1
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _arguments(value: Any, where: str) -> str:
    """A call's arguments as a JSON string (an object is dumped)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    raise RowError(where, f"expected a JSON string or an object, got {json_kind(value)}")


def _tool_reply(data: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = _optional_string(data, "tool_call_id", where)
    return {} if call_id is None else {"tool_call_id": call_id}


def _content(value: Any, where: str) -> str:
    """A message's content as one string: a string, or its text parts joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RowError(where, f"expected a string or a list of text parts, got {json_kind(value)}")
    return "".join(_text_part(part, f"{where}[{i}]") for i, part in enumerate(value))


def _text_part(part: Any, where: str) -> str:
    data = _object(part, where)
    kind = data.get("type")
    if kind != "text":
        raise RowError(f"{where}.type", f"unsupported content part {kind!r} (only 'text')")
    return _string(data.get("text"), f"{where}.text")


def _pair_by_order(messages: list[dict[str, Any]], key: str) -> None:
    """Give each tool message without a tool_call_id the id of the call at its position among
    the calls of the assistant turn before it."""
    for calls, start, results in _tool_runs(messages):
        for position, index in enumerate(range(start, start + results)):
            message = messages[index]
            if "tool_call_id" in message:
                continue
            if position >= len(calls):
                raise RowError(f"{key}[{index}].tool_call_id", "missing, and no call of the "
                               "assistant turn before it is left to answer by order")
            message["tool_call_id"] = calls[position]["id"]


def _tool_runs(messages: list[dict[str, Any]]) -> Iterator[tuple[list[dict[str, Any]], int, int]]:
    """(calls of the assistant turn before, index of the first tool message, how many) for each
    run of consecutive tool messages."""
    calls: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        if messages[index]["role"] != "tool":
            calls = messages[index].get("tool_calls", [])  # none on a user or system turn
            index += 1
            continue
        start = index
        while index < len(messages) and messages[index]["role"] == "tool":
            index += 1
        yield calls, start, index - start


# --------------------------------------------------------------------------- ShareGPT layout


def _sharegpt_item(item: Any, where: str) -> tuple[str, Any]:
    """(mapped role, value) of one ShareGPT item; a plain role's value must be a string."""
    data = _object(item, where)
    speaker = data.get("from")
    if not isinstance(speaker, str):
        raise RowError(f"{where}.from", f"expected a string, got {json_kind(speaker)}")
    role = SHAREGPT_ROLES.get(speaker)
    if role is None:
        known = ", ".join(SHAREGPT_ROLES)
        raise RowError(f"{where}.from", f"unknown role {speaker!r} (known: {known})")
    value = data.get("value")
    if role != "function_call":
        value = _string(value, f"{where}.value")
    return role, value


def _sharegpt_calls(value: Any, where: str, calls: _CallNumbering) -> list[dict[str, Any]]:
    """The calls of one function_call item: a JSON object or list of them, as text or as is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(where, f"not a JSON call: {exc}") from None
    items = value if isinstance(value, list) else [value]
    if not items:
        raise RowError(where, "expected a call, got an empty list")
    found = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]" if isinstance(value, list) else where
        data = _object(item, at)
        name = _string(data.get("name"), f"{at}.name")
        arguments = _arguments(data.get("arguments", {}), f"{at}.arguments")
        found.append({"id": calls.next_id(name), "type": "function",
                      "function": {"name": name, "arguments": arguments}})
    return found


def _add_calls(messages: list[dict[str, Any]], calls: list[dict[str, Any]]) -> None:
    """Add calls to the assistant turn just before, when it is one (a gpt item or earlier
    calls), or as a new assistant turn."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).extend(calls)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})


# --------------------------------------------------------------------------------- tools


def _tool(item: Any, where: str) -> dict[str, Any]:
    """One tool schema in OpenAI form."""
    data = _object(item, where)
    if data.get("function") is not None:
        _check_function_type(data, where)
        function = _object(data["function"], f"{where}.function")
        _string(function.get("name"), f"{where}.function.name")
        return data
    _string(data.get("name"), f"{where}.name")
    return {"type": "function", "function": data}


# --------------------------------------------------------------------------------- values


def _check_function_type(data: dict[str, Any], where: str) -> None:
    """A call's or a tool's `type` is "function" or absent (null: a Parquet struct's gap)."""
    kind = data.get("type")
    if kind is not None and kind != "function":
        raise RowError(f"{where}.type", f"expected 'function', got {kind!r}")


def _nonempty_list(value: Any, where: str) -> list[Any]:
    items = _list(value, where)
    if not items:
        raise RowError(where, "expected a non-empty list, got an empty list")
    return items


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RowError(where, f"expected a list, got {json_kind(value)}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RowError(where, f"expected an object, got {json_kind(value)}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RowError(where, f"expected a string, got {json_kind(value)}")
    return value


def _optional_string(data: dict[str, Any], name: str, where: str) -> str | None:
    value = data.get(name)
    return None if value is None else _string(value, f"{where}.{name}")


def json_kind(value: Any) -> str:
    """A value's type in JSON terms, for messages."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    return {bool: "a boolean", int: "an int", float: "a float", dict: "an object"}.get(
        type(value), type(value).__name__
    )
