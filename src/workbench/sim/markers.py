"""The special ids the simulator reads prompts and writes tool calls with.

Prompts are read in the example tokenizer's chat layout (`EXAMPLE_LAYOUT`: Kimi-K2.5's
template, examples/tokenizer), whatever the model profile: its vocabulary is the simulator's
for every profile. A message is a role marker, the role name, `<|im_middle|>`, the content and
`<|im_end|>`; declared tools are the system message `tool_declare` holding the tools as JSON;
a tool result is a system message named after the tool (or `tool`).

Tool calls are written in the model profile's own format (`ModelProfile.tool_markers`, named
after SGLang's tool-call parsers); this module adds the markers' names and whether they are
special tokens (left out of a reply's text with skip_special_tokens):

    kimi_k2  <|tool_calls_section_begin|> then, per call, <|tool_call_begin|>
             functions.NAME:IDX <|tool_call_argument_begin|> {json} <|tool_call_end|>,
             then <|tool_calls_section_end|>; the markers are special tokens
    qwen25   per call <tool_call> {"name": NAME, "parameters": {json}} </tool_call> (SGLang's
             parser takes "parameters" as it takes "arguments": the example vocabulary has
             no word "arguments"); the tags are ordinary added tokens, kept in the text
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from workbench.profiles import TOOL_MARKER_TEXT, ModelProfile, ToolFormat, ToolMarkers

__all__ = ["EXAMPLE_LAYOUT", "CallFormat", "ChatLayout", "call_format"]


class ChatLayout(NamedTuple):
    """The special ids of a chat template's messages."""

    user: int
    assistant: int
    system: int
    middle: int
    end: int
    call_begin: int


EXAMPLE_LAYOUT = ChatLayout(
    user=163587, assistant=163588, system=163594, middle=163601, end=163586, call_begin=163597
)


# Whether a format's markers are special tokens.
_SPECIAL: dict[ToolFormat, bool] = {"kimi_k2": True, "qwen25": False}


class CallFormat(NamedTuple):
    """How a model writes tool calls: the profile's markers, their names (id -> name) and
    whether they are special tokens."""

    markers: ToolMarkers
    names: dict[int, str]
    special: bool

    @property
    def style(self) -> ToolFormat:
        return self.markers.format


@functools.cache
def call_format(model: ModelProfile) -> CallFormat | None:
    """The model profile's tool-call format, None when its replies never call tools."""
    markers = model.tool_markers
    if markers is None:
        return None
    names = {
        getattr(markers, field): name
        for field, name in TOOL_MARKER_TEXT[markers.format].items()
        if getattr(markers, field) is not None
    }
    return CallFormat(markers, names, _SPECIAL[markers.format])
