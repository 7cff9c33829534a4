"""Model profiles: the special token ids a model's outputs are checked and split with.

Keep every model-specific id here; rules, the simulator and exports look them up by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from workbench.errors import ConfigError

__all__ = [
    "PROFILES",
    "TOOL_MARKER_TEXT",
    "ModelProfile",
    "ToolFormat",
    "ToolMarkers",
    "get_profile",
    "reasoning_expected",
]

# How a model writes tool calls in its reply, by the name of SGLang's parser for it
# (`--tool-call-parser`): Kimi-K2's marked section of calls, or Qwen's JSON in <tool_call> tags.
ToolFormat = Literal["kimi_k2", "qwen25"]
# The text of each tool-call marker (by ToolMarkers field), per format.
TOOL_MARKER_TEXT: dict[ToolFormat, dict[str, str]] = {
    "kimi_k2": {
        "section_begin": "<|tool_calls_section_begin|>",
        "section_end": "<|tool_calls_section_end|>",
        "call_begin": "<|tool_call_begin|>",
        "argument_begin": "<|tool_call_argument_begin|>",
        "call_end": "<|tool_call_end|>",
    },
    "qwen25": {"call_begin": "<tool_call>", "call_end": "</tool_call>"},
}


class ToolMarkers(msgspec.Struct, frozen=True):
    """The special ids a reply's tool calls are written with, in one `format`.

    kimi_k2: ``section_begin (call_begin ID argument_begin ARGUMENTS call_end)* section_end``,
    the ID being ``functions.NAME:INDEX``; qwen25: ``call_begin JSON call_end`` per call, the
    JSON holding ``name`` and ``arguments`` (no section, no argument marker).
    """

    format: ToolFormat
    call_begin: int
    call_end: int
    section_begin: int | None = None
    section_end: int | None = None
    argument_begin: int | None = None


class ModelProfile(msgspec.Struct, frozen=True):
    """Special ids of one model family.

    `think_in_template`: the chat template already opens the reasoning block in the prompt, so
    a completion holds no think-start id and one think-end id. `thinking_kwarg` is the
    chat-template argument that switches thinking on. `sim_content_ids` is the range of the
    example tokenizer's ordinary (non-special) ids, the simulator's vocabulary.
    `special_start` is the first special (reserved, control) id of the model's vocabulary:
    the ids from it on are not text (None: the profile does not say); `reply_special_ids` the
    special ids an ordinary reply holds besides the think and end ids (tool-call markers).
    `tool_markers` says how the model writes tool calls (None: the profile does not say).
    """

    name: str
    vocab_size: int
    think_start: int | None
    think_end: int | None
    end_ids: tuple[int, ...]
    eos_id: int | None
    thinking_kwarg: str | None
    think_in_template: bool = True
    sim_content_ids: tuple[int, int] = (0, 1294)
    special_start: int | None = None
    reply_special_ids: tuple[int, ...] = ()
    tool_markers: ToolMarkers | None = None

    @property
    def is_reasoning(self) -> bool:
        return self.think_end is not None

    @property
    def tool_format(self) -> ToolFormat | None:
        """SGLang's tool-call parser name for the model, or None."""
        return None if self.tool_markers is None else self.tool_markers.format


PROFILES: dict[str, ModelProfile] = {
    "kimi-k2.5": ModelProfile(
        name="kimi-k2.5",
        vocab_size=163840,
        think_start=163606,
        think_end=163607,
        end_ids=(163586,),
        eos_id=163585,
        thinking_kwarg="thinking",
        think_in_template=True,
        special_start=163584,
        reply_special_ids=(163595, 163596, 163597, 163598, 163599),  # <|tool_call...|> markers
        tool_markers=ToolMarkers(
            format="kimi_k2",
            call_begin=163597,  # <|tool_call_begin|>
            call_end=163599,  # <|tool_call_end|>
            section_begin=163595,  # <|tool_calls_section_begin|>
            section_end=163596,  # <|tool_calls_section_end|>
            argument_begin=163598,  # <|tool_call_argument_begin|>
        ),
    ),
    "qwen3": ModelProfile(
        name="qwen3",
        vocab_size=151936,
        think_start=151667,
        think_end=151668,
        end_ids=(151645,),
        eos_id=151643,
        thinking_kwarg="enable_thinking",
        think_in_template=False,
        special_start=151643,
        reply_special_ids=(151657, 151658),  # <tool_call>, </tool_call>
        tool_markers=ToolMarkers(format="qwen25", call_begin=151657, call_end=151658),
    ),
    "plain": ModelProfile(
        name="plain",
        vocab_size=32000,
        think_start=None,
        think_end=None,
        end_ids=(2,),
        eos_id=2,
        thinking_kwarg=None,
        think_in_template=False,
    ),
}


def get_profile(name: str, key: str = "model_profile") -> ModelProfile:
    """The profile called `name`, or a ConfigError naming the key and the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ConfigError(key, f"unknown model profile {name!r} (known: {known})") from None


def reasoning_expected(profile: ModelProfile, chat_template_kwargs: Mapping[str, Any]) -> bool:
    """Whether replies should hold reasoning: a reasoning profile, thinking not switched off."""
    if profile.think_end is None:
        return False
    kwarg = profile.thinking_kwarg
    return not (kwarg is not None and chat_template_kwargs.get(kwarg) is False)
