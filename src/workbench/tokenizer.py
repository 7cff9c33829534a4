"""The model's Hugging Face tokenizer: loaded once per local folder, and its chat template.

Prompts of the chat inputs (``messages``, ``conversations``) are rendered with it, tool
schemas declared (:mod:`workbench.generate.prompts`); a conversation's replies are read back
with it turn by turn (:mod:`workbench.chat`), the explorer and the reports decode replies with
it, and the export renders conversations back with it. transformers is an optional
dependency (the ``tokenizers`` extra): without it, a ConfigError names the extra to install.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError

__all__ = ["INSTALL_HINT", "check_tokenizer_dir", "decode", "encode_messages", "load_tokenizer"]

INSTALL_HINT = "pip install 'workbench[tokenizers]'"


def encode_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    kwargs: Mapping[str, Any],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template, generation prompt added.

    `tools` (OpenAI function schemas) reach the template only when given, so a row without
    tools renders exactly as the template renders it alone. transformers 5 returns a
    BatchEncoding (a mapping with `input_ids`), 4.x a list of ids.
    """
    extra = dict(kwargs) if tools is None else {**kwargs, "tools": tools}
    result = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **extra
    )
    ids = result["input_ids"] if isinstance(result, Mapping) else result
    return list(ids)


def decode(tokenizer: Any, ids: list[int]) -> str:
    """The text of `ids`, special tokens (reasoning and tool-call markers, end ids) skipped."""
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> Any:
    """A Hugging Face tokenizer from a local directory, loaded once per directory.

    `trust_remote_code` runs the directory's own tokenizer code (Kimi-K2.5's tiktoken tokenizer
    needs it). ConfigError when transformers is missing or the directory holds no tokenizer,
    or is gone (a long-lived process, a notebook kernel, whose directory was moved since).
    """
    resolved = str(Path(path).expanduser().resolve())
    check_tokenizer_dir(resolved)
    return _load_tokenizer(resolved, trust_remote_code)


def check_tokenizer_dir(path: str | Path) -> None:
    """ConfigError unless path is a directory (before anything loads from it)."""
    if not Path(path).is_dir():
        raise ConfigError("tokenizer", f"directory not found: {path}")


@functools.cache
def _load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    check_tokenizer_dir(path)
    auto_tokenizer = _auto_tokenizer()
    try:
        return auto_tokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as exc:  # the Rust backend and a model's own tokenizer code raise anything
        raise ConfigError("tokenizer", f"cannot load a tokenizer from {path}: {exc}") from None


def _auto_tokenizer() -> Any:
    """transformers.AutoTokenizer, imported without its "PyTorch was not found" banner."""
    try:
        with _environ(TRANSFORMERS_NO_ADVISORY_WARNINGS="1"):
            from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(
            "tokenizer", f"input 'messages' needs transformers: {INSTALL_HINT}"
        ) from None
    return AutoTokenizer


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of the block (kept when already set)."""
    added = [name for name in values if name not in os.environ]
    os.environ.update({name: values[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)
