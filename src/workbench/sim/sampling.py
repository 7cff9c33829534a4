"""SGLang 0.5.23's `sampling_params`: the JSON contract, then `SamplingParams.verify`.

Two checks, two error shapes, as SGLang answers them:

- The contract gate (`sglang/api/v1/api_types.py`, `decode_SamplingParams`): an unknown key or
  a value of the wrong JSON type is refused before anything else with HTTP 400 and the body
  `{"error": "<serde's text>"}`, e.g. "unknown field `foo`, expected one of `max_new_tokens`,
  ...". `ContractError` carries that text.
- `SamplingParams.verify` (`srt/sampling/sampling_params.py`): values out of range raise a
  ValueError that `http_server._create_error_response` answers with HTTP 400 and
  `{"error": {"message": ...}}`. `InvalidRequest` (protocol.py) carries those.

`null` means the default for every key (SamplingParams.__post_init__). `temperature` 0 is
greedy. Keys the simulator accepts but that change nothing in its outputs (penalties, grammars,
`logit_bias`, ...) are still type-checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = [
    "SAMPLING_FIELDS",
    "ContractError",
    "Sampling",
    "decode_sampling",
    "unexpected",
    "verify",
]


class ContractError(ValueError):
    """A body that breaks SGLang's JSON contract (HTTP 400, `{"error": "<text>"}`)."""


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """The sampling parameters the simulator acts on, defaults as in SGLang."""

    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = None
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def unexpected(value: object) -> str:
    """serde's `Unexpected` display of a JSON value (api_types.py `_unexpected`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return "sequence" if isinstance(value, list) else "map"


def _invalid(value: object, expected: str) -> ContractError:
    return ContractError(f"invalid type: {unexpected(value)}, expected {expected}")


def _int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _invalid(value, "i64")


def _float(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise _invalid(value, "f64")


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _invalid(value, "a boolean")


def _str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise _invalid(value, "a string")


def _seq(value: object) -> list[Any]:
    if isinstance(value, list):
        return value
    raise _invalid(value, "a sequence")


def _str_or_list(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(_str(one) for one in value)
    if isinstance(value, str):
        return (value,)
    raise _invalid(value, "a value or an array of values for StringOrList")


def _int_list(value: object) -> frozenset[int]:
    return frozenset(_int(one) for one in _seq(value))


def _float_map(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        raise _invalid(value, "a map")
    return {key: _float(one) for key, one in value.items()}


def _any(value: object) -> object:
    return value


def _watermark(value: object) -> object:
    if not isinstance(value, dict):
        raise _invalid(value, "struct WatermarkRequestConfig")
    return value


# Every key of api_types.py `_FIELDS_SamplingParams`, in its order, with its decoder.
SAMPLING_FIELDS: dict[str, Callable[[object], object]] = {
    "max_new_tokens": _int,
    "stop": _str_or_list,
    "stop_token_ids": _int_list,
    "stop_regex": _str_or_list,
    "temperature": _float,
    "top_p": _float,
    "top_k": _int,
    "min_p": _float,
    "frequency_penalty": _float,
    "presence_penalty": _float,
    "repetition_penalty": _float,
    "min_new_tokens": _int,
    "n": _int,
    "json_schema": _str,
    "regex": _str,
    "ebnf": _str,
    "structural_tag": _str,
    "ignore_eos": _bool,
    "skip_special_tokens": _bool,
    "spaces_between_special_tokens": _bool,
    "no_stop_trim": _bool,
    "stream_interval": _int,
    "logit_bias": _float_map,
    "sampling_seed": _int,
    "custom_params": _any,
    "beam_width": _int,
    "watermark": _watermark,
    "choice": lambda value: tuple(_str(one) for one in _seq(value)),
}
_KEPT = frozenset(Sampling.__struct_fields__)


def _unknown_field(key: str) -> ContractError:
    listed = ", ".join(f"`{name}`" for name in SAMPLING_FIELDS)
    return ContractError(f"unknown field `{key}`, expected one of {listed}")


def decode_sampling(value: object) -> tuple[Sampling, dict[str, Any]]:
    """The contract-checked parameters: what the simulator acts on, and every key given."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _invalid(value, "struct SamplingParams")
    given: dict[str, Any] = {}
    for key, raw in value.items():
        decoder = SAMPLING_FIELDS.get(key)
        if decoder is None:
            raise _unknown_field(key)
        if raw is not None:
            given[key] = decoder(raw)
    kept = {key: one for key, one in given.items() if key in _KEPT}
    return Sampling(**kept), given


def verify(sampling: Sampling, given: dict[str, Any], vocab_size: int) -> None:
    """SamplingParams.verify's checks and messages (ValueError -> HTTP 400)."""
    for message in _violations(sampling, given, vocab_size):
        raise ValueError(message)


def _violations(sampling: Sampling, given: dict[str, Any], vocab_size: int) -> list[str]:
    found: list[str] = []
    if not math.isfinite(sampling.temperature) or sampling.temperature < 0.0:
        found.append(
            f"temperature must be a non-negative finite number, got {sampling.temperature}."
        )
    if not 0.0 < sampling.top_p <= 1.0:
        found.append(f"top_p must be in (0, 1], got {sampling.top_p}.")
    min_p = given.get("min_p", 0.0)
    if not 0.0 <= min_p <= 1.0:
        found.append(f"min_p must be in [0, 1], got {min_p}.")
    if sampling.top_k < 1 and sampling.top_k != -1:
        found.append(f"top_k must be -1 (disable) or at least 1, got {sampling.top_k}.")
    for name in ("frequency_penalty", "presence_penalty"):
        penalty = given.get(name, 0.0)
        if not -2.0 <= penalty <= 2.0:
            found.append(f"{name} must be in [-2, 2], got {penalty}.")
    repetition = given.get("repetition_penalty", 1.0)
    if not 0.0 < repetition <= 2.0:
        found.append(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition}.")
    found += _length_violations(sampling)
    for token in given.get("logit_bias", {}):
        if not token.lstrip("-").isdigit() or not 0 <= int(token) < vocab_size:
            found.append(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token}.")
    grammars = ("json_schema", "regex", "ebnf", "structural_tag")
    if sum(1 for name in grammars if given.get(name)) > 1:
        found.append("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    return found


def _length_violations(sampling: Sampling) -> list[str]:
    found: list[str] = []
    if sampling.min_new_tokens < 0:
        found.append(
            f"min_new_tokens must be in [0, max_new_tokens], got {sampling.min_new_tokens}."
        )
    if sampling.max_new_tokens < 0:
        found.append(f"max_new_tokens must be at least 0, got {sampling.max_new_tokens}.")
    elif sampling.min_new_tokens > sampling.max_new_tokens:
        found.append(
            f"min_new_tokens must be in [0, max_new_tokens({sampling.max_new_tokens})], got "
            f"{sampling.min_new_tokens}."
        )
    # The simulator's own guards (SGLang leaves these unchecked): at least one sample, and
    # a positive chunk size.
    if sampling.n < 1:
        found.append(f"n must be at least 1, got {sampling.n}.")
    if sampling.stream_interval is not None and sampling.stream_interval < 1:
        found.append(f"stream_interval must be at least 1, got {sampling.stream_interval}.")
    return found
