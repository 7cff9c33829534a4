"""Conversations as data: a row's turns, the model's replies, the history of each turn.

Pure logic, no I/O: the prompt loader and the runner render and send what it builds.

    rows     a row's conversation (OpenAI ``messages`` or ShareGPT ``conversations``) and its
             tool schemas, read into one normalised layout; a bad row names its key path
    replies  the model's own turn read from its output ids: reasoning, content, tool calls
    turns    which turns a row asks for (``last`` or ``each``) and, turn by turn, the history
             the model is sent: its own earlier replies, the data's tool results answering
             its calls, or why the conversation ends
    render   each turn's prompt ids through a tokenizer handed in (``workbench.chat.render``:
             the one rendering the runner sends, validate checks and the export writes)
"""

from __future__ import annotations

from workbench.chat.replies import Reply, ToolCall, assistant_message, parse_reply
from workbench.chat.rows import (
    ChatRow,
    RowError,
    parse_conversations,
    parse_messages,
    parse_tools,
)
from workbench.chat.turns import (
    END_REASONS,
    TRUNCATED,
    Ended,
    counted_finishes,
    generation_points,
    history_digest,
    last_turn_messages,
    next_turn,
)

__all__ = [
    "END_REASONS",
    "TRUNCATED",
    "ChatRow",
    "Ended",
    "Reply",
    "RowError",
    "ToolCall",
    "assistant_message",
    "counted_finishes",
    "generation_points",
    "history_digest",
    "last_turn_messages",
    "next_turn",
    "parse_conversations",
    "parse_messages",
    "parse_reply",
    "parse_tools",
]
