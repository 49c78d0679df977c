"""The FastAPI application: Workers AI REST, async batch, model search, OpenAI-compatible routes, /metrics.

Routes (``{a}`` is the account id; every ``/client/v4`` route needs ``Authorization: Bearer TOKEN``)::

    POST /client/v4/accounts/{a}/ai/run/{model}                 run (SSE with "stream": true); ?queueRequest=true
    GET  /client/v4/accounts/{a}/ai/models/search               served models (catalog_api: tasks, authors too)
    GET  /client/v4/accounts/{a}/ai/models/schema?model=X       input/output JSON Schemas of X (schemas.py)
    POST /client/v4/accounts/{a}/ai/v1/chat/completions         OpenAI chat (SSE with "stream": true)
    POST /client/v4/accounts/{a}/ai/v1/embeddings               OpenAI embeddings
    GET  /client/v4/accounts/{a}/ai/v1/models                   OpenAI model list
    GET  /client/v4/accounts/{a}/ai/v1/models/{model}           one model (404 if not served)
    GET  /metrics  /edgepop/deployment  /edgepop/timings        (any valid token, unless ``open_ops``)
    GET  /healthz                                               (no auth: liveness and draining only; HEAD too)

Before a token is compared, a client address with too many recent failed authentications is refused
(:class:`~dataplane.gateway.limits.AuthThrottle`); an accepted request then meets its account's limits and the
load shedder (:mod:`dataplane.gateway.pipeline`). ``rejectIfBusy`` is read on both APIs: ``?rejectIfBusy=true``
or ``options.rejectIfBusy`` in the body.

Bodies are read and parsed by hand (never by FastAPI's validators), so malformed input is always a 400 with a
Workers AI envelope and never a 422 or a 500; any unexpected exception is a logged 500 (3043) that leaves the
worker running. A body that stops arriving is answered 408/3007 after ``body_timeout_s``. A client that
disconnects before its answer has its work cancelled (a queued request leaves the queue, a generation stops and
frees its slot; streams and plain answers alike) and is counted with status 499.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from controlplane.routing.base import router_draws
from dataplane.gateway import catalog_api, standins
from dataplane.gateway import openai_compat as oai
from dataplane.gateway.asgi import SSEStream, StatusCounter, disconnected
from dataplane.gateway.auth import Authenticator
from dataplane.gateway.batch import BatchService, poll_response
from dataplane.gateway.config import GatewayConfig
from dataplane.gateway.errors import (
    GatewayError,
    auth_throttled,
    bad_input,
    client_gone,
    from_exception,
    shutting_down,
    unknown_model,
)
from dataplane.gateway.http_util import (
    TRUE_WORDS,
    envelope,
    flag,
    ok,
    parse_json,
    read_body,
    run_inputs,
)
from dataplane.gateway.invoke import workers_usage
from dataplane.gateway.limits import AuthThrottle
from dataplane.gateway.metrics import CONTENT_TYPE
from dataplane.gateway.pipeline import Gateway
from dataplane.gateway.sse import DONE_FRAME, frame
from dataplane.gateway.timeline import TimelineMiddleware

log = logging.getLogger("edgepop.gateway")
PREFIX = "/client/v4/accounts/{account_id}/ai"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def create_app(config: GatewayConfig | None = None, topo=None, warm: bool = True) -> FastAPI:
    """Build the gateway (topology, placement, control plane, engines, batch store) and its routes."""
    cfg = config or GatewayConfig()
    authenticator = Authenticator(cfg.tokens, enabled=not cfg.no_auth)
    throttle = AuthThrottle(cfg.auth_failures_per_minute)
    gw = Gateway(cfg, topo)
    gw.batch = batch = BatchService(gw, cfg.db or "edgepop-batch.sqlite", cfg.batch_concurrency)

    def begin_drain() -> None:
        """Shutting down (SIGTERM/SIGINT): claim no more batch items; /healthz says so. In-flight requests and
        streams go on until the drain deadline; the server stops accepting connections."""
        if not gw.draining:
            gw.draining = True
            gw.drain_deadline = time.monotonic() + cfg.drain_timeout_s
            asyncio.get_running_loop().call_later(cfg.drain_timeout_s, gw.end_drain)
            batch.drain()

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await gw.start()
        if warm:
            await asyncio.to_thread(gw.backend.warm)
        batch.start()
        try:
            yield
        finally:
            left = max(0.0, gw.drain_deadline - time.monotonic()) if gw.draining else 0.0
            await batch.stop(left)
            if batch.requeued_at_stop:
                log.warning("drain: %d running batch items put back in the queue", batch.requeued_at_stop)
            await gw.stop()

    app = FastAPI(title="edgepop gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw
    app.state.begin_drain = begin_drain
    def force_exit() -> None:
        """A second SIGINT: the drain deadline comes now (open streams end with their error frame and [DONE],
        waiting requests get their 503), and running batch items go back to the queue at once."""
        begin_drain()
        batch.force()
        gw.end_drain()

    app.state.force_exit = force_exit
    app.add_middleware(StatusCounter, metrics=gw.metrics, on_error=lambda request, exc: unexpected(request, exc))
    app.add_middleware(TimelineMiddleware, store=gw.timelines)  # stage stamps of traced requests (sim vs live)

    def is_openai(request: Request) -> bool:
        return "/ai/v1/" in request.url.path

    def error_response(request: Request, err: GatewayError) -> JSONResponse:
        if is_openai(request):
            return JSONResponse(err.openai_body(), status_code=err.openai_status(), headers=err.headers())
        return JSONResponse(err.envelope(), status_code=err.status, headers=err.headers())

    def authenticate(request: Request, account_id: str | None = None) -> str:
        """The caller's account (``account_id`` must be it); 401/403, or 429 for a client past its failed
        attempts, which is refused before its token is looked at."""
        client = request.client.host if request.client else "?"
        now = time.monotonic()
        refusal = throttle.check(client, now)
        if refusal is not None:
            raise auth_throttled(refusal)
        header = request.headers.get("authorization")
        try:
            if account_id is None:
                return authenticator.account_of(header)
            return authenticator.check(header, account_id)
        except GatewayError as err:
            if err.status == 401:
                throttle.failed(client, now)
            raise

    def reject_if_busy(request: Request, options) -> bool:
        if options is not None and not isinstance(options, dict):
            raise bad_input("field 'options' must be an object")
        return (flag((options or {}).get("rejectIfBusy"), "field 'options.rejectIfBusy'")
                | flag(request.query_params.get("rejectIfBusy"), "query parameter 'rejectIfBusy'"))

    def count(request: Request, err: GatewayError) -> None:
        """A request to a model route ending with an error nothing counted yet (bad JSON, a bad location header, a
        bad batch body, a body too large...): counted now, once, with its status. Routes set ``endpoint`` once
        the caller is authenticated: refused authentication is not counted (edgepop_http_responses has it)."""
        endpoint = getattr(request.state, "endpoint", None)
        if endpoint is None or err.counted:
            return
        try:
            place = place_of(request)
        except GatewayError:  # (the location header was what was wrong)
            place = None
        gw.metrics.rejected(getattr(request.state, "model", ""), endpoint, err, place)

    def counting(request: Request, endpoint: str, model: str = "") -> None:
        request.state.endpoint, request.state.model = endpoint, model

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, err: GatewayError):
        count(request, err)
        return error_response(request, err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return error_response(request, GatewayError(exc.status_code, 7000 + exc.status_code, str(exc.detail),
                                                    headers=dict(exc.headers or {})))  # (405: its Allow header)

    def unexpected(request: Request, exc: Exception) -> JSONResponse:
        """The answer to an exception a route let out (called by the status counter, inside its ``except``)."""
        err = from_exception(exc)
        if err.status >= 500:
            log.exception("unexpected error on %s", request.url.path)
        count(request, err)
        return error_response(request, err)

    def place_of(request: Request):
        return gw.locator.place(request.headers)

    async def unless_gone(request: Request, work, model: str, endpoint: str, served: dict | None = None):
        """``await work`` (a non-streaming request's admission and run) unless the client disconnects first: then
        the work is cancelled, which releases its queue place or slot and stops its engine run, and the request
        counts as 499. (Starlette cancels a streaming response on disconnect, never a plain handler.)"""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait(gw.or_stopped(task, gone), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this handler itself cancelled (the server is stopping)
            task.cancel()
            gone.cancel()
            raise
        gone.cancel()
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # this handler itself is being cancelled too
                raise
        except Exception:  # noqa: BLE001, S110 (its own error, if it failed as it was cancelled, is moot)
            pass
        # (counted at the PoP where it waited or ran, when it got that far)
        err = shutting_down() if gw.stopped is not None and gw.stopped.done() else client_gone()
        gw.metrics.rejected(model, endpoint, err, place_of(request), pop=(served or {}).get("pop", ""))
        raise err

    def common(request: Request) -> dict:
        """Keywords of every admission: the session, and ``served``, where admission notes the serving PoP."""
        return {"session": request.headers.get("x-session-affinity") or None, "served": {}}

    # ------------------------------------------------------------------ Workers AI REST
    @app.post(PREFIX + "/run/{model:path}")
    async def run_model(request: Request, account_id: str, model: str):
        account = authenticate(request, account_id)
        queued = request.query_params.get("queueRequest")
        counting(request, "batch-submit" if str(queued).strip().lower() in TRUE_WORDS else "run", model)
        queue = flag(queued, "query parameter 'queueRequest'")  # (refused after counting: a 400 counts once)
        body = await read_body(request, cfg.max_body_bytes, cfg.body_timeout_s)
        # A poll of a job queued for a model a restart dropped answers its status (its items wait in the queue).
        if queue and model not in gw.backend.catalog and (held := await batch.poll_unserved(account, model, body)):
            counting(request, None)
            return await poll_response(ok(held))
        # an unknown model is named as such (5007) before its body is parsed (an image is no JSON)
        inputs = run_inputs(body, request.headers.get("content-type"), gw.spec(model).task)
        if "request_id" in inputs and (queue or len(inputs) == 1):
            counting(request, None)  # (a poll is no request of the model's: not counted)
            return await poll_response(ok(await batch.poll(account, inputs["request_id"])))
        place = place_of(request)
        if queue:
            # As on the other routes: refused early when over the limit, counted once the body is valid (bad input
            # does not use up the limit); its items run paced by the batch worker.
            gw.check_limits(model, account, count=False)
            batch.check(model, inputs)
            gw.check_limits(model, account)
            result = await batch.submit(account, model, inputs, place)
            gw.metrics.answered(model, "batch-submit", place)
            return ok(result)
        reject = reject_if_busy(request, inputs.pop("options", None))
        spec = gw.spec(model)
        if spec.task == "text-generation" and inputs.get("stream") is True:
            counting(request, "run-stream", model)
            kw = common(request)
            call = await unless_gone(request, gw.admit(model, inputs, place, account=account, reject_if_busy=reject,
                                                       endpoint="run-stream", **kw), model, "run-stream", kw["served"])
            _start(call)
            return SSEStream(_workers_stream(call), call, headers={**SSE_HEADERS, **call.headers(final=False)})
        kw = common(request)
        call, fin = await unless_gone(request, gw.infer(model, inputs, place, account=account, reject_if_busy=reject,
                                                        endpoint="run", **kw), model, "run", kw["served"])
        synthetic = gw.backend.dp.card(call.prep.stand_in).synthetic
        emulated = standins.is_stand_in(model, spec.stand_in, call.prep.stand_in)
        return JSONResponse(envelope(fin.result, model, spec.task, call.prep.stand_in, synthetic, emulated),
                            headers=call.headers())

    def _start(call) -> None:
        """Start the generation now: its slot is released when the engine finishes, even if the response body is
        never iterated (a client that disconnects before the first byte)."""
        try:
            call.open_stream()
        except Exception as exc:
            raise from_exception(exc) from None

    async def _workers_stream(call):
        try:
            async for piece in call.stream():
                yield frame({"response": piece})
            u = call.stream_.usage()
            yield frame({"response": "", "usage": workers_usage(u["prompt_tokens"], u["completion_tokens"],
                                                                u.get("cached_tokens", 0)) if u else {}})
        except Exception as exc:  # the status line is gone: report in-band, then end the stream cleanly
            err = from_exception(exc)
            yield frame({"error": {"code": err.code, "message": err.message}})
        yield DONE_FRAME

    catalog_api.register(app, gw, authenticate, PREFIX)  # models, tasks and authors search

    # ------------------------------------------------------------------ OpenAI-compatible
    @app.post(PREFIX + "/v1/chat/completions")
    async def chat_completions(request: Request, account_id: str):
        account = authenticate(request, account_id)
        counting(request, "chat")
        body = parse_json(await read_body(request, cfg.max_body_bytes, cfg.body_timeout_s))
        named = body.get("model") if isinstance(body, dict) else None
        if isinstance(named, str):  # a refused field is counted under the model named (an unserved one: _unknown)
            counting(request, "chat-stream" if body.get("stream") is True else "chat", named.rsplit(":", 1)[0])
        model, inputs, stream, include_usage = oai.chat_inputs(body)
        counting(request, "chat-stream" if stream else "chat", model)
        reject = reject_if_busy(request, body.get("options"))
        shown = body["model"]  # echoed as sent, "<id>:<adapter>" included
        if gw.spec(model).task != "text-generation":
            raise bad_input(f"model {model!r} is not a text-generation model")
        place = place_of(request)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if stream:
            kw = common(request)
            call = await unless_gone(request, gw.admit(model, {**inputs, "stream": True}, place, account=account,
                                                       reject_if_busy=reject, endpoint="chat-stream",
                                                       **kw), model, "chat-stream", kw["served"])
            _start(call)
            return SSEStream(_chat_stream(call, cid, shown, include_usage), call,
                           headers={**SSE_HEADERS, **call.headers(final=False)}, openai=True)
        kw = common(request)
        call, fin = await unless_gone(request, gw.infer(model, inputs, place, account=account, reject_if_busy=reject,
                                                        endpoint="chat", **kw), model, "chat", kw["served"])
        return JSONResponse(oai.chat_completion(cid, shown, fin.result["response"], fin.usage),
                            headers=call.headers())

    async def _chat_stream(call, cid: str, model: str, include_usage: bool):
        created = int(time.time())
        yield frame(oai.chat_chunk(cid, model, created, {"role": "assistant", "content": ""}))
        try:
            async for piece in call.stream():
                yield frame(oai.chat_chunk(cid, model, created, {"content": piece}))
            u = call.stream_.usage()
            yield frame(oai.chat_chunk(cid, model, created, {}, oai.finish_reason(u)))
            if include_usage:
                yield frame(oai.chat_chunk(cid, model, created, {}, usage=u))
        except Exception as exc:
            yield frame(from_exception(exc).openai_body())
        yield DONE_FRAME

    @app.post(PREFIX + "/v1/embeddings")
    async def embeddings(request: Request, account_id: str):
        account = authenticate(request, account_id)
        counting(request, "embeddings")
        body = parse_json(await read_body(request, cfg.max_body_bytes, cfg.body_timeout_s))
        named = body.get("model") if isinstance(body, dict) else None
        if isinstance(named, str):
            counting(request, "embeddings", named)
        model, inputs, fmt, dims = oai.embedding_inputs(body)
        counting(request, "embeddings", model)
        reject = reject_if_busy(request, body.get("options"))
        spec = gw.spec(model)
        if spec.task != "text-embeddings":
            raise bad_input(f"model {model!r} is not a text-embeddings model")
        oai.check_dimensions(model, spec.hidden, dims)  # before any work: a refused request runs nothing
        kw = common(request)
        call, fin = await unless_gone(request, gw.infer(model, inputs, place_of(request), account=account,
                                                        reject_if_busy=reject, endpoint="embeddings",
                                                        text_field="input", **kw), model, "embeddings", kw["served"])
        return JSONResponse(oai.embedding_list(model, fin.result, fmt, int(fin.usage.get("prompt_tokens", 0)), dims),
                            headers=call.headers())

    def model_object(model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "edgepop"}

    @app.get(PREFIX + "/v1/models")
    async def list_models(request: Request, account_id: str):
        authenticate(request, account_id)
        return {"object": "list", "data": [model_object(s.id) for s in gw.backend.catalog]}

    @app.get(PREFIX + "/v1/models/{model:path}")
    async def retrieve_model(request: Request, account_id: str, model: str):
        authenticate(request, account_id)
        if model not in gw.backend.catalog:
            raise GatewayError(404, unknown_model(model).code, f"model {model!r} is not served here")
        return model_object(model)

    # ------------------------------------------------------------------ operations
    def operator(request: Request) -> None:
        # Traffic per model and PoP, and the placement, are not for anyone who can reach the port.
        if not cfg.open_ops:
            authenticate(request)

    @app.get("/metrics")
    async def metrics(request: Request):
        operator(request)
        return Response(gw.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/edgepop/deployment")
    async def deployment(request: Request):
        operator(request)
        return gw.backend.describe()

    @app.get("/edgepop/timings")
    async def timings(request: Request):
        operator(request)
        # with the router's draws so far: a replay's simulated mirror starts its router where this one is
        return {**gw.timelines.describe(request.query_params.get("trace", "")),
                "router_draws": router_draws(gw.backend.plane.router)}

    @app.api_route("/healthz", methods=["GET", "HEAD"])  # (load balancers' probes often send HEAD)
    async def healthz():
        return JSONResponse({"ok": not gw.draining, "draining": gw.draining}, status_code=503 if gw.draining else 200)

    return app
