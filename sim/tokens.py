"""Request sizes: per-task lognormal distributions of prompt and output lengths, clipped to each model's limits.

Units of ``prompt_tokens`` follow the catalog's ``unit`` with one exception: a model priced per **audio-minute**
gets its audio length in whole **seconds** (``prompt_tokens`` is an integer column and a typical clip is ~0.3
minutes). :func:`catalog_units` converts a prompt size back to the catalog's unit for billing and service times.

Defaults (the medians and log-standard deviations) are fitted to or chosen from published figures:

* chat prompts median 1020 tokens, sigma 0.99; outputs median 129, sigma 0.86 -- the Azure LLM inference
  conversation trace of 2023 (Patel et al., ISCA 2024), the file shipped in ``sim/data``;
* follow-up turns of a chat session add a short user message (median 60 tokens) to the history;
* embeddings: passages/queries of ~40-120 tokens (median 70), the chunk sizes RAG pipelines embed;
* reranking: one query (median 12 tokens) against several passages (mean 8, median 90 tokens each), every
  (query, passage) pair clipped to the model's window as cross-encoders score pairs one by one;
* classification: short texts (median 40 tokens: reviews, tweets, support messages);
* images: one image per request; speech: clips of median 18 s (0.3 audio-minutes), capped at 30 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from controlplane.catalog import TASKS, ModelSpec
from edgepop.errors import UserError
from sim.traces import MAX_TOKENS
from sim.validate import number

AUDIO_SECONDS_PER_MINUTE = 60


@dataclass(frozen=True)
class LogNormal:
    """Integer sizes ``round(median * exp(sigma * Z))``, Z standard normal, kept within ``[min, max]``."""

    median: float
    sigma: float
    min: int = 1
    max: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws as int64; sigma 0 gives the median every time (still one normal draw per item)."""
        z = rng.standard_normal(n)
        x = np.rint(self.median * np.exp(self.sigma * z))
        hi = np.inf if self.max is None else self.max
        return np.clip(x, self.min, hi).astype(np.int64)

    def to_dict(self) -> dict:
        d = {"median": self.median, "sigma": self.sigma, "min": self.min}
        if self.max is not None:
            d["max"] = self.max
        return d


@dataclass(frozen=True)
class TaskTokens:
    """Size distributions of one task. Which fields apply depends on the task (see ``TASK_FIELDS``)."""

    prompt: LogNormal | None = None
    output: LogNormal | None = None
    followup: LogNormal | None = None
    query: LogNormal | None = None
    passage: LogNormal | None = None
    passages: float = 0.0  # mean passages per reranking request (1 + Poisson(passages - 1))

    def to_dict(self) -> dict:
        out: dict = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, LogNormal):
                out[f.name] = v.to_dict()
            elif f.name == "passages" and v:
                out[f.name] = v
        return out


MAX_MEDIAN_TOKENS = float(MAX_TOKENS)  # the same ceiling as a trace's token counts
MAX_SIGMA = 5.0  # a log-normal spread of e^5 = 148x per standard deviation
MAX_PASSAGES = 1000.0  # passages per reranking request

TASK_FIELDS = {
    "text-generation": ("prompt", "output", "followup"),
    "text-reranking": ("query", "passage", "passages"),
    "text-embeddings": ("prompt",),
    "text-classification": ("prompt",),
    "image-classification": ("prompt",),
    "automatic-speech-recognition": ("prompt",),
}

DEFAULT_TOKENS: dict[str, TaskTokens] = {
    "text-generation": TaskTokens(prompt=LogNormal(1020, 0.99), output=LogNormal(129, 0.86),
                                  followup=LogNormal(60, 1.0)),
    "text-embeddings": TaskTokens(prompt=LogNormal(70, 0.5)),
    "text-reranking": TaskTokens(query=LogNormal(12, 0.5), passage=LogNormal(90, 0.5), passages=8.0),
    "text-classification": TaskTokens(prompt=LogNormal(40, 0.8)),
    "image-classification": TaskTokens(prompt=LogNormal(1, 0.0)),
    "automatic-speech-recognition": TaskTokens(prompt=LogNormal(18, 1.0, max=30 * AUDIO_SECONDS_PER_MINUTE)),
}
assert set(DEFAULT_TOKENS) == set(TASKS) == set(TASK_FIELDS)


def _lognormal(where: str, raw, base: LogNormal | None, least: int = 0) -> LogNormal:
    """``least``: the smallest ``min`` allowed (1 for prompts: a request has at least one prompt token)."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table like {{ median = 100, sigma = 0.8 }}, got {raw!r}")
    known = {"median", "sigma", "min", "max"}
    for k in raw:
        if k not in known:
            raise UserError(f"{where}: unknown field {k!r} (known: {', '.join(sorted(known))})")
    d = base.to_dict() if base else {"sigma": 0.0, "min": 1}
    d.update(raw)
    if "median" not in d:
        raise UserError(f"{where}: median is required")
    # (bounds far past any real workload: beyond them the draws overflow the integer token counts)
    median = number(where, "median", d["median"], 0.0, lo_open=True, hi=MAX_MEDIAN_TOKENS)
    sigma = number(where, "sigma", d["sigma"], 0.0, hi=MAX_SIGMA)
    lo = d.get("min", 1)
    hi = d.get("max")
    # (min and max bounded like the median: a draw clipped to 2**63 - 1 wraps to a negative int64)
    if isinstance(lo, bool) or not isinstance(lo, int) or not least <= lo <= MAX_TOKENS:
        raise UserError(f"{where}: min must be an integer >= {least}, at most {MAX_TOKENS:,}, got {lo!r}")
    if hi is not None and (isinstance(hi, bool) or not isinstance(hi, int) or not max(lo, 1) <= hi <= MAX_TOKENS):
        raise UserError(f"{where}: max must be an integer >= min and >= 1, at most {MAX_TOKENS:,}, got {hi!r}")
    return LogNormal(median, sigma, lo, hi)


def tokens_from_dict(raw, where: str) -> dict[str, TaskTokens]:
    """Per-task distributions: the defaults, with the fields given in ``raw`` ({task: {field: {...}}}) replaced."""
    if raw is None:
        return dict(DEFAULT_TOKENS)
    if not isinstance(raw, dict):
        raise UserError(f"{where}: tokens must be a table of tasks, got {raw!r}")
    out = dict(DEFAULT_TOKENS)
    for task, spec in raw.items():
        w = f"{where} tokens.{task}"
        if task not in TASK_FIELDS:
            raise UserError(f"{where}: tokens: unknown task {task!r} (known: {', '.join(TASKS)})")
        if not isinstance(spec, dict):
            raise UserError(f"{w}: expected a table of distributions, got {spec!r}")
        current = out[task]
        for name, value in spec.items():
            if name not in TASK_FIELDS[task]:
                raise UserError(f"{w}: field {name!r} does not apply to {task} "
                                f"(fields: {', '.join(TASK_FIELDS[task])})")
            if name == "passages":
                current = replace(current, passages=number(f"{w}", "passages", value, 1.0, hi=MAX_PASSAGES))
            else:
                current = replace(current, **{name: _lognormal(f"{w}.{name}", value, getattr(current, name),
                                                               least=1 if name == "prompt" else 0)})
        out[task] = current
    return out


@dataclass
class Sizes:
    """Prompt and output sizes for a set of requests of one model."""

    prompt: np.ndarray
    output: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def prompt_limit(spec: ModelSpec) -> float:
    """Largest prompt a model accepts: context minus one output token for LLMs; no limit for audio."""
    if spec.unit == "audio-minute":
        return np.inf  # the context window counts encoder frames of one 30 s window; long audio is chunked
    return spec.context_window - 1 if spec.generative else spec.context_window


def draw_sizes(spec: ModelSpec, dist: TaskTokens, n: int, rng: np.random.Generator) -> Sizes:
    """Sizes of ``n`` single (session-less) requests to ``spec``: prompt clipped to the model's limit and, for
    LLMs, output clipped so that prompt + output fits the context window; output 0 for other tasks."""
    if spec.task == "text-reranking":
        return Sizes(_rerank_prompts(spec, dist, n, rng), np.zeros(n, np.int64))
    prompt = np.minimum(dist.prompt.sample(rng, n), prompt_limit(spec)).astype(np.int64)
    if not spec.generative:
        return Sizes(prompt, np.zeros(n, np.int64))
    output = np.minimum(dist.output.sample(rng, n), spec.context_window - prompt)
    return Sizes(prompt, output)


def _rerank_prompts(spec: ModelSpec, dist: TaskTokens, n: int, rng: np.random.Generator) -> np.ndarray:
    """Total tokens a cross-encoder reads: for each passage, the query plus the passage, clipped to the window."""
    count = 1 + rng.poisson(max(dist.passages - 1.0, 0.0), n)
    query = np.repeat(dist.query.sample(rng, n), count)
    pairs = np.minimum(query + dist.passage.sample(rng, int(count.sum())), spec.context_window)
    owner = np.repeat(np.arange(n), count)
    return np.bincount(owner, weights=pairs, minlength=n).astype(np.int64)


def catalog_units(spec: ModelSpec, prompt_tokens) -> np.ndarray:
    """``prompt_tokens`` in the catalog's unit (tokens, images, or audio-minutes from audio seconds), as floats."""
    x = np.asarray(prompt_tokens, dtype=np.float64)
    return x / AUDIO_SECONDS_PER_MINUTE if spec.unit == "audio-minute" else x
