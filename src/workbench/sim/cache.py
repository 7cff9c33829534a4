"""A two-tier prefix cache over prompt blocks, standing in for SGLang's radix cache.

A prompt is cut into blocks of `BLOCK_TOKENS` ids; block i is keyed by a hash chained over
blocks 0..i, so a key matches only when the whole prefix up to it matches. The device tier
holds at most the KV pool's free tokens (it shrinks as running requests grow); blocks evicted
from it move to the host tier when the hierarchical cache is on (LRU in both tiers).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["BLOCK_TOKENS", "PrefixCache", "PrefixHit", "block_hashes"]

BLOCK_TOKENS = 64


def block_hashes(ids: list[int]) -> list[int]:
    """Chained hashes of the prompt's full blocks."""
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        previous = hash((previous, tuple(ids[start : start + BLOCK_TOKENS])))
        hashes.append(previous)
    return hashes


class PrefixHit:
    """Tokens of a prompt found in the device tier and in the host tier."""

    __slots__ = ("device_tokens", "host_tokens")

    def __init__(self, device_tokens: int = 0, host_tokens: int = 0) -> None:
        self.device_tokens = device_tokens
        self.host_tokens = host_tokens

    @property
    def tokens(self) -> int:
        return self.device_tokens + self.host_tokens


class PrefixCache:
    """LRU block sets for the device pool and the host pool."""

    def __init__(self, device_tokens: int, host_tokens: int) -> None:
        self._device: OrderedDict[int, None] = OrderedDict()
        self._host: OrderedDict[int, None] = OrderedDict()
        self._device_limit = device_tokens // BLOCK_TOKENS
        self._host_limit = host_tokens // BLOCK_TOKENS

    @property
    def device_tokens(self) -> int:
        return len(self._device) * BLOCK_TOKENS

    @property
    def host_tokens(self) -> int:
        return len(self._host) * BLOCK_TOKENS

    def match(self, hashes: list[int]) -> PrefixHit:
        """The cached prefix of a prompt; host blocks found are promoted to the device tier."""
        hit = PrefixHit()
        for key in hashes:
            if key in self._device:
                self._device.move_to_end(key)
                hit.device_tokens += BLOCK_TOKENS
            elif key in self._host:
                del self._host[key]
                self._device[key] = None
                hit.host_tokens += BLOCK_TOKENS
            else:
                break
        return hit

    def reads_host(self, hashes: list[int]) -> bool:
        """Whether the cached prefix of a prompt would be read back from the host tier (no
        block moves)."""
        for key in hashes:
            if key in self._host:
                return True
            if key not in self._device:
                return False
        return False

    def insert(self, hashes: list[int]) -> None:
        """Record a prefilled prompt's blocks as the most recently used."""
        for key in hashes:
            self._host.pop(key, None)
            self._device[key] = None
            self._device.move_to_end(key)
        self.shrink(self._device_limit * BLOCK_TOKENS)

    def shrink(self, free_tokens: int) -> None:
        """Evict device blocks (to the host tier when there is one) beyond `free_tokens`."""
        limit = min(self._device_limit, max(free_tokens, 0) // BLOCK_TOKENS)
        while len(self._device) > limit:
            key, _ = self._device.popitem(last=False)
            if self._host_limit:
                self._host[key] = None
                if len(self._host) > self._host_limit:
                    self._host.popitem(last=False)

    def clear(self) -> None:
        """Drop every cached block (POST /flush_cache)."""
        self._device.clear()
        self._host.clear()
