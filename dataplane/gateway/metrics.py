"""Prometheus metrics of one gateway (its own registry, so several gateways can live in one test process).

Counters and histograms are updated on the request path; control-plane occupancy, engine batching and batch-job
counts are read at scrape time by a custom collector. ``process_resident_memory_bytes`` comes from
prometheus_client's process collector (Linux).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controlplane.state import COLD

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The endpoints of the OpenAI routes (dataplane.gateway.app), whose errors go out with OpenAI's status
# (``GatewayError.openai_status``: an unknown model is 404 there, 400 on Workers AI's routes).
OPENAI_ENDPOINTS = frozenset({"chat", "chat-stream", "embeddings"})


class _StateCollector:
    """Gauges read from the control plane, the engines and the batch store when Prometheus scrapes."""

    def __init__(self, gw):
        self.gw = gw

    def collect(self):
        snap = self.gw.backend.plane.snapshot()
        g = GaugeMetricFamily("edgepop_cp_requests", "Control-plane requests now running or waiting",
                              labels=["state"])
        g.add_metric(["running"], snap["running"])
        g.add_metric(["waiting"], snap["waiting"])
        yield g
        c = CounterMetricFamily("edgepop_cp_decisions", "Control-plane decisions since start", labels=["kind"])
        for k in ("submitted", "started", "queued", "rejected", "expired"):
            c.add_metric([k], snap[k])
        yield c
        # The control plane's replicas now (an autoscaler adds them and scales them to zero): the ones holding
        # GPU memory, by status; cold ones are not counted.
        r = GaugeMetricFamily("edgepop_replicas", "Replicas holding GPU memory per serving PoP, model and status "
                              "(ready or loading)", labels=["pop", "model", "status"])
        counts: dict[tuple, int] = {}
        backend = self.gw.backend
        for rep in backend.plane.state.replicas:
            if rep.status != COLD:
                key = (backend.pop_of(rep), rep.model, rep.status)
                counts[key] = counts.get(key, 0) + 1
        for key, n in counts.items():
            r.add_metric(list(key), n)
        yield r
        items = CounterMetricFamily("edgepop_engine_items", "Items run by the engines of each data-plane model "
                                    "(all its replicas)", labels=["stand_in"])
        calls = CounterMetricFamily("edgepop_engine_batches", "Engine calls (batches or decode steps)",
                                    labels=["stand_in"])
        totals: dict[str, list[int]] = {}
        for name, _replica, eng in self.gw.backend.dp.engines():
            st = eng.stats
            n, b = (st.items, st.batches) if hasattr(st, "items") else (st.tokens, st.steps)
            t = totals.setdefault(name, [0, 0])
            t[0], t[1] = t[0] + n, t[1] + b
        for name, (n, b) in totals.items():
            items.add_metric([name], n)
            calls.add_metric([name], b)
        yield items
        yield calls
        shedder = self.gw.shedder
        out = GaugeMetricFamily("edgepop_engine_outstanding", "Admitted requests not yet finished, per engine",
                                labels=["engine"])
        rate = GaugeMetricFamily("edgepop_engine_drain_per_s", "Measured completions per busy second, per engine",
                                 labels=["engine"])
        wait = GaugeMetricFamily("edgepop_engine_wait_seconds", "Estimated wait of a request admitted now, per "
                                 "engine (the load shedder's estimate)", labels=["engine"])
        solo = GaugeMetricFamily("edgepop_engine_solo_seconds", "Measured time of a request alone on the engine",
                                 labels=["engine"])
        tail = GaugeMetricFamily("edgepop_engine_excess_seconds", "99th percentile of actual - estimated request "
                                 "time, per engine", labels=["engine"])
        for key, d in shedder.describe(time.monotonic()).items():
            out.add_metric([key], d["outstanding"])
            tail.add_metric([key], d["excess_s"])
            for fam, v in ((rate, d["drain_per_s"]), (solo, d["solo_s"]), (wait, d["wait_s"])):
                if v is not None:
                    fam.add_metric([key], v)
        yield from (out, rate, wait, solo, tail)
        shed = CounterMetricFamily("edgepop_shed", "Requests refused at once for an estimated wait over the bound")
        shed.add_metric([], shedder.shed_count)
        yield shed
        store = getattr(self.gw, "batch", None)
        if store is not None:
            b = GaugeMetricFamily("edgepop_batch_items", "Async batch items by status", labels=["status"])
            for status, n in store.cached_counts.items():
                b.add_metric([status], n)
            yield b


class Metrics:
    """The gateway's metrics; ``render()`` gives the Prometheus text format."""

    def __init__(self, gw):
        self._served = set(gw.backend.catalog.ids)
        self.registry = reg = CollectorRegistry(auto_describe=True)
        self.requests = Counter("edgepop_requests", "Requests by model, serving PoP, endpoint and HTTP status",
                                ["model", "pop", "endpoint", "status"], registry=reg)
        self.http = Counter("edgepop_http_responses", "HTTP responses by route and status", ["route", "status"],
                            registry=reg)
        self.latency = Histogram("edgepop_request_seconds", "Server-side time to the last byte, WAN included",
                                 ["model", "endpoint"], buckets=LATENCY_BUCKETS, registry=reg)
        self.ttft = Histogram("edgepop_ttft_seconds", "Server-side time to the first streamed piece",
                              ["model"], buckets=LATENCY_BUCKETS, registry=reg)
        self.queue = Histogram("edgepop_queue_seconds", "Time waiting for a control-plane slot", ["model"],
                               buckets=LATENCY_BUCKETS, registry=reg)
        self.tokens = Counter("edgepop_tokens", "Tokens by model and kind", ["model", "kind"], registry=reg)
        self.wan = Counter("edgepop_injected_wan_seconds", "WAN delay injected from the topology", registry=reg)
        ProcessCollector(registry=reg)
        reg.register(_StateCollector(gw))

    def done(self, call, usage: dict) -> None:
        pop = call.headers(final=False)["x-edgepop-pop"]
        t = call.timing
        self.requests.labels(call.model, pop, call.endpoint, "200").inc()
        self.latency.labels(call.model, call.endpoint).observe(time.monotonic() - t.t0)
        self.queue.labels(call.model).observe(t.queue / 1e3)
        self.wan.inc((t.wan_in + t.wan_out) / 1e3)
        for kind in ("prompt_tokens", "completion_tokens"):
            if usage.get(kind):
                self.tokens.labels(call.model, kind.split("_")[0]).inc(usage[kind])

    def answered(self, model: str, endpoint: str, place) -> None:
        """Count a request answered 200 without an engine run (an async batch submission), at its ingress PoP."""
        self.requests.labels(model, str(getattr(place, "ingress_pop", "") or ""), endpoint, "200").inc()

    def first_token(self, call, seconds: float) -> None:
        self.ttft.labels(call.model).observe(seconds)

    def rejected(self, model: str, endpoint: str, err, place=None, pop: str = "") -> None:
        """Count a request that ended without its answer: labelled with the PoP serving it when known (``pop``),
        else its ingress PoP (``place``), else none."""
        # Unknown model names come from clients: one label value for all of them keeps cardinality bounded.
        name = model if model in self._served else "_unknown"
        if not pop and place is not None:
            pop = str(getattr(place, "ingress_pop", "") or "")
        # (the status the client got: the same error is answered with another status on the OpenAI routes)
        status = err.openai_status() if endpoint in OPENAI_ENDPOINTS else err.status
        self.requests.labels(name, pop, endpoint, str(status)).inc()
        err.counted = True

    def render(self) -> bytes:
        return generate_latest(self.registry)
