"""A chat request's prompt ids, rendered as SGLang 0.5.23 renders them for its chat template.

`srt/entrypoints/openai/serving_chat.py` (`_process_messages`, `_apply_jinja_template`,
`_render_and_encode_chat_template`) does not hand the request's JSON to the template: it
validates it into pydantic models (protocol.py) and dumps them, so the template sees

- tools as `Tool.model_dump()`: `{"type", "function", "defer_loading": None}` (the `Tool`
  level keeps its None); the function keeps the client's key order and drops `strict` and
  `defer_loading` when None, while a missing `description` or `parameters` comes back as None
  after the client's keys; unknown keys are dropped. A tool-level `defer_loading` is copied
  into the function when the function has none. Tools reach the template only when
  `tool_choice` is not "none"; a named tool choice passes that tool alone. A `tools | tojson`
  template therefore renders more ids than `apply_chat_template(messages, tools=tools)` of the
  client's own dicts (seen on a real 0.5.23: 148 against 143);
- messages as `model_dump()` with their None fields dropped (`process_content_for_template_format`):
  a user message keeps `role` and `content` only (its `name` is gone), the others `role`,
  `content`, `tool_call_id`, `name`, `phase`, `reasoning_content`, `tool_calls`, `tools` and
  `prefix` where given; a None content becomes ""; a list of text parts is joined with spaces
  (the "string" content format of templates that never loop over content parts); each tool
  call is `{"id", "index", "type", "function": {"name", "arguments"}}` with its JSON
  `arguments` string parsed into an object (`normalize_assistant_tool_call_arguments`: not
  JSON, or not an object, is a 400);
- a last assistant message with text content as a user message, or, with
  `continue_final_message`, left out and its text encoded after the rendered prompt
  (`_handle_last_assistant_message`);
- the template kwargs: `chat_template_kwargs`, with `thinking` and `enable_thinking` defaulted
  from `reasoning_effort` (not "none": true) and `reasoning_effort` passed on; a request's own
  `chat_template` is a 400 unless the server runs with `--trust-request-chat-template`.

The template renders to text with the generation prompt, and the text is encoded (without
special tokens when the tokenizer adds them to an empty string); a template error is a 400,
after one more try with each tool's function object alone. Without a tokenizer (or without
transformers) the prompt is the messages' contents as simulator text.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec

__all__ = [
    "ChatPrompt",
    "RenderError",
    "chat_prompt",
    "refusal",
    "render_ids",
    "template_kwargs",
    "template_messages",
    "template_tools",
]

# protocol.py field order of what the template sees.
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")
_FUNCTION_DROPPED_WHEN_NONE = ("strict", "defer_loading")
_MESSAGE_FIELDS = (
    "role", "content", "tool_call_id", "name", "phase", "reasoning_content", "tool_calls",
    "tools", "prefix",
)
_USER_FIELDS = ("role", "content")
CHAT_TEMPLATE_REFUSED = (
    "Request-supplied chat_template is not allowed. Start the server with "
    "--trust-request-chat-template to permit it."
)
ARGUMENTS_NOT_JSON = "Assistant tool call function.arguments must be valid JSON."
ARGUMENTS_NOT_OBJECT = "Assistant tool call function.arguments must be a JSON object."


class RenderError(ValueError):
    """A chat request SGLang answers 400 (a ValueError in serving_chat) while rendering it."""


class ChatPrompt(NamedTuple):
    """The prompt as sent to the engine, and whether tools reached the template."""

    prompt: list[int] | str
    with_tools: bool


def refusal(body: Mapping[str, Any], *, trust_chat_template: bool = False) -> str | None:
    """SGLang's 400 message for a body its `_validate_request` refuses (before the streaming
    checks), None when it passes: a request's own chat template, a tool choice without tools."""
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and "chat_template" in kwargs and not trust_chat_template:
        return CHAT_TEMPLATE_REFUSED
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    if isinstance(choice, str) and choice.lower() == "required" and not tools:
        return "Tools cannot be empty if tool choice is set to required."
    if isinstance(choice, dict):
        if not tools:
            return "Tools cannot be empty if tool choice is set to a specific tool."
        name = _choice_name(choice)
        if not any(_tool_name(tool) == name for tool in tools):
            return f"Tool '{name}' not found in tools list."
    return None


def _choice_name(choice: Mapping[str, Any]) -> object:
    function = choice.get("function")
    return function.get("name") if isinstance(function, dict) else None


def _tool_name(tool: object) -> object:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def chat_prompt(tokenizer_path: str | None, body: Mapping[str, Any]) -> ChatPrompt:
    """The prompt of a /v1/chat/completions body that passed `refusal` (its `messages` a
    non-empty list); RenderError for what SGLang refuses with a 400 while rendering."""
    kwargs = template_kwargs(body)
    tools = template_tools(body.get("tools"), body.get("tool_choice"))
    messages = template_messages(body["messages"])
    messages, prefix = _last_assistant(messages, bool(body.get("continue_final_message")))
    if tokenizer_path is not None:
        with contextlib.suppress(ImportError):
            tokenizer = _tokenizer(tokenizer_path)
            ids = render_ids(tokenizer, messages, tools, kwargs)
            if prefix:
                ids += _prefix_ids(tokenizer, prefix)
            return ChatPrompt(ids, bool(tools))
    contents = (one.get("content", "") for one in body["messages"] if isinstance(one, dict))
    return ChatPrompt(" ".join(map(str, contents)), bool(tools))


@functools.cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The template's keyword arguments (protocol.py `normalize_reasoning_inputs`,
    serving_chat `_convert_to_internal_request`, `_apply_jinja_template`)."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RenderError("chat_template_kwargs must be an object")
    kwargs = dict(kwargs)
    effort = body.get("reasoning_effort")
    if effort is not None:
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
    inner = kwargs.pop("reasoning_effort", None)
    effort = inner if inner is not None else effort
    return kwargs if effort is None else {"reasoning_effort": effort, **kwargs}


def template_tools(tools: object, tool_choice: object) -> list[dict[str, Any]] | None:
    """The tools as the template sees them (`[tool.model_dump() ...]`), None when there are
    none or `tool_choice` is "none" (the default without tools)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RenderError("tools must be a list of tool objects")
    dumped = [_dump_tool(tool) for tool in tools]
    if not dumped or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = _choice_name(tool_choice)
        return [tool for tool in dumped if tool["function"]["name"] == name] or None
    return dumped


def _dump_tool(tool: object) -> dict[str, Any]:
    """protocol.py `Tool.model_dump()`: type, function, defer_loading (None kept)."""
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        raise RenderError("each tool must be an object with a 'function' object")
    defer = tool.get("defer_loading")
    return {
        "type": tool.get("type", "function"),
        "function": _dump_function(tool["function"], defer),
        "defer_loading": defer,
    }


def _dump_function(function: dict[str, Any], defer: object) -> dict[str, Any]:
    """protocol.py `Function._serialize`: strict and defer_loading dropped when None, the
    client's keys first in the client's order, then the remaining fields (the tool's
    `defer_loading`, copied in when the function has none, among them)."""
    if not isinstance(function.get("name"), str):
        raise RenderError("each tool's function needs a string 'name'")
    data = {field: function.get(field) for field in _FUNCTION_FIELDS}
    if data["defer_loading"] is None:
        data["defer_loading"] = defer
    for field in _FUNCTION_DROPPED_WHEN_NONE:
        if data[field] is None:
            del data[field]
    order = [key for key in function if key in data]
    return {key: data[key] for key in order + [key for key in data if key not in order]}


def template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The messages as the template sees them (see the module docstring)."""
    return [_template_message(message) for message in messages]


def _template_message(message: object) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RenderError("each message must be an object with a string 'role'")
    role = message["role"] if message["role"] == "user" else message["role"].lower()
    fields = _USER_FIELDS if role == "user" else _MESSAGE_FIELDS
    dumped = {field: message.get(field) for field in fields}
    dumped["role"] = role
    if isinstance(dumped.get("tool_calls"), list):
        dumped["tool_calls"] = [_dump_call(call, role) for call in dumped["tool_calls"]]
    if isinstance(dumped.get("tools"), list):
        dumped["tools"] = [_dump_tool(tool) for tool in dumped["tools"]]
    content = dumped["content"]
    dumped["content"] = "" if content is None else _flat_content(content)
    return {key: value for key, value in dumped.items() if value is not None}


def _dump_call(call: object, role: str) -> dict[str, Any]:
    """protocol.py `ToolCall.model_dump()`, its arguments parsed for an assistant's call."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise RenderError("each tool call must be an object with a 'function' object")
    function = call["function"]
    arguments = function.get("arguments")
    if role == "assistant" and isinstance(arguments, str):
        arguments = _parsed_arguments(arguments)
    return {
        "id": call.get("id"),
        "index": call.get("index"),
        "type": "function",
        "function": {"name": function.get("name"), "arguments": arguments},
    }


def _parsed_arguments(text: str) -> dict[str, Any]:
    """serving_chat `parse_tool_call_arguments`."""
    try:
        parsed = msgspec.json.decode(text)
    except msgspec.DecodeError:
        raise RenderError(ARGUMENTS_NOT_JSON) from None
    if not isinstance(parsed, dict):
        raise RenderError(ARGUMENTS_NOT_OBJECT)
    return parsed


def _flat_content(content: object) -> object:
    """A list of content parts as the "string" content format flattens it: text parts joined
    by spaces, other parts left out."""
    if not isinstance(content, list):
        return content
    texts = [
        part["text"] for part in content
        if isinstance(part, dict) and part.get("type") in ("text", "input_text")
    ]
    return " ".join(texts)


def _last_assistant(
    messages: list[dict[str, Any]], continue_final: bool
) -> tuple[list[dict[str, Any]], str | None]:
    """serving_chat `_handle_last_assistant_message`: (messages, assistant prefix)."""
    if not messages or messages[-1].get("role") != "assistant":
        return messages, None
    content = messages[-1].get("content")
    if not isinstance(content, str):
        return messages, None
    if continue_final:
        return messages[:-1], content
    return [*messages[:-1], {"role": "user", "content": content}], None


def render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> list[int]:
    """The rendered prompt's ids (`_render_and_encode_chat_template`: text, then encode)."""
    text = _render(tokenizer, messages, tools, kwargs)
    if _adds_specials(tokenizer):
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text))


def _render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> str:
    """The template's text; on failure once more with each tool's function alone, whose
    template errors (and TypeErrors) are 400s."""
    import jinja2

    try:
        return _apply(tokenizer, messages, tools, kwargs)
    except Exception:  # noqa: BLE001 (SGLang retries whatever the first rendering raised)
        flat = [tool.get("function", tool) for tool in tools] if tools else None
        try:
            return _apply(tokenizer, messages, flat, kwargs)
        except (jinja2.TemplateError, TypeError) as exc:
            raise RenderError(str(exc)) from exc


def _apply(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> str:
    return str(tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, tools=tools, return_dict=False,
        **kwargs,
    ))


def _adds_specials(tokenizer: Any) -> bool:
    """Whether the tokenizer adds special tokens to an empty string (serving_chat's probe)."""
    try:
        return len(tokenizer.encode("")) > 0
    except Exception:  # noqa: BLE001 (a tokenizer's own code raises anything; SGLang then
        # assumes it does add them)
        return True


def _prefix_ids(tokenizer: Any, prefix: str) -> list[int]:
    """`_append_assistant_prefix_to_prompt_ids`: the prefix encoded, a leading BOS dropped."""
    ids = list(tokenizer.encode(prefix))
    if ids and ids[0] == tokenizer.bos_token_id:
        ids = ids[1:]
    return ids
