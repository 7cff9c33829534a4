"""The queue and the running batch of one rank under its KV budget: admission, retraction, decode.

`Batch` is the state an `Engine` (`workbench.sim.engine`) steps, modelled on SGLang's scheduler:

1. Admission (`admit`; first come, first served, head of line blocks): a waiting request joins
   the batch when its tokens plus a reservation for its future output fit in what the pool has
   left, `free - sum(running reservations) >= tokens + reservation`, with
   `reservation = new_token_ratio * min(max_new_tokens - generated, 4096)`. The ratio starts at
   0.7 and decays to 0.1 over 600 steps (SGLang's defaults, `decay_ratio`); requests also stop
   joining at `max_running_requests` or once the step's prefill budget (`chunked_prefill_size`)
   is used. Its prompt is looked up in the prefix cache: cached tokens are not prefilled (with
   `prefix_cache=False`, SGLang's --disable-radix-cache, nothing is cached: every prompt is
   prefilled whole).
2. Retraction (`make_room`; `srt/managers/schedule_batch.py` `retract_decode`, scheduler.py's
   caller): when the batch's next tokens do not fit, requests leave the batch in SGLang's order
   (fewest output tokens first, then longest prompt), free their KV and go back to the front of
   the queue; they keep their output so far and are recomputed (prompt and output prefilled
   again) when readmitted. The ratio is re-estimated from the batch,
   `(decoded + 20 * running) / sum(max_new_tokens)`, each retraction is counted (batch,
   request, metrics) and SGLang's warning is logged ("KV cache pool is full. Retract
   requests. ..."). A request alone that still does not fit is aborted (HTTP 500). A request
   marked to abort that a retraction picks finishes there instead of going back to the queue.
3. Decode (`decode`): every running request gains one token; requests that reach their planned
   output length finish and free their tokens. A non-streaming request is reported updated
   every `FORCE_STREAM_INTERVAL` tokens, a streaming one every token.

Work per step is O(running requests) plus O(prompt blocks) for each admitted request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from workbench.sim.cache import PrefixCache
from workbench.sim.profiles import Sizing
from workbench.sim.request import Request, RequestState

__all__ = ["POOL_FULL_MESSAGE", "Batch", "BatchObserver"]

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
# output_streamer.py: a non-streaming request's progress reaches the tokenizer manager every
# SGLANG_FORCE_STREAM_INTERVAL (50) tokens, which is when its inter-token latency is observed.
FORCE_STREAM_INTERVAL = 50
POOL_FULL_MESSAGE = (
    "Out of memory even after retracting all other requests in the decode batch. Aborting "
    "the last request."
)
POOL_FULL_STATUS = 500


class BatchObserver(Protocol):
    """Told of retractions (the engine's observer is one)."""

    def on_retract(self, requests: list[Request]) -> None: ...


class Batch:
    """The waiting queue, the running batch and the KV tokens they hold (one rank's pool)."""

    def __init__(
        self,
        sizing: Sizing,
        *,
        observer: BatchObserver | None = None,
        log: Callable[[str], None] | None = None,
        prefix_cache: bool = True,
    ) -> None:
        self.sizing = sizing
        self.capacity = sizing.max_total_num_tokens
        self.cache = (
            PrefixCache(self.capacity, sizing.host_tokens) if prefix_cache else PrefixCache(0, 0)
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.used_tokens = 0
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.retractions = 0
        self._observer = observer
        self._log = log

    def admit(self) -> tuple[list[Request], int, int]:
        """Admit the waiting requests that fit; returns them, tokens prefilled, tokens loaded."""
        admitted: list[Request] = []
        prefilled = host_loaded = 0
        if not self.waiting:
            return admitted, prefilled, host_loaded
        available = self.capacity - self.used_tokens - self._reserved_tokens()
        while self._may_admit(len(admitted), prefilled):
            request = self.waiting[0]
            if request.aborted:
                self.waiting.popleft()
                request.state = RequestState.FINISHED
                continue
            need = request.kv_tokens + self._reservation(request)
            if need > available and self.running:
                break
            self.waiting.popleft()
            computed, loaded = self._prefill(request)
            prefilled += computed
            host_loaded += loaded
            available -= need
            admitted.append(request)
        self.cache.shrink(self.capacity - self.used_tokens)
        return admitted, prefilled, host_loaded

    def _may_admit(self, admitted: int, prefilled: int) -> bool:
        if not self.waiting or len(self.running) >= self.sizing.max_running_requests:
            return False
        return admitted == 0 or prefilled < self.sizing.chunked_prefill_size

    def _prefill(self, request: Request) -> tuple[int, int]:
        """Move a request into the batch; returns (tokens computed, tokens loaded from host)."""
        hit = self.cache.match(request.hashes)
        cached = min(hit.tokens, request.prompt_len - 1)
        loaded = max(0, cached - hit.device_tokens)
        self.cache.insert(request.hashes)
        request.cached_tokens += cached
        request.host_cached_tokens += loaded
        request.state = RequestState.RUNNING
        self.running.append(request)
        self.used_tokens += request.kv_tokens
        return request.kv_tokens - cached, loaded

    def _reservation(self, request: Request) -> int:
        remaining = min(request.max_new_tokens - request.generated, CLIP_MAX_NEW_TOKENS)
        return int(self.new_token_ratio * max(remaining, 0))

    def _reserved_tokens(self) -> int:
        return sum(self._reservation(request) for request in self.running)

    def make_room(self) -> list[Request]:
        """Retract requests until every running one has room for its next token."""
        if not self.running or self.used_tokens + len(self.running) <= self.capacity:
            return []
        # schedule_batch `_get_decode_retraction_order`: keep the longest outputs, then the
        # shortest prompts; the loop pops the least preferred.
        self.running.sort(key=lambda request: (request.generated, -request.prompt_len))
        self.running.reverse()
        retracted: list[Request] = []
        dropped: list[Request] = []
        gained = 0
        while len(self.running) > 1 and self.used_tokens + len(self.running) > self.capacity:
            victim = self.running.pop()
            self.used_tokens -= victim.kv_tokens
            gained += victim.kv_tokens
            if victim.aborted:  # marked to finish: it leaves now rather than wait in the queue
                victim.state = RequestState.FINISHED
                dropped.append(victim)
                continue
            victim.state = RequestState.WAITING
            victim.retractions += 1
            retracted.append(victim)
        if retracted:
            self._retracted(retracted, gained)
        if self.used_tokens + len(self.running) > self.capacity:
            dropped.append(self._abort_last())
        return dropped

    def _abort_last(self) -> Request:
        """The request left alone that still does not fit: aborted (HTTP 500), KV freed."""
        last = self.running.pop()
        self.used_tokens -= last.kv_tokens
        if not last.aborted:
            last.abort_message = POOL_FULL_MESSAGE
            last.abort_status = POOL_FULL_STATUS
        last.state = RequestState.FINISHED
        return last

    def _retracted(self, retracted: list[Request], gained: int) -> None:
        """Requeue retracted requests at the front, re-estimate the ratio, count and log."""
        self.waiting.extendleft(reversed(retracted))
        self.retractions += len(retracted)
        old_ratio = self.new_token_ratio
        self.new_token_ratio = self._ratio_after_retraction()
        if self._observer:
            self._observer.on_retract(retracted)
        if self._log:
            self._log(
                f"KV cache pool is full. Retract requests. #retracted_reqs: {len(retracted)}, "
                f"#new_tokens_gained: {gained}, #new_token_ratio: {old_ratio:.4f} -> "
                f"{self.new_token_ratio:.4f}"
            )

    def _ratio_after_retraction(self) -> float:
        """SGLang's estimate: (decoded + 20 per request) / max_new_tokens over the batch."""
        decoded = sum(request.generated for request in self.running)
        budget = sum(request.max_new_tokens for request in self.running)
        if budget <= 0:
            return 1.0
        return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / budget)

    def decode(self) -> tuple[list[Request], list[Request], list[Request], int]:
        """One token for each running request; returns (started, updated, finished, tokens)."""
        still: list[Request] = []
        started: list[Request] = []
        updated: list[Request] = []
        finished: list[Request] = []
        tokens = 0
        for request in self.running:
            if not request.aborted and request.generated < len(request.output_ids):
                request.generated += 1
                self.used_tokens += 1
                tokens += 1
                if request.generated == 1:
                    started.append(request)
            if request.aborted or request.generated >= len(request.output_ids):
                self.used_tokens -= request.kv_tokens
                request.state = RequestState.FINISHED
                finished.append(request)
            else:
                still.append(request)
                if request.stream or request.generated % FORCE_STREAM_INTERVAL == 0:
                    updated.append(request)
        self.running = still
        return started, updated, finished, tokens

    def decay_ratio(self) -> None:
        """A step's decay of the reservation ratio, down to its floor."""
        self.new_token_ratio = max(
            MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )
