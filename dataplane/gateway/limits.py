"""Per-account limits of the gateway: requests per minute, a daily neuron budget, and a brake on failed auth.

All three are clock-free, like the control plane: every method takes ``now`` (seconds) from the caller, so tests
drive them with made-up times. A refusal is a :class:`Refusal` with the seconds after which a retry can succeed.

Rate limits default to Workers AI's published per-minute limits
(developers.cloudflare.com/workers-ai/platform/limits): a limit per task type, with per-model exceptions, per
account. Counting uses the sliding-window counter Cloudflare describes for its own rate limiting: the previous
minute's count, weighted by how much of it still overlaps the last 60 s, plus the current minute's count. So at
most about ``limit`` requests pass in any 60 s, without a burst at each minute boundary. Refused requests do not
count.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

WINDOW_S = 60.0
DAY_S = 86_400.0

# Requests per minute per task type, and the per-model exceptions, as the limits page lists them.
WORKERS_AI_TASK_RPM = {
    "automatic-speech-recognition": 720,
    "image-classification": 3000,
    "image-to-text": 720,
    "object-detection": 3000,
    "summarization": 1500,
    "text-classification": 2000,
    "text-embeddings": 3000,
    "text-generation": 300,
    "text-to-image": 720,
    "translation": 720,
    # Not on the page: a reranker is a cross-encoder scoring (query, passage) pairs, so it gets the text
    # classification figure.
    "text-reranking": 2000,
}
WORKERS_AI_MODEL_RPM = {
    "@cf/baai/bge-large-en-v1.5": 1500,
    "@hf/thebloke/mistral-7b-instruct-v0.1-awq": 400,
    "@cf/microsoft/phi-2": 720,
    "@cf/qwen/qwen1.5-0.5b-chat": 1500,
    "@cf/qwen/qwen1.5-1.8b-chat": 720,
    "@cf/qwen/qwen1.5-14b-chat-awq": 150,
    "@cf/tinyllama/tinyllama-1.1b-chat-v1.0": 720,
    "@cf/runwayml/stable-diffusion-v1-5-img2img": 1500,
}


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, its limit, and when a retry can pass (seconds from now, > 0)."""

    reason: str
    limit: float
    retry_after_s: float


class SlidingWindowCounter:
    """Events per key in a sliding ``window_s`` window (two counters per key); at most ``max_keys`` keys are
    kept, least recently used first out, so clients cannot grow it without bound."""

    def __init__(self, window_s: float = WINDOW_S, max_keys: int = 100_000):
        self.window_s, self.max_keys = window_s, max_keys
        self._keys: OrderedDict = OrderedDict()  # key -> [window index, previous count, current count]

    def _state(self, key, now: float) -> list:
        idx = math.floor(now / self.window_s)
        st = self._keys.get(key)
        if st is None:
            st = self._keys[key] = [idx, 0, 0]
            if len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        if st[0] != idx:  # roll the windows forward
            st[1], st[2] = (st[2] if idx == st[0] + 1 else 0), 0
            st[0] = idx
        return st

    def rate(self, key, now: float) -> float:
        """The estimated number of events in the last ``window_s`` seconds."""
        idx, prev, cur = self._state(key, now)
        overlap = 1.0 - (now - idx * self.window_s) / self.window_s
        return prev * overlap + cur

    def add(self, key, now: float) -> None:
        self._state(key, now)[2] += 1

    def wait(self, key, now: float, limit: float) -> float:
        """Seconds until one more event fits under ``limit`` (0 if it fits now)."""
        idx, prev, cur = self._state(key, now)
        w = self.window_s
        start = idx * w
        if prev * (1.0 - (now - start) / w) + cur + 1 <= limit:
            return 0.0
        if cur + 1 <= limit and prev > 0:  # later in this window the previous one weighs less
            t = start + (1.0 - (limit - cur - 1) / prev) * w
            if t < start + w:
                return max(t - now, 1e-3)
        # In the next window the current count becomes the previous one.
        nxt = start + w
        t = nxt + max(0.0, 1.0 - (limit - 1) / cur) * w if cur > 0 else nxt
        return max(t - now, 1e-3)


class RateLimits:
    """Requests per minute per (account, task), or per (account, model) for models with their own limit.

    ``overrides`` maps a task name or model id to requests per minute (0: no limit) over the Workers AI figures.
    """

    def __init__(self, overrides: dict | None = None, enabled: bool = True):
        self.enabled = enabled
        self.task_rpm = dict(WORKERS_AI_TASK_RPM)
        self.model_rpm = dict(WORKERS_AI_MODEL_RPM)
        for key, rpm in (overrides or {}).items():
            (self.task_rpm if key in WORKERS_AI_TASK_RPM else self.model_rpm)[key] = rpm
        self._counter = SlidingWindowCounter()

    def limit_for(self, model: str, task: str) -> tuple[str, float]:
        """(what is counted: the model id or the task, requests per minute; 0 means unlimited)."""
        if model in self.model_rpm:
            return model, float(self.model_rpm[model])
        return task, float(self.task_rpm.get(task, 0))

    def check(self, account: str, model: str, task: str, now: float) -> Refusal | None:
        """The refusal :meth:`take` would give now, without counting anything."""
        return self._ask(account, model, task, now, count=False)

    def take(self, account: str, model: str, task: str, now: float) -> Refusal | None:
        """Count one request now, or refuse it (not counted) with the wait until one fits."""
        return self._ask(account, model, task, now, count=True)

    def _ask(self, account: str, model: str, task: str, now: float, count: bool) -> Refusal | None:
        if not self.enabled:
            return None
        scope, rpm = self.limit_for(model, task)
        if rpm <= 0:
            return None
        key = (account, scope)
        wait = self._counter.wait(key, now, rpm)
        if wait > 0:
            return Refusal(f"{scope}: {rpm:g} requests per minute", rpm, wait)
        if count:
            self._counter.add(key, now)
        return None

    def remaining(self, account: str, model: str, task: str, now: float) -> tuple[float, float] | None:
        """(limit, requests left in the sliding minute) for response headers; None when unlimited."""
        scope, rpm = self.limit_for(model, task)
        if not self.enabled or rpm <= 0:
            return None
        return rpm, max(0.0, rpm - self._counter.rate((account, scope), now))


class AuthThrottle:
    """Failed authentications per client address: past ``per_minute`` in a sliding minute, the client's requests
    are refused before any token is compared, until the window lets one more through. So a client can try at
    most about ``per_minute`` wrong tokens a minute, however fast it sends (0: no brake)."""

    def __init__(self, per_minute: int = 20):
        self.per_minute = per_minute
        self._failures = SlidingWindowCounter()

    def check(self, client: str, now: float) -> Refusal | None:
        if self.per_minute <= 0:
            return None
        wait = self._failures.wait(client, now, self.per_minute)
        if wait > 0:
            return Refusal(f"more than {self.per_minute} failed authentications a minute from this client",
                           self.per_minute, wait)
        return None

    def failed(self, client: str, now: float) -> None:
        if self.per_minute > 0:
            self._failures.add(client, now)


class NeuronBudget:
    """Neurons each account may spend per UTC day (``now`` here is Unix time); 0: no budget (Workers Paid).

    Requests are admitted while the day's spending is below the budget and charged what they really used when
    they end, so the last admitted requests can overrun it by their own cost (as a metered service does)."""

    def __init__(self, per_day: float = 0.0):
        self.per_day = per_day
        self._spent: dict[tuple[str, int], float] = {}

    def check(self, account: str, now: float) -> Refusal | None:
        if self.per_day <= 0:
            return None
        day = int(now // DAY_S)
        if self._spent.get((account, day), 0.0) < self.per_day:
            return None
        return Refusal(f"daily budget of {self.per_day:g} neurons spent", self.per_day,
                       max((day + 1) * DAY_S - now, 1e-3))

    def charge(self, account: str, now: float, neurons: float) -> None:
        if self.per_day > 0 and neurons > 0:
            key = (account, int(now // DAY_S))
            self._spent[key] = self._spent.get(key, 0.0) + neurons
            for old in [k for k in self._spent if k[1] < key[1] - 1]:  # keep today and yesterday only
                del self._spent[old]

    def spent(self, account: str, now: float) -> float:
        return self._spent.get((account, int(now // DAY_S)), 0.0)
