"""Whose rendering of a conversation a chat dataset's prompts follow, and where the two differ.

A chat dataset (input ``messages`` or ``conversations``) is rendered into token ids by a
chat template. Two renderings can differ for the same history: the tokenizer's template on
the client, and the server's (SGLang parses ``tools`` into its own models before the template
sees them: 0.5.23 adds ``"defer_loading": null`` to each tool). A dataset's ``render`` says
which one its data follows:

- ``tokenizer`` (the default): the prompt is rendered here and sent to ``/generate`` as ids;
  :func:`probe_rendering` asks the server once per dataset, when the run starts, how it
  renders a prompt with tools or history turns (:func:`probe_prompt`; ``/v1/chat/completions``
  with ``return_prompt_token_ids``, one token generated) and says whether the two differ.
- ``server``: the history is sent to ``/v1/chat/completions`` as messages (with the tools and
  the chat template arguments, ``return_token_ids`` and ``return_meta_info``): the prompt ids
  are the server's, what a deployment behind that endpoint feeds the model, and they are
  what prompts.jsonl keeps (with a digest of the history: what a resume compares). Every reply
  is compared with the tokenizer's rendering of the same history.

Each dataset's :class:`RenderingCheck` counts the prompts compared and those that differ;
run.json keeps them (``rendering``), and the first difference of a dataset is said once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.config import DatasetSpec, Sampling
from workbench.errors import BadRequest, ConfigError, ProtocolError, RequestFailed
from workbench.generate.prompts import Prompt
from workbench.server.client import SGLangClient

__all__ = ["RenderingCheck", "chat_payload", "check_server_renders", "first_difference",
           "probe_prompt", "probe_rendering"]


def chat_payload(spec: DatasetSpec, sampling: Sampling, prompt: Prompt, rid: str, model: str,
                 max_new_tokens: int | None = None) -> dict[str, Any]:
    """The /v1/chat/completions request of a prompt the server renders: its history, tools
    and chat template arguments, the dataset's sampling (every key explicit, as /generate's),
    the prompt and reply ids and meta_info asked back."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": prompt.messages,
        "max_tokens": max_new_tokens or sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "skip_special_tokens": False,
        "stream": False,
        "rid": rid,
        "return_token_ids": True,
        "return_meta_info": True,
    }
    if prompt.tools is not None:
        payload["tools"] = prompt.tools
    kwargs = spec.template_kwargs(prompt.mode)
    if kwargs:
        payload["chat_template_kwargs"] = dict(kwargs)
    return payload


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first position where two renderings differ (the shorter one's length when one
    is the start of the other); None when they are equal."""
    if ours == theirs:
        return None
    return next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)))


@dataclass(slots=True)
class RenderingCheck:
    """A dataset's renderings compared: the tokenizer's and the server's."""

    name: str
    follows: str  # "tokenizer" or "server": whose rendering the data keeps
    compared: int = 0
    differ: int = 0
    example: str | None = None  # the first difference, in words
    error: str | None = None  # why the server's rendering could not be had (probe)

    @classmethod
    def resumed(cls, name: str, follows: str, earlier: Any) -> RenderingCheck:
        """The dataset's check, going on from an earlier session's run.json entry (counts
        kept when its data followed the same rendering)."""
        check = cls(name, follows)
        if isinstance(earlier, Mapping) and earlier.get("follows") == follows:
            check.compared = _count(earlier.get("compared"))
            check.differ = _count(earlier.get("differ"))
            example = earlier.get("example")
            check.example = example if isinstance(example, str) else None
        return check

    def add(self, prompt: Prompt, server_ids: list[int]) -> str | None:
        """One prompt compared; the line to say when it is the dataset's first difference."""
        assert prompt.input_ids is not None
        self.compared += 1
        at = first_difference(prompt.input_ids, server_ids)
        if at is None:
            return None
        self.differ += 1
        if self.example is not None:
            return None
        turn = "" if prompt.turn is None else f", turn {prompt.turn}"
        self.example = (f"sample_id {prompt.sample_id!r}{turn}: {len(server_ids)} ids from the "
                        f"server, {len(prompt.input_ids)} from the tokenizer, first difference "
                        f"at id {at}")
        return (f"[{self.name}] the server renders prompts differently from the tokenizer's "
                f"chat template ({self.example}); the data follows the {self.follows}'s "
                f"rendering (render: {self.follows})")

    def record(self) -> dict[str, Any]:
        """run.json's ``rendering`` of the dataset."""
        return {"follows": self.follows, "compared": self.compared, "differ": self.differ,
                "example": self.example, "error": self.error}


async def check_server_renders(client: SGLangClient, spec: DatasetSpec, prompt: Prompt,
                                model: str) -> None:
    """ConfigError naming the dataset's `render` key when the server does not give a chat
    prompt's token ids back (/v1/chat/completions with return_token_ids and
    return_meta_info, one token): before anything is written, not as one failed turn after
    another. An outage or a busy server is the run's to wait for, not an answer."""
    rid = f"workbench-render-{random.getrandbits(64):016x}"
    payload = chat_payload(spec, Sampling(temperature=0.0, max_new_tokens=1), prompt, rid, model)
    try:
        await client.chat_generate(payload)
    except (ProtocolError, BadRequest) as exc:
        origin = spec.origin
        message = (f"server: the server does not give back the token ids of the chat prompts "
                   f"it renders (dataset {spec.name}): {exc} (use render: tokenizer)")
        if origin is None:
            raise ConfigError("render", message) from None
        raise ConfigError(f"datasets[{origin.index}].render", message, origin.source,
                          origin.lines.get("render", origin.item_line)) from None
    except RequestFailed:
        return


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def probe_prompt(pending: list[Prompt]) -> Prompt | None:
    """The prompt to ask the server about: the first with tools, else the first whose history
    holds an assistant turn (where the renderings part: tools as the server's models dump
    them, history turns as its messages do); None for a dataset of neither (plain chats
    render alike), which is not asked."""
    with_tools = next((p for p in pending if p.tools), None)
    if with_tools is not None:
        return with_tools
    return next((p for p in pending
                 if any(m.get("role") == "assistant" for m in p.messages or ())), None)


async def probe_rendering(client: SGLangClient, spec: DatasetSpec, prompt: Prompt, model: str,
                          check: RenderingCheck, say: Callable[[str], None]) -> None:
    """Ask the server how it renders `prompt`'s history (one token generated) and compare
    with the tokenizer's rendering; said when they differ, or when the server cannot say."""
    if prompt.input_ids is None or prompt.messages is None:
        return
    sampling = Sampling(temperature=0.0, max_new_tokens=1)
    rid = f"workbench-render-{random.getrandbits(64):016x}"
    payload = chat_payload(spec, sampling, prompt, rid, model)
    try:
        _result, server_ids = await client.chat_generate(payload)
    except RequestFailed as exc:
        check.error = str(exc)[:300]
        say(f"[{spec.name}] could not compare the server's rendering with the tokenizer's: "
            f"{check.error}")
        return
    message = check.add(prompt, server_ids)
    if message is not None:
        say(message + "; set render: server to follow the server's")

