"""The caller's side of an LM engine: its config, a request's handle (stream, result, cancel), its result and
the engine's stats.

Split from :mod:`dataplane.engine_lm` (which re-exports these names) to keep the engine module small.
"""

from __future__ import annotations

import collections
import math
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from dataplane.prefix_cache import PrefixCacheConfig
from dataplane.sampling import SamplingParams

_DONE = object()
TokenCallback = Callable[[int, str], None]


@dataclass(frozen=True)
class LMEngineConfig:
    """``max_batch`` concurrent sequences; ``kv_budget_tokens`` reserved tokens over all of them;
    ``prefix_cache``: reuse the KV of recent prompts' shared leading blocks (None: off);
    ``device_kv``: keep the batch's KV cache in the provider's memory between decode steps (None: where the
    model runs on CUDA and takes no adapter inputs, the case where the host round trip costs most)."""

    max_batch: int = 16
    kv_budget_tokens: int = 16384
    prefix_cache: PrefixCacheConfig | None = None
    device_kv: bool | None = None

    def __post_init__(self):
        # Checked here, not in the engine thread: max_batch=0 admitted nothing, so results never arrived.
        for name in ("max_batch", "kv_budget_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"LMEngineConfig.{name} must be a positive integer, got {v!r}")
        if self.prefix_cache is not None and not isinstance(self.prefix_cache, PrefixCacheConfig):
            raise ValueError(f"LMEngineConfig.prefix_cache must be a PrefixCacheConfig or None, "
                             f"got {self.prefix_cache!r}")
        if self.device_kv is not None and not isinstance(self.device_kv, bool):
            raise ValueError(f"LMEngineConfig.device_kv must be True, False or None, got {self.device_kv!r}")


@dataclass
class GenerationResult:
    """The outcome of one request. ``finish_reason`` is ``stop`` (EOS), ``length`` or ``cancelled``;
    ``cached_tokens``: prompt tokens whose KV came from the prefix cache instead of being prefilled."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    provider: str
    synthetic: bool
    cached_tokens: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class LMStats:
    """What an LM engine has run: iterations, prefills, tokens and how often each batch size ran."""
    steps: int = 0
    prefills: int = 0
    tokens: int = 0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)


@dataclass
class LMTiming:
    """Where one request's time went inside the engine (``time.monotonic()`` seconds; NaN until reached).

    ``admitted``: taken into the running batch (its prefill iteration starts); ``first_token`` / ``last_token``:
    its first and last sampled token. While it decodes, every iteration adds the time of the decode step it took
    part in (the batched forward call, sampling every row, retiring rows) to ``decode_s`` and, when other
    requests joined in that iteration, the time of their prefill (forward call, first-token sampling, merging
    their KV into the batch's) to ``stall_s``: prefill/decode interference. What is left of
    ``last_token - first_token`` is the engine loop's own bookkeeping between iterations.

    ``merge_s``: merging its KV into a running batch's after its prefill (part of ``prefill_s``; 0 when it started
    a batch): ``merge_tokens`` positions written into the merged arrays (rows x the common padded length), of which
    ``merge_pad_tokens`` first padded to that length in a copy of their own (the shorter side's rows). ``trims``
    times other rows left the batch while it decoded, its rows then copied out: ``trim_s`` and ``trim_tokens``
    (positions written) summed over them (part of ``decode_s``).
    """

    submitted: float = math.nan
    admitted: float = math.nan
    prefill_s: float = 0.0  # the prefill call its prompt was computed in (shared with the requests joining with it)
    prefill_rows: int = 0  # requests prefilled in that call
    prefill_len: int = 0  # the call's (left-padded) length: its longest prompt
    merge_s: float = 0.0
    merge_tokens: int = 0
    merge_pad_tokens: int = 0
    trims: int = 0
    trim_s: float = 0.0
    trim_tokens: int = 0
    first_token: float = math.nan
    last_token: float = math.nan
    first_piece: int = 0  # tokens it took to produce the first non-empty text piece (a UTF-8 character may span
    # several byte tokens), 0 before that
    decode_s: float = 0.0
    stall_s: float = 0.0
    steps: int = 0
    batch_sum: int = 0  # sum of the batch sizes of its decode steps (mean batch = batch_sum / steps)
    # sum of its decode steps' attention lengths: the batch's KV is left padded to its longest row, so a step's
    # cost follows that length, not this request's own (mean padded length = kv_len_sum / steps)
    kv_len_sum: int = 0
    finished: float = math.nan  # finalised: the decoder's last bytes flushed (a streamed tail is produced now)

    def add_trim(self, seconds: float, positions: int) -> None:
        self.trims += 1
        self.trim_s += seconds
        self.trim_tokens += positions

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in self.__dict__.items()}


class GenerationHandle:
    """A submitted request: iterate it for text pieces, ``result()`` for the whole, ``cancel()`` to stop."""

    def __init__(self, rid: int, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                 on_token: TokenCallback | None, wake: Callable[[], None], adapter=None, salt: bytes = b""):
        self.id, self.prompt_ids, self.params, self.max_tokens = rid, prompt_ids, params, max_tokens
        self.adapter, self.salt = adapter, salt  # LoRA adapter (None: base) and its prefix-cache namespace
        self.on_token = on_token
        self.future: Future = Future()
        # A caller may cancel the future itself (asyncio.wrap_future does on a cancelled await): that is a
        # cancel too, and the engine must hear of it to stop the request and return its KV reservation.
        self.future.add_done_callback(lambda f: f.cancelled() and wake())
        self.token_ids: list[int] = []
        self._events: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self._wake = wake
        self.timing = LMTiming()

    def cancel(self) -> None:
        """Ask the engine to stop this request; it finishes with ``finish_reason='cancelled'``."""
        self._cancel.set()
        self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set() or self.future.cancelled()

    def __iter__(self) -> Iterator[str]:
        """Text pieces as they are generated (blocking); re-raises the request's error, if any."""
        while (piece := self._events.get()) is not _DONE:
            yield piece
        exc = self.future.exception()
        if exc is not None:
            raise exc

    def result(self, timeout: float | None = None) -> GenerationResult:
        return self.future.result(timeout)
