"""One request's path through the emulated deployment (the same path the simulator models, see ``sim.simulator``):

client --(access RTT / 2)--> ingress PoP: control plane decides --(backbone RTT / 2)--> serving PoP: queue,
engine --(every chunk: (access + backbone) / 2)--> client.

:class:`Gateway` is transport-free: the HTTP layer (:mod:`dataplane.gateway.app`), the OpenAI layer and the async
batch worker all call :meth:`Gateway.admit` and then :meth:`Call.finish` or :meth:`Call.stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from controlplane.billing import neurons
from dataplane.gateway import errors, invoke, standins
from dataplane.gateway.admission import Admission, Lease
from dataplane.gateway.backend import Backend
from dataplane.gateway.config import GatewayConfig
from dataplane.gateway.errors import (
    GatewayError,
    bad_input,
    budget_spent,
    client_gone,
    from_code,
    from_exception,
    rate_limited,
    unknown_model,
)
from dataplane.gateway.geo import ClientLocator, ClientPlace, Delays
from dataplane.gateway.limits import NeuronBudget, RateLimits
from dataplane.gateway.metrics import Metrics
from dataplane.gateway.shedding import LoadShedder
from dataplane.gateway.timeline import Timeline, TimelineStore
from dataplane.gateway.timeline import current as current_timeline
from dataplane.lora import adapter_salt
from dataplane.prefix_cache import block_hashes
from dataplane.tasks import over_window

log = logging.getLogger("edgepop.gateway")


@dataclass
class Timing:
    """Server-side milliseconds per stage, reported in the ``server-timing`` header."""

    wan_in: float = 0.0
    queue: float = 0.0
    infer: float = 0.0
    wan_out: float = 0.0
    t0: float = field(default_factory=time.monotonic)
    tl: Timeline = field(default_factory=current_timeline)  # the stage stamps a traced request reports

    def header(self, final: bool = True) -> str:
        parts = [f"wan-in;dur={self.wan_in:.2f}", f"queue;dur={self.queue:.2f}"]
        if final:
            total = (time.monotonic() - self.t0) * 1e3
            overhead = max(0.0, total - self.wan_in - self.queue - self.infer - self.wan_out)
            parts += [f"infer;dur={self.infer:.2f}", f"wan-out;dur={self.wan_out:.2f}",
                      f"gateway;dur={overhead:.2f}", f"total;dur={total:.2f}"]
        return ", ".join(parts)


class Call:
    """An admitted request: it holds (or waited for) a control-plane slot until its engine work ends."""

    def __init__(self, gw: Gateway, model: str, prep: invoke.Prepared, place: ClientPlace, lease: Lease,
                 timing: Timing, endpoint: str):
        self.gw, self.model, self.prep, self.place, self.lease = gw, model, prep, place, lease
        self.timing, self.endpoint = timing, endpoint
        self.run: invoke.EngineRun | None = None
        self.stream_: invoke.TokenStream | None = None
        self.abandoned = False  # the client went away before the end: counted once, as 499
        self.stream_ended = False  # :meth:`stream` ran to its end (a result, an error, or the client leaving)

    @property
    def backbone_ms(self) -> float:
        return self.lease.decision.rtt_ms

    @property
    def back_s(self) -> float:
        """One-way time from the serving PoP back to the client."""
        return self.gw.delays.seconds((self.place.access_rtt_ms + self.backbone_ms) / 2)

    def headers(self, final: bool = True) -> dict[str, str]:
        r, b = self.lease.replica, self.gw.backend
        return {"x-edgepop-pop": b.pop_of(r), "x-edgepop-node": str(b.node_ids[r.node]),
                "x-edgepop-replica": str(r.id), "x-edgepop-cached-tokens": str(self.lease.req.cached_tokens),
                "x-edgepop-ingress": self.place.ingress_pop,
                "x-edgepop-rtt-ms": f"{self.place.access_rtt_ms + self.backbone_ms:.2f}",
                "x-edgepop-stand-in": self.prep.stand_in, "server-timing": self.timing.header(final)}

    def _release_when_done(self, run: invoke.EngineRun | None) -> None:
        if run is None:
            self.gw.admission.release(self.lease)
        else:
            run.done.add_done_callback(lambda _f: self.gw.admission.release(self.lease))

    async def finish(self) -> invoke.Finished:
        """Run to completion and wait out the return trip; returns the result."""
        t = self.timing.tl.engine_submit = time.monotonic()
        self.timing.tl.replica = self.lease.replica.id
        try:
            self.run = invoke.EngineRun(self.gw.backend.dp, self.prep, replica=self.lease.replica.id)
        except Exception:
            self._release_when_done(None)
            raise
        self._release_when_done(self.run)
        try:
            fin = await asyncio.wait_for(self.run.result(), timeout=self.gw.config.request_timeout_s)
        except TimeoutError:
            self.run.cancel()
            self.gw.charge(self, float(generated_tokens(self.run)))  # the work the engine did is charged
            raise from_code(3007, f"no result within {self.gw.config.request_timeout_s:g} s") from None
        except asyncio.CancelledError:  # the client went away (or the server stops): charge the work done so far
            self.run.cancel()
            self.gw.charge(self, float(generated_tokens(self.run)))
            raise
        self.timing.infer = (fin.t_done - t) * 1e3
        fin.result = self.gw.real_shape(self.model, fin.result)
        t_back = time.monotonic()
        try:
            await Delays.until(fin.t_done + self.back_s)
        except asyncio.CancelledError:  # gone on the way back: the work was all done, and is charged
            self.gw.charge(self, float(fin.usage.get("completion_tokens") or 0))
            raise
        self.timing.wan_out = (time.monotonic() - t_back) * 1e3
        self.timing.tl.engine = getattr(self.run.handle, "timing", None)
        self.gw.completed(self, fin.usage)
        return fin

    def open_stream(self) -> invoke.TokenStream:
        """Start the generation; iterate :meth:`stream` to receive its pieces."""
        tl = self.timing.tl
        tl.engine_submit, tl.replica, tl.back_s = time.monotonic(), self.lease.replica.id, self.back_s
        try:
            self.stream_ = invoke.TokenStream(self.gw.backend.dp, self.prep, replica=self.lease.replica.id)
        except Exception:
            self._release_when_done(None)
            raise
        tl.engine = self.stream_.run.handle.timing
        self._release_when_done(self.stream_.run)
        return self.stream_

    async def stream(self) -> AsyncIterator[str]:
        """Text pieces, each delivered one-way-back after the engine produced it; cancels the generation if the
        consumer stops early (client gone)."""
        s = self.stream_ or self.open_stream()
        tl = self.timing.tl
        t_start, first, deadline = time.monotonic(), True, time.monotonic() + self.gw.config.request_timeout_s
        try:
            async for piece, t_gen in s.pieces():
                if t_gen > deadline:
                    raise from_code(3007, f"generation ran past {self.gw.config.request_timeout_s:g} s")
                await Delays.until(t_gen + self.back_s)
                if first:
                    self.gw.metrics.first_token(self, time.monotonic() - self.timing.t0)
                    first = False
                yield piece
                tl.piece(t_gen, time.monotonic())  # resumed once the piece was written out
            self.timing.infer = (time.monotonic() - t_start) * 1e3
            self.gw.completed(self, s.usage())
        except (GeneratorExit, asyncio.CancelledError):  # the consumer stopped early: the client went away
            self.abandon()
            raise
        except Exception as exc:  # ended mid-way (the time limit, an engine failure): charged and counted once
            self.failed(from_exception(exc))
            raise
        finally:
            self.stream_ended = True
            if not s.run.done.done():
                s.run.cancel()

    def failed(self, err: GatewayError | None) -> None:
        """A stream that ended before its answer did, after its status line went out: stop the generation (which
        frees the slot), charge what the engine did for it (its prompt, the tokens it sampled) and count it once
        with ``err``'s status (None: not counted)."""
        s = self.stream_
        if s is not None and not s.run.done.done():
            s.run.cancel()
        if self.abandoned:
            return
        self.abandoned = True
        self.gw.charge(self, float(max(generated_tokens(s.run), len(s.sent_text))) if s is not None else 0.0)
        if err is not None:
            self.gw.metrics.rejected(self.model, self.endpoint, err, self.place,
                                     pop=self.gw.backend.pop_of(self.lease.replica))

    def abandon(self) -> None:
        """The client went away before the answer ended: :meth:`failed` as 499 (not counted while a drain cancels
        what is left: that is the server's doing)."""
        self.failed(None if self.gw.draining else client_gone())


def served_tokens(prep: invoke.Prepared, window: int) -> None:
    """An encoder request sized and billed by the tokens the *served* model reads: each text's own, up to that
    model's window, not the stand-in's (whose shorter window cut the encodings the engine runs)."""
    lengths = [min(e.full_length or len(e), window) for e in prep.items]
    prep.units, prep.input_units = max(lengths), float(sum(lengths))


def generated_tokens(run) -> int:
    """Tokens the engine has sampled for ``run`` so far (0 for work without a generation handle)."""
    return len(getattr(run.handle, "token_ids", None) or ())


class Gateway:
    """The deployment plus client geography, delays, admission and metrics; shared by every endpoint."""

    def __init__(self, config: GatewayConfig, topo=None):
        self.config = config
        self.backend = Backend(config, topo)
        self.locator = ClientLocator(self.backend.topo, config.default_location)
        self.delays = Delays(config.delay, config.delay_scale)
        b = self.backend
        self.shedder = LoadShedder(config.max_wait_s, concurrency=b.engine_concurrency, parallel=b.parallel_engines())
        self.admission = Admission(b.plane, self.shedder, engine_key=b.engine_key,
                                   engine_keys=lambda m: list(dict.fromkeys(
                                       b.engine_key(r) for r in b.plane.state.by_model.get(m, ()))), t0=b.t0)
        self.rate_limits = RateLimits(config.rate_limits, enabled=config.rate_limit)
        self.budget = NeuronBudget(config.neuron_budget_per_day)
        self.prefix_block = config.lm_prefix_block if config.lm_prefix_cache_mb else 0
        self.draining = False  # set on SIGTERM/SIGINT
        self.drain_deadline = 0.0
        self.stopped: asyncio.Future | None = None  # done at the drain deadline: what is in flight ends (503)
        self.metrics = Metrics(self)
        self.timelines = TimelineStore()

    def spec(self, model: str):
        """The served catalog entry of ``model`` (400/5007 if it is not served here)."""
        if model not in self.backend.catalog:
            raise unknown_model(model)
        return self.backend.catalog[model]

    def check_limits(self, model: str, account: str, per_minute: bool = True, count: bool = True) -> None:
        """The account's daily neuron budget (429/3036) and, with ``per_minute``, its per-minute limit for the
        model (429/3021; the request counts when it passes, unless ``count`` is false: a request checked before
        its input is validated counts only once it is, so that bad input does not use up the limit)."""
        spec = self.spec(model)
        refusal = self.budget.check(account, time.time())
        if refusal is not None:
            raise budget_spent(refusal)
        limits = self.rate_limits
        refusal = ((limits.take if count else limits.check)(account, model, spec.task, time.monotonic())
                   if per_minute else None)
        if refusal is not None:
            raise rate_limited(refusal, {"x-ratelimit-limit-requests": f"{refusal.limit:g}",
                                         "x-ratelimit-remaining-requests": "0",
                                         "x-ratelimit-reset-requests": f"{refusal.retry_after_s:.3f}s"})

    def context_window(self, model: str) -> int:
        """Tokens (prompt + output) a text-generation model serves here: its catalog window, or its stand-in's
        if that is smaller."""
        spec = self.spec(model)
        return min(spec.context_window, self.backend.dp.model(self.backend.stand_in[model]).spec.n_ctx)

    def _check_max_tokens(self, model: str, inputs, prep: invoke.Prepared) -> None:
        # Workers AI refuses a request whose prompt plus explicit max_tokens exceeds the model's context window
        # (400) rather than generating up to the window; only the default max_tokens is fitted to the room left.
        asked = inputs.get("max_tokens") if isinstance(inputs, dict) else None
        if asked is None:
            return
        window = self.context_window(model)
        if prep.units + asked > window:
            raise bad_input(f"This model's maximum context length is {window} tokens. However, you requested "
                            f"{prep.units + asked} tokens ({prep.units} in the prompt, {asked} for the "
                            "completion). Please reduce the length of the prompt or max_tokens.")

    def real_shape(self, model: str, result):
        """A stand-in's result in the served model's shape: embeddings in the real model's dimension."""
        spec = self.backend.catalog[model]
        if spec.task == "text-embeddings" and isinstance(result, dict) and result.get("data"):
            data = standins.project(model, result["data"], spec.hidden)
            result = {**result, "shape": [len(data), len(data[0])], "data": data}
        return result

    def completed(self, call: Call, usage: dict) -> None:
        """A request ended with a result: metrics, and its neurons charged to its account."""
        self.metrics.done(call, usage)
        self.charge(call, float(usage.get("completion_tokens") or 0))

    def charge(self, call: Call, completion_tokens: float) -> None:
        """The request's neurons (its prompt and ``completion_tokens``) to its account's daily budget: on a
        result, and for the work done when its client went away first."""
        if self.budget.per_day > 0:
            spec = self.backend.catalog[call.model]
            n = neurons(spec, call.prep.input_units, completion_tokens)
            self.budget.charge(call.lease.req.account, time.time(), n)

    async def admit(self, model: str, inputs, place: ClientPlace, *, account: str, session=None,
                    reject_if_busy: bool = False, endpoint: str = "run", limited: bool = True,
                    served: dict | None = None, text_field: str = "text", retried: bool = False) -> Call:
        """Check the account's limits, validate, travel to the ingress, get a control-plane decision (or be shed),
        travel to the serving PoP and wait for a slot. Raises :class:`GatewayError` (400, 413, 429, 408, ...).
        ``limited``: count the request against the per-minute limits (async batch items are not); ``text_field``:
        what the client called an embeddings request's ``text`` (OpenAI's ``input``), for its error messages;
        ``retried``: the caller sends it again after a capacity refusal or a queue timeout (an async batch item), so
        those are not its outcome and are not counted."""
        timing = Timing()
        try:
            spec = self.spec(model)
            # refused early when over a limit (no tokenizing for a client that cannot be served), counted only
            # once its input is valid (checked again then: other requests may have counted meanwhile)
            self.check_limits(model, account, per_minute=limited, count=False)
            prep = await invoke.prepare(self.backend.dp, spec.task, self.backend.stand_in[model], inputs)
            if spec.task == "text-generation":
                self._check_max_tokens(model, inputs, prep)
            elif spec.task == "text-embeddings":
                if over := over_window(prep, inputs, spec.context_window, text_field):
                    raise GatewayError(413, 3006, f"{over[0]} holds {over[1]} tokens, more than {model}'s window "
                                       f"of {spec.context_window} (send 'truncate_inputs': true to have it cut to fit)")
                served_tokens(prep, spec.context_window)
            if isinstance(inputs, dict) and inputs.get("lora") is not None:  # Workers AI's per-request adapter
                prep.extra["adapter"] = self.backend.adapter(model, inputs["lora"])
            self.check_limits(model, account, per_minute=limited)
        except Exception as exc:
            # Preparation only reads the client's input, so whatever goes wrong there is bad input, never a 500.
            err = from_exception(exc)
            if err.status >= 500:
                log.warning("input preparation failed for %s: %r", model, exc)
                err = bad_input(f"could not process the input ({type(exc).__name__}: {str(exc)[:160]})")
            self.metrics.rejected(model, endpoint, err, place)
            raise err from None
        timing.tl.prepared = time.monotonic()
        timing.wan_in = await self.delays.sleep_ms(place.access_rtt_ms / 2) * 1e3
        timing.tl.wan_in_end = time.monotonic()
        adapter = inputs.get("lora") if isinstance(inputs, dict) and prep.extra.get("adapter") is not None else ""
        # The control plane's prefix index sees the prompt as the engine's prefix cache does: chained hashes of
        # full blocks of token ids, salted per adapter (KV never crosses adapters).
        hashes = (tuple(block_hashes(prep.items[0], self.prefix_block, adapter_salt(prep.extra.get("adapter"))))
                  if self.prefix_block and spec.task == "text-generation" else ())
        req = self.admission.new_request(model, place.ingress, prep.units, prep.output_tokens, session=session,
                                         reject_if_busy=reject_if_busy, account=account, hash_ids=hashes,
                                         adapter=adapter or "")
        # The shedder's work unit: decode steps of a generation (plus its prefill), items of an encoder batch.
        work = float(prep.output_tokens + 1) if spec.task == "text-generation" else float(max(1, len(prep.items)))
        try:
            lease = self.admission.submit(req, work)
            timing.tl.decided = time.monotonic()
        except GatewayError as err:
            await self.delays.sleep_ms(place.access_rtt_ms / 2)  # the refusal travels back from the ingress
            if not (retried and errors.retried(err)):  # (after the trip: a client gone during it is 499)
                self.metrics.rejected(model, endpoint, err, place)
            raise
        if served is not None:  # where it waits or runs (a caller counting it as gone labels it with this PoP)
            served["pop"] = self.backend.pop_of(lease.decision.replica)
        at_node = time.monotonic() + self.delays.seconds(lease.decision.rtt_ms / 2)
        try:
            await self.admission.wait_started(lease)
            await Delays.until(at_node)
            await self.admission.wait_adapter(lease)
        except BaseException as exc:
            self.admission.release(lease)
            if isinstance(exc, GatewayError) and not (retried and errors.retried(exc)):  # (counted where it waited)
                self.metrics.rejected(model, endpoint, exc, place,
                                      pop=self.backend.pop_of(lease.replica or lease.decision.replica))
            raise
        now = time.monotonic()
        # wan-in: both halves of the inbound trip; queue: waiting for a slot beyond the backbone leg.
        backbone_s = self.delays.seconds(lease.decision.rtt_ms / 2)
        timing.wan_in += backbone_s * 1e3
        timing.queue = max(0.0, (now - lease.queued_at) - backbone_s) * 1e3
        timing.tl.ready, timing.tl.backbone_s = now, backbone_s
        if served is not None:  # (started on a sibling of the replica it queued at: the same site)
            served["pop"] = self.backend.pop_of(lease.replica)
        return Call(self, model, prep, place, lease, timing, endpoint)

    async def infer(self, model: str, inputs, place: ClientPlace, **kw) -> tuple[Call, invoke.Finished]:
        """Admit and run to completion (no streaming)."""
        call = await self.admit(model, inputs, place, **kw)
        try:
            fin = await call.finish()
        except Exception as exc:
            err = from_exception(exc)
            self.metrics.rejected(model, call.endpoint, err, place, pop=self.backend.pop_of(call.lease.replica))
            raise err from None
        return call, fin

    def or_stopped(self, *waits) -> tuple:
        """``waits`` and, once the gateway runs under its lifespan, the drain deadline's future (an app driven
        without its lifespan, e.g. through httpx's ASGI transport, has no drain to wait for)."""
        return waits if self.stopped is None else (*waits, self.stopped)

    async def start(self) -> None:
        self.stopped = asyncio.get_running_loop().create_future()
        self.admission.start()

    def end_drain(self) -> None:
        """The drain deadline: requests and streams still in flight are answered 503/3043 now."""
        if self.stopped is not None and not self.stopped.done():
            self.stopped.set_result(None)

    async def stop(self) -> None:
        await self.admission.stop()
        with contextlib.suppress(Exception):
            self.backend.close()
