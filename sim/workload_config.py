"""``WorkloadConfig``: what a scenario's ``[workload]`` table says, validated field by field.

Every bad key, type or range raises one one-line :class:`~edgepop.errors.UserError` naming where it came from
(``scenario.toml [workload]`` by default), the field and the value.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edgepop.errors import UserError
from sim.tokens import TaskTokens, tokens_from_dict
from sim.traces import MAX_SPAN_S, MAX_TOKENS, TRACE_FORMATS
from sim.validate import boolean, fraction, number, opt_integer, opt_number
from topology.pops import CONTINENTS

KINDS = ("poisson", *TRACE_FORMATS.names())  # generated arrivals, or a trace format of sim.traces
TRACE_START = "trace"  # start_utc = "trace": the day starts at the replayed trace's own first timestamp
DEFAULT_START_UTC = "2024-03-20T12:00:00Z"  # equinox noon UTC: Asia's evening, Europe's afternoon, US morning
DEFAULT_TRACE_MODEL = "@cf/meta/llama-3.1-8b-instruct"
MAX_REQUESTS = 100_000_000  # one run's requests: far past what fits in memory (about 1 KB each), a clear error
MAX_RPS = 1e7
MIN_DAY_COMPRESSION_S = 60.0  # a day in a minute: the per-bin diurnal rate would be too coarse below this
# Fields that only mean something for generated (poisson) or replayed (trace) workloads.
POISSON_ONLY = frozenset({"rps", "mix", "tokens", "bursts", "session_fraction", "session_turns", "think_time_s",
                          "diurnal", "block_tokens"})
TRACE_ONLY = frozenset({"trace", "trace_model", "trace_speed", "trace_limit"})


@dataclass(frozen=True)
class Burst:
    """Rate multiplier for ``[start_s, start_s + duration_s)`` of simulated time, for cities matching the filter
    (a continent code such as ``EU``, a country code such as ``DE``, or everywhere). Overlapping bursts multiply."""

    start_s: float
    duration_s: float
    multiplier: float
    continent: str | None = None
    country: str | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass
class WorkloadConfig:
    """How requests are made: a Poisson process over the topology's cities, or a replayed trace.

    ``rps`` is the mean total rate over a day: each city contributes population share x diurnal factor at its
    local hour (mean 1 over a day) x ``rps``. Give ``requests`` (stop after that many), ``duration_s`` (stop at
    that time), or both (whichever comes first); a trace replay may give neither.
    """

    kind: str = "poisson"
    requests: int | None = None
    duration_s: float | None = None
    rps: float = 100.0
    start_utc: datetime = field(default_factory=lambda: _parse_time("start_utc", DEFAULT_START_UTC, ""))
    day_compression: float | None = None  # simulated seconds per real day (3600 = a day in an hour); None = real
    diurnal: bool = True  # False: every city at its population share all day (a flat curve)
    mix: dict[str, float] | None = None  # model id -> share; None = controlplane.forecast.DEFAULT_MIX
    tokens: dict[str, TaskTokens] = field(default_factory=lambda: tokens_from_dict(None, ""))
    bursts: tuple[Burst, ...] = ()
    session_fraction: float = 0.0  # share of text-generation requests that are turns of multi-turn sessions
    session_turns: float = 4.0  # mean turns per session (geometric, at least 1)
    think_time_s: float = 30.0  # median gap between a session's turns (lognormal, sigma THINK_SIGMA)
    block_tokens: int = 512  # prefix-block size of hash_ids (Mooncake uses 512)
    batch_fraction: float = 0.0  # share of session-less requests sent as async batch (queueRequest)
    reject_if_busy_fraction: float = 0.0
    trace: str | None = None  # path; None = the trace shipped in sim/data for the kind
    trace_model: str = DEFAULT_TRACE_MODEL
    trace_speed: float = 1.0  # >1 replays faster: arrival_s = trace time / trace_speed
    trace_limit: int | None = None  # replay only the first N requests of the trace
    adapter_fraction: float = 0.0  # share of LLM requests (on models with LoRA adapters) naming an adapter
    adapter_zipf: float = 1.0  # popularity of a model's adapters: the i-th in catalog order ~ 1 / i^adapter_zipf

    @property
    def is_trace(self) -> bool:
        return self.kind != "poisson"

    @property
    def time_speed(self) -> float:
        """Real (diurnal-clock) seconds per simulated second."""
        return 86400.0 / self.day_compression if self.day_compression else 1.0

    @classmethod
    def from_dict(cls, d: dict, where: str = "scenario.toml [workload]", base_dir: str | Path | None = None
                  ) -> WorkloadConfig:
        """Validate a ``[workload]`` table. Relative ``trace`` paths are resolved against ``base_dir``."""
        if not isinstance(d, dict):
            raise UserError(f"{where}: expected a table, got {d!r}")
        known = {f.name for f in fields(cls)}
        for k in d:
            if k not in known:
                raise UserError(f"{where}: unknown field {k!r} (known: {', '.join(sorted(known))})")
        kind = d.get("kind", "poisson")
        if kind not in KINDS:
            raise UserError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        wrong = (POISSON_ONLY if kind != "poisson" else TRACE_ONLY) & set(d)
        if wrong:
            raise UserError(f"{where}: field {sorted(wrong)[0]!r} does not apply to kind = {kind!r}")
        c = cls(kind=kind)
        c.requests = opt_integer(where, "requests", d.get("requests"), 1)
        c.duration_s = opt_number(where, "duration_s", d.get("duration_s"), 0.0, lo_open=True)
        c.rps = number(where, "rps", d.get("rps", c.rps), 0.0, lo_open=True, hi=MAX_RPS)
        rate = None if c.is_trace else c.rps  # (a trace has no rps: its own arrivals set the count)
        check_size(where, c.requests, c.duration_s, rate)
        if "start_utc" in d:
            # "trace": the replayed trace's own first timestamp (known once the file is read)
            c.start_utc = TRACE_START if d["start_utc"] == TRACE_START else _parse_time("start_utc", d["start_utc"],
                                                                                         where)
            if c.start_utc == TRACE_START and not c.is_trace:
                raise UserError(f'{where}: start_utc = "trace" starts the day at a replayed trace\'s first timestamp: '
                                f'it needs a trace (kind = "azure"), not kind = {kind!r}')
        comp = opt_number(where, "day_compression", d.get("day_compression"), 0.0)
        if comp and comp < MIN_DAY_COMPRESSION_S:
            raise UserError(f"{where}: day_compression must be 0 (real time) or >= {MIN_DAY_COMPRESSION_S:g} "
                            f"simulated seconds per day, got {comp!r}")
        c.day_compression = comp or None
        c.diurnal = boolean(where, "diurnal", d.get("diurnal", True))
        c.mix = _mix(where, d["mix"]) if "mix" in d else None
        c.tokens = tokens_from_dict(d.get("tokens"), where)
        c.bursts = _bursts(where, d.get("bursts", []))
        check_size(where, c.requests, c.duration_s, rate, c.bursts)
        c.session_fraction = fraction(where, "session_fraction", d.get("session_fraction", 0.0))
        c.session_turns = number(where, "session_turns", d.get("session_turns", c.session_turns), 1.0, hi=1000.0)
        c.think_time_s = number(where, "think_time_s", d.get("think_time_s", c.think_time_s), 0.0, lo_open=True,
                                hi=86_400.0)
        c.block_tokens = opt_integer(where, "block_tokens", d.get("block_tokens", c.block_tokens), 1) or 0
        # (a block past the longest prompt is one block anyway; an unbounded int overflows numpy's int64)
        if not 1 <= c.block_tokens <= MAX_TOKENS:
            raise UserError(f"{where}: block_tokens must be an integer in [1, {MAX_TOKENS:,}], "
                            f"got {d.get('block_tokens')!r}")
        c.batch_fraction = fraction(where, "batch_fraction", d.get("batch_fraction", 0.0))
        c.reject_if_busy_fraction = fraction(where, "reject_if_busy_fraction", d.get("reject_if_busy_fraction", 0.0))
        if d.get("trace") is not None:
            if not isinstance(d["trace"], str) or not d["trace"].strip():
                raise UserError(f"{where}: trace must be a file path, got {d['trace']!r}")
            path = Path(d["trace"]).expanduser()
            c.trace = str(path if path.is_absolute() or base_dir is None else Path(base_dir) / path)
        model = d.get("trace_model", c.trace_model)
        if not isinstance(model, str) or not re.fullmatch(r"@[\w.\-]+(/[\w.\-]+){1,2}", model):
            raise UserError(f"{where}: trace_model must be a model id like {DEFAULT_TRACE_MODEL!r}, got {model!r}")
        c.trace_model = model
        c.trace_speed = number(where, "trace_speed", d.get("trace_speed", 1.0), 0.0, lo_open=True)
        c.trace_limit = opt_integer(where, "trace_limit", d.get("trace_limit"), 1)
        c.adapter_fraction = fraction(where, "adapter_fraction", d.get("adapter_fraction", 0.0))
        c.adapter_zipf = number(where, "adapter_zipf", d.get("adapter_zipf", 1.0), 0.0)
        return c

    def check(self, where: str = "workload") -> None:
        """Run :meth:`from_dict`'s checks on a config built or edited in Python (the constructor and
        ``dataclasses.replace`` check nothing): the same one-line errors, naming ``where``."""
        type(self).from_dict(self.to_dict(), where)

    def to_dict(self) -> dict:
        """A plain dict that ``from_dict`` reads back into an equal config (JSON/TOML-friendly). Fields edited in
        Python to what a file would hold (a time as text, a table, a list of tables) are passed on as they are, for
        ``from_dict`` to check."""
        d = {f.name: _as_in_a_file(getattr(self, f.name)) for f in fields(self)}
        if isinstance(self.start_utc, datetime):
            d["start_utc"] = self.start_utc.isoformat().replace("+00:00", "Z")
        if isinstance(self.tokens, dict):
            d["tokens"] = {task: t.to_dict() if hasattr(t, "to_dict") else t for task, t in self.tokens.items()}
        if isinstance(self.bursts, list | tuple):
            d["bursts"] = [{k: v for k, v in asdict(b).items() if v is not None} if is_dataclass(b) else b
                           for b in self.bursts]
        d["day_compression"] = self.day_compression or 0.0
        skip = POISSON_ONLY if self.is_trace else TRACE_ONLY
        if not self.adapter_fraction:  # configs without adapters keep their old form
            skip = skip | {"adapter_fraction", "adapter_zipf"}
        return {k: v for k, v in d.items() if v is not None and k not in skip}


def _as_in_a_file(value):
    """A field's value as a file holds it: a path as text, a numpy scalar as Python's own number (a config built in
    Python may carry either, and ``from_dict`` reads files)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value.item() if isinstance(value, np.generic) else value


def burst_requests(rps: float, duration_s: float, bursts) -> float:
    """Requests ``bursts`` add over ``[0, duration_s)`` at most: as if each burst covered every city (a filtered
    one multiplies part of the demand only), overlapping ones multiplied."""
    edges = sorted({0.0, duration_s, *(min(max(t, 0.0), duration_s) for b in bursts for t in (b.start_s, b.end_s))})
    extra = 0.0
    for a, z in zip(edges, edges[1:], strict=False):
        factor = 1.0
        for b in bursts:
            if b.start_s <= a < b.end_s:
                factor *= b.multiplier
        extra += max(factor - 1.0, 0.0) * rps * (z - a)
    return extra


def check_size(where: str, requests: int | None, duration_s: float | None, rps: float | None, bursts=()) -> None:
    """A workload's size: at most :data:`MAX_REQUESTS` requests (asked for, or expected from rps x duration
    with its ``bursts``) over at most a year of simulated time (the clock ticks at least once a simulated
    second). ``rps`` None: a trace replay, whose count its file sets (its span was checked when read)."""
    if requests is not None and requests > MAX_REQUESTS:
        raise UserError(f"{where}: requests must be at most {MAX_REQUESTS:,}, got {requests:,}")
    if duration_s is not None and duration_s > MAX_SPAN_S:
        raise UserError(f"{where}: duration_s must be at most a year ({MAX_SPAN_S:.0f} s), got {duration_s:g}")
    if rps is None:
        return
    if duration_s is not None and rps * duration_s > MAX_REQUESTS:
        raise UserError(f"{where}: rps x duration_s expects {rps * duration_s:.3g} requests, more than "
                        f"{MAX_REQUESTS:,}")
    if duration_s is not None and bursts:
        total = rps * duration_s + burst_requests(rps, duration_s, bursts)
        if total > MAX_REQUESTS:
            raise UserError(f"{where}: rps x duration_s with its bursts' multipliers expects up to {total:.3g} "
                            f"requests, more than {MAX_REQUESTS:,}")
    if requests is not None and requests / rps > MAX_SPAN_S:
        raise UserError(f"{where}: {requests:,} requests at {rps:g} rps span {requests / rps:.3g} s, more than a "
                        f"year ({MAX_SPAN_S:.0f} s)")


def _parse_time(name: str, value, where: str) -> datetime:
    if isinstance(value, datetime):
        t = value
    elif isinstance(value, str):
        try:
            t = datetime.fromisoformat(value.strip())
        except ValueError:
            raise UserError(f"{where}: {name} must be an ISO time like {DEFAULT_START_UTC!r}, got {value!r}") \
                from None
    else:
        raise UserError(f"{where}: {name} must be an ISO time like {DEFAULT_START_UTC!r}, got {value!r}")
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    if not 1900 <= t.year <= 2200:  # (a simulated year on from it must still be a date)
        raise UserError(f"{where}: {name} must fall in the years 1900-2200, got {value!r}")
    return t


def _mix(where: str, raw) -> dict[str, float]:
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{where}: mix must be a non-empty table of model id = share, got {raw!r}")
    out = {}
    for model, share in raw.items():
        out[model] = number(where, f"mix share of {model!r}", share, 0.0)
    total = sum(out.values())
    if total <= 0:
        raise UserError(f"{where}: mix shares sum to zero")
    if total == float("inf"):  # shares near the float limit overflow their sum
        raise UserError(f"{where}: mix shares' sum overflows: use relative shares (e.g. fractions or percents)")
    return out


def _bursts(where: str, raw) -> tuple[Burst, ...]:
    if not isinstance(raw, list):
        raise UserError(f"{where}: bursts must be a list of tables ([[workload.bursts]]), got {raw!r}")
    out = []
    for i, b in enumerate(raw):
        w = f"{where} bursts[{i}]"
        if not isinstance(b, dict):
            raise UserError(f"{w}: expected a table, got {b!r}")
        allowed = {"start_s", "duration_s", "multiplier", "continent", "country"}
        for k in b:
            if k not in allowed:
                raise UserError(f"{w}: unknown field {k!r} (known: {', '.join(sorted(allowed))})")
        for k in ("start_s", "duration_s", "multiplier"):
            if k not in b:
                raise UserError(f"{w}: {k} is required")
        cont, cc = b.get("continent"), b.get("country")
        if cont is not None and (not isinstance(cont, str) or cont not in CONTINENTS):  # (a list is unhashable)
            raise UserError(f"{w}: continent must be one of {', '.join(CONTINENTS)}, got {cont!r}")
        if cc is not None and (not isinstance(cc, str) or not re.fullmatch(r"[A-Z]{2}", cc)):
            raise UserError(f"{w}: country must be a two-letter ISO code like 'DE', got {cc!r}")
        out.append(Burst(number(w, "start_s", b["start_s"], 0.0, hi=MAX_SPAN_S),
                         number(w, "duration_s", b["duration_s"], 0.0, True, hi=MAX_SPAN_S),
                         number(w, "multiplier", b["multiplier"], 0.0, hi=1e4), cont, cc))
    return tuple(out)
