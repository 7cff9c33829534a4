"""Facts read from a server's GET /server_info (SGLang's resolved server arguments).

SGLang's /server_info is `ServerArgs.resolved_dict()` plus scheduler info: `tp_size`,
`dp_size`, `pp_size` and `enable_dp_attention` at the top level (a router's /server_info
may hold several workers' under `internal_states`; the first one speaks for all).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["gpu_count"]


def _size(info: Mapping[str, Any], key: str) -> int:
    value = info.get(key)
    return value if type(value) is int and value >= 1 else 1


def gpu_count(info: Mapping[str, Any]) -> int | None:
    """The GPUs one server occupies: tp x pp, times dp unless DP attention shares the TP
    group's GPUs (SGLang's `--enable-dp-attention`); None when /server_info says nothing."""
    if not any(key in info for key in ("tp_size", "dp_size", "pp_size")):
        states = info.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], Mapping):
            return gpu_count(states[0]) if states[0] is not info else None
        return None
    gpus = _size(info, "tp_size") * _size(info, "pp_size")
    if not info.get("enable_dp_attention"):
        gpus *= _size(info, "dp_size")
    return gpus
