"""What a deployment owns and how hard it works: GPUs, replicas, serving capacity at the SLO, GPU busy time, $/hour.

``capacity.<deployment>`` in summary.json:

- ``gpus``, ``replicas``, ``usd_per_hour`` (the fleet's GPUs x each type's price per hour, ``topology/data/gpus.csv``);
- ``capacity_rps`` / ``capacity_tokens_per_s``: the rate of this workload's model mix the placed replicas sustain
  at full batch within the TPOT SLO (each generative replica's batch capped where a decode step would exceed
  ``slo.tpot_ms``), limited by the model with the least capacity for its share; tokens are generated tokens. It
  ignores where the capacity sits, so it is an upper bound on what routing can use;
- ``utilisation_mean`` / ``utilisation_peak_hour``: the share of GPUs busy (any resident replica with work in
  flight), sampled at even instants by :class:`GpuBusySampler`, over the run and over its busiest hour of the
  workload's clock (a simulated hour is ``day_compression / 24`` seconds in a compressed day);
- ``shared_busy_share``: of the busy GPU samples, the share where two or more replicas computed on one GPU at
  once. The simulator runs co-located replicas as if each had the GPU alone, so this is the part of the busy time
  where it granted more compute than exists (small when only encoders share a GPU with a language model);
- ``wait_p95_ms`` / ``wait_p95_ms_peak_hour``: how long requests waited for the GPU, over the run and for those
  arriving in that hour: queueing for a slot plus the time their prefill took beyond the prompt's own prefill on
  an idle replica (waiting for the running prefill iteration, sharing a batched one). With continuous batching
  and spill-over routing this, not the slot queue, is where load shows first; ``queue_p95_ms*`` is the slot
  queue alone.
"""

from __future__ import annotations

import itertools
import operator

import numpy as np
import pandas as pd

from edgepop.stats import percentile


class GpuBusySampler:
    """Samples which GPUs are busy every ``dt`` simulated seconds (a SimPy process on the simulation's clock)."""

    def __init__(self, sim, dt: float):
        self.sim, self.dt = sim, float(dt)
        self.total = sim.gpu_meter.total
        self.t: list[float] = []
        self.busy: list[int] = []
        self.shared: list[int] = []
        sim.env.process(self._run())

    def _run(self):
        # Thousands of replicas (a 3,000-PoP edge) x hundreds of samples: the busy flags are read in one pass and
        # the GPUs counted with numpy. Engines are created on first use, so their number grows through the run:
        # the GPU index is extended with the new ones only (a dict keeps insertion order; none is ever removed).
        # Engines that report their busy periods to the simulation's GPU meter (sim.gpu_busy) are read from its
        # per-GPU counts (when they are all there is, from its running counts of busy and shared GPUs); any other
        # engine (the live-host model) by its own busy flag on its replica's GPUs.
        env, engines, meter = self.sim.env, self.sim.engines, self.sim.gpu_meter
        since = operator.attrgetter("busy_since")
        seen, engs, counts, gpus = 0, [], [], []
        per_engine, flat = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        while True:
            if len(engines) != seen:
                for rid, eng in itertools.islice(engines.items(), seen, None):
                    if getattr(eng, "meter", None) is None:
                        engs.append(eng)
                        own = meter.ids(self.sim.plane.state.replicas[rid])  # (a replica's id is its index)
                        counts.append(len(own))
                        gpus.extend(own)
                seen = len(engines)
                per_engine = np.array(counts, dtype=np.int64)
                flat = np.array(gpus, dtype=np.int64)
            self.t.append(env.now)
            if engs:
                per_gpu = meter.counts()
                busy = np.fromiter(map(since, engs), dtype=float, count=len(engs)) >= 0
                per_gpu = per_gpu + np.bincount(flat[np.repeat(busy, per_engine)], minlength=len(per_gpu))
                self.busy.append(int(np.count_nonzero(per_gpu)))
                self.shared.append(int(np.count_nonzero(per_gpu > 1)))
            else:  # the meter's running counts of the same (a 3,000-PoP fleet's GPUs are not read one by one)
                self.busy.append(meter.gpus_busy)
                self.shared.append(meter.gpus_shared)
            yield env.timeout(self.dt)

    def figures(self, span_s: float, hour_s: float) -> dict:
        """Mean and peak-hour busy share over [0, span_s], the shared share, and the peak hour's start."""
        t = np.asarray(self.t)
        keep = t <= span_s + 1e-9
        t, busy = t[keep], np.asarray(self.busy, float)[keep] / max(self.total, 1)
        shared = np.asarray(self.shared, float)[keep]
        if t.size == 0:
            return {"mean": None, "peak_hour": None, "shared": None, "peak_start_s": 0.0}
        per = max(1, int(round(hour_s / self.dt)))
        if t.size > per:
            window = np.convolve(busy, np.ones(per) / per, mode="valid")
            start = int(np.argmax(window))
            peak, peak_start = float(window[start]), float(t[start])
        else:
            peak, peak_start = float(busy.mean()), 0.0
        total_busy = float(np.asarray(self.busy, float)[keep].sum())
        return {"mean": float(busy.mean()), "peak_hour": peak, "peak_start_s": peak_start,
                "shared": float(shared.sum() / total_busy) if total_busy else 0.0}


def peak_hour_is_whole_run(span_s: float, hour_s: float) -> bool:
    """Whether :meth:`GpuBusySampler.figures` had no hour-long window inside the run (its samples over
    [0, span_s] at :func:`sample_interval` fit in one hour), so its peak hour is the whole run's mean."""
    dt = sample_interval(span_s)
    return int(span_s / dt + 1e-9) + 1 <= max(1, int(round(hour_s / dt)))


def sample_interval(span_s: float) -> float:
    """About 400 samples over the run, at most one per half second of simulated time."""
    return max(span_s / 400.0, 0.5)


def slo_batch(perf, spec, gpu: str, context: float, tpot_ms: float) -> int:
    """The largest batch (a power of two up to ``max_batch``) whose decode step stays within the TPOT SLO."""
    best, b = 1, 1
    while b <= spec.max_batch:
        if perf.decode_step_ms(spec, gpu, b, context) <= tpot_ms:
            best = b
        b *= 2
    return min(best, spec.max_batch)


def serving_capacity(table, catalog, perf, shape: dict, mix: dict, slo) -> tuple[float, dict]:
    """(rps of the mix, per-model rps) the replicas of ``table`` sustain at full batch within the TPOT SLO."""
    from controlplane.perf import capacity_rps, capacity_rps_mix

    per_model: dict[str, float] = {}
    cache: dict = {}
    for model, gpu in zip(table.model, table.gpu, strict=True):
        key = (model, gpu)
        if key not in cache:
            spec = catalog[model]
            prompt = float(shape.get("prompt", {}).get(model, 512.0))
            output = float(shape.get("output", {}).get(model, 128.0))
            batch = slo_batch(perf, spec, gpu, prompt + output / 2, slo.tpot_ms) if spec.generative else None
            sizes = shape.get("prompt_mix", {}).get(model)
            cache[key] = (capacity_rps_mix(perf, spec, gpu, sizes, output, batch=batch) if sizes
                          else capacity_rps(perf, spec, gpu, prompt, output, batch=batch))  # (sizes floored there)
        per_model[model] = per_model.get(model, 0.0) + cache[key]
    shares = {m: s for m, s in mix.items() if s > 0}
    if not shares:
        return 0.0, per_model
    return float(min(per_model.get(m, 0.0) / s for m, s in shares.items())), per_model


def capacity_block(dep, frame, setup, slo, sampler: GpuBusySampler | None, span_s: float) -> dict:
    """The ``capacity.<deployment>`` block (see the module docstring)."""
    fleet = dep.fleet
    rps, _ = serving_capacity(dep.table, setup.catalog, setup.perf, setup.shape, setup.mix, slo)
    gen = frame.task == "text-generation"
    out_tokens = float(frame.output_tokens[gen].sum()) / max(len(frame), 1)  # generated tokens per request
    hour_s = setup.day_s / 24.0
    busy = sampler.figures(span_s, hour_s) if sampler is not None else {}
    block = {"gpus": int(fleet.nodes.gpus.sum()), "replicas": int(len(dep.table)),
             "usd_per_hour": round(float(fleet.nodes.price_usd_hr.sum()), 2),
             "capacity_rps": round(rps, 2), "capacity_tokens_per_s": round(rps * out_tokens, 1),
             "utilisation_mean": _r(busy.get("mean")), "utilisation_peak_hour": _r(busy.get("peak_hour")),
             "shared_busy_share": _r(busy.get("shared"))}
    start = busy.get("peak_start_s", 0.0)
    ok = (frame.outcome == "ok").to_numpy()
    peak = (frame.arrival_s >= start).to_numpy() & (frame.arrival_s < start + hour_s).to_numpy() & ok
    wait = gpu_wait_ms(frame, fleet, setup.catalog, setup.perf)
    block["peak_hour_start_s"] = round(float(start), 1)
    block["wait_p95_ms"] = percentile(wait[ok], 95, 2)
    block["wait_p95_ms_peak_hour"] = percentile(wait[peak], 95, 2)
    block["queue_p95_ms"] = percentile(frame.queue_ms[ok], 95, 2)
    block["queue_p95_ms_peak_hour"] = percentile(frame.queue_ms[peak], 95, 2)
    return block


def gpu_wait_ms(frame, fleet, catalog, perf) -> np.ndarray:
    """Per request: slot queueing plus prefill time beyond the prompt's own prefill on an idle replica (NaN for
    requests that never started)."""
    gpu_of = dict(zip(fleet.nodes.node_id, fleet.nodes.gpu, strict=True))
    audio = {s.id for s in catalog if s.unit == "audio-minute"}
    cached = frame.cached_tokens.to_numpy() if "cached_tokens" in frame else np.zeros(len(frame), int)
    tokens = np.maximum(frame.prompt_tokens.to_numpy() - cached, 1)
    own = np.full(len(frame), np.nan)
    # the columns themselves (not to_numpy(), which would make a Python str per row); positions, not labels
    keys = pd.DataFrame({"model": frame.model.array, "gpu": frame.node.map(gpu_of).array})
    started = np.isfinite(frame.prefill_ms.to_numpy(dtype=float))
    started_rows = np.flatnonzero(started)
    for (model, gpu), rows in keys[started].groupby(["model", "gpu"], sort=False).indices.items():
        rows = started_rows[rows]
        values, inverse = np.unique(tokens[rows], return_inverse=True)
        spec, div = catalog[model], (60.0 if model in audio else 1.0)
        own[rows] = np.array([perf.prefill_ms(spec, gpu, v / div) for v in values.tolist()])[inverse]
    extra = np.maximum(frame.prefill_ms.to_numpy(dtype=float) - own, 0.0)
    return frame.queue_ms.to_numpy(dtype=float) + extra


def _r(v):
    return None if v is None else round(float(v), 4)
