"""`torchbert serve`: a model behind HTTP, the requests of concurrent clients batched together.

    POST /v1/embeddings   sentence embeddings, OpenAI's request and response (input, model, encoding_format)
    POST /predict         a fine-tuned model's predictions: {"inputs": [examples]} -> the records of
                          `torchbert predict` (classification, regression, tagging, QA, multiple choice)
    GET  /v1/models       the model served, as OpenAI's model list (and /v1/models/NAME, that one)
    GET  /health          {"status": "ok", ...} once the model is loaded
    GET  /metrics         Prometheus text: requests by endpoint and status, latency, batch sizes, queue depth

The server is four pieces, one concern each: batcher.py (dynamic batching under one token budget,
and the server's Limits), endpoints.py (one class per route: a request decoded into items, a batch
run, a response encoded), worker.py (the process that runs the model), and this file, the app: a
route, a batcher and metrics for every endpoint the folder serves, the checks every request passes
first (API key, content type, body size and time, JSON, the model's name), and one honest answer.

Clients are answered honestly: a malformed request gets a 4xx naming the field (a body nested past
what JSON decoding takes, a text that is not valid Unicode, a body that is not application/json, a
`dimensions` the model cannot give, a model name this server does not serve, a path or method it
has no route for: each as JSON, in OpenAI's error shape); a failure of the
server's own is a 500 that says only that, and the detail goes to the server's log. A body must
arrive within `body_timeout_s` (else 408); a client that goes away mid-body is counted under status
499 (nginx's "client closed request"), apart from the server's errors.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import Any

from ..errors import NonFiniteOutput
from .batcher import Batcher, Limits, Metrics, Rejected
from .endpoints import ENDPOINTS, Endpoint
from .worker import run_in_worker

NON_FINITE = "the model's output for this request holds NaN or inf, which no answer can carry"


def _check_model(body: dict, served: str) -> None:
    """The request's `model`, if it names one, must be the one served here (else 404, as OpenAI's API)."""
    if "model" not in body:
        return
    if not isinstance(body["model"], str):
        raise Rejected(400, "field 'model' must be a string")
    if body["model"] != served:
        raise Rejected(404, f"field 'model': {json.dumps(body['model'])[:80]} is not served here; this server "
                            f"serves {json.dumps(served)}")


class _Disconnected(Exception):
    """The client went away before its body arrived: counted under 499, apart from the server's errors."""


log = logging.getLogger("torchbert.apps.serve")


def server_settings(limits: Limits, host: str, port: int, log_level: str = "info") -> dict[str, Any]:
    """uvicorn's settings for a server of these limits (uvicorn.run(app, **them), uvicorn.Config(app, **them)):
    open connections bounded by limits.max_connections (503 past it)."""
    return {"host": host, "port": port, "log_level": log_level, "access_log": log_level == "debug",
            "limit_concurrency": limits.max_connections}


class OneLength:
    """A request that gives both Content-Length and Transfer-Encoding is answered 400 and its connection
    closed (RFC 9112 section 6.1): the two framings disagree on where the request ends, and a proxy in
    front may have read the rest as a second request, smuggled past it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                body = json.dumps({"error": {"message": "the request has both Content-Length and Transfer-Encoding; "
                                                       "send one", "type": "invalid_request_error"}}).encode()
                await send({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def create_app(served: Endpoint | Sequence[Endpoint], limits: Limits, workers: Executor | None = None,
               api_key: str | None = None):
    """The ASGI application: a route and a Batcher for each endpoint served (worker.build gives a
    folder's), and a 404 naming what is served on the routes of the others. The models run on one
    inference thread, or in `workers` (from `worker_pool`; the endpoints given are then their request
    side only), which the app shuts down when it stops. With `api_key`, the model endpoints and
    /v1/models want `Authorization: Bearer KEY` (else 401); /health and /metrics stay open."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    served = [served] if not isinstance(served, Sequence) else list(served)
    if not served:
        raise ValueError("nothing to serve: give one endpoint or more")
    metrics = Metrics()
    # the model runs one batch at a time
    pool = workers or ThreadPoolExecutor(1, thread_name_prefix="torchbert-inference")
    batchers = {x.endpoint: Batcher(x if workers is None else partial(run_in_worker, x.endpoint), limits, metrics,
                                    pool, x.endpoint) for x in served}
    body_limit = limits.max_texts * (limits.max_chars * 4 + 256) + 4096  # UTF-8, JSON escapes and keys
    name, precision = served[0].name, served[0].precision
    paths = " and ".join(f"POST {x.path}" for x in served)

    @asynccontextmanager
    async def lifespan(app):
        for b in batchers.values():
            await b.start()
        yield
        for b in batchers.values():  # after the server has answered what was in flight
            await b.stop()
        pool.shutdown(wait=True)

    def answer(endpoint: str, start: float, status: int, content: Any, headers: dict | None = None):
        try:
            response = JSONResponse(content, status_code=status, headers=headers)
        except ValueError:  # JSON has no NaN or inf: the model gave them (weights are checked when loaded)
            log.error("%s: the model's output holds NaN or inf", endpoint)
            status, response = 500, JSONResponse({"error": {"message": NON_FINITE, "type": "server_error"}},
                                                 status_code=500)
        metrics.requests.labels(endpoint, str(status)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        return response

    def failed(endpoint: str, start: float, e: Exception):
        if isinstance(e, _Disconnected):  # nobody reads this answer; the count is what matters
            return answer(endpoint, start, 499, {"error": {"message": "the client closed the request",
                                                           "type": "client_closed"}})
        if isinstance(e, Rejected):
            kind = ("invalid_request_error" if e.status < 500 else "unavailable") if e.status != 401 else \
                "authentication_error"
            return answer(endpoint, start, e.status, {"error": {"message": e.message, "type": kind}}, e.headers)
        if isinstance(e, NonFiniteOutput):  # the model's numbers, not the client's request nor a bug
            log.error("%s: the model's output holds NaN or inf", endpoint)
            return answer(endpoint, start, 500, {"error": {"message": NON_FINITE, "type": "server_error"}})
        # the server failed on this request (its batch, most likely); it stays up. The client learns
        # that, and no more: the detail is for the operator
        log.error("%s: a request failed", endpoint, exc_info=e)
        return answer(endpoint, start, 500, {"error": {"message": "the server failed on this request (the detail "
                                                                  "is in the server's log)", "type": "server_error"}})

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), api_key.encode()):
            raise Rejected(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                           {"WWW-Authenticate": "Bearer"})

    async def read_json(request: Request) -> dict:
        check_key(request)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":  # a web page can send text/plain or a form without asking first
            raise Rejected(415, f"the body must be application/json (Content-Type: {kind or 'none given'})")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > body_limit:
            raise Rejected(413, f"the body is {int(length):,} bytes; at most {body_limit:,}")
        body = bytearray()
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > body_limit:
                        raise Rejected(413, f"the body is over {body_limit:,} bytes")
        except TimeoutError:
            raise Rejected(408, f"the body did not arrive within {limits.body_timeout_s:g} s") from None
        except ClientDisconnect:
            raise _Disconnected() from None
        try:
            value = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise Rejected(400, f"the body is not valid JSON ({getattr(e, 'msg', e)})") from None
        except RecursionError:
            raise Rejected(400, "the body nests arrays or objects too deeply to read") from None
        if not isinstance(value, dict):
            raise Rejected(400, f"the body must be a JSON object, not {type(value).__name__}")
        return value

    def route(x: Endpoint):
        async def handle(request: Request):
            start = time.perf_counter()
            try:
                body = await read_json(request)
                call = x.decode(body, limits)
                _check_model(body, name)
                results = await batchers[x.endpoint].submit(call.items, call.tokens)
            except Exception as e:
                return failed(x.endpoint, start, e)
            metrics.texts.labels(x.endpoint).inc(len(call.items))
            metrics.tokens.labels(x.endpoint).inc(sum(call.tokens))
            return answer(x.endpoint, start, 200, x.encode(results, call))

        return Route(x.path, handle, methods=["POST"])

    def unserved(cls):
        async def handle(request: Request):
            return failed(cls.endpoint, time.perf_counter(), Rejected(404, f"{name} does not serve POST {cls.path}: "
                                                                           f"it serves {paths}"))

        return Route(cls.path, handle, methods=["POST"])

    created = int(time.time())  # OpenAI's model card has the time it was made: here, when serving began
    card = {"id": name, "object": "model", "created": created, "owned_by": "torchbert"}

    def models(one: bool):
        async def handle(request: Request):  # OpenAI's clients and UIs list the models before they ask
            start = time.perf_counter()
            try:
                check_key(request)
                if one and request.path_params["model"] != name:
                    raise Rejected(404, f"model {json.dumps(request.path_params['model'])[:80]} is not served here; "
                                        f"this server serves {json.dumps(name)}")
            except Exception as e:
                return failed("models", start, e)
            return answer("models", start, 200, card if one else {"object": "list", "data": [card]})

        return handle

    async def no_route(request: Request, e: HTTPException):  # Starlette's own 404 and 405, said in JSON
        what = "no such path" if e.status_code == 404 else f"{request.url.path} does not take {request.method}"
        return JSONResponse({"error": {"message": f"{what}: this server serves {paths}, GET /v1/models, GET /health "
                                                  "and GET /metrics", "type": "invalid_request_error"}},
                            status_code=e.status_code, headers=e.headers)

    async def health(request: Request):
        if any(b.broken for b in batchers.values()):
            return JSONResponse({"status": "broken", "model": name}, status_code=503)
        return JSONResponse({"status": "ok", "model": name, "endpoints": sorted(batchers), "precision": precision,
                             "queue_texts": sum(b.waiting for b in batchers.values())})

    async def prometheus(request: Request):
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    mine = {type(x) for x in served}
    routes = [route(x) for x in served] + [unserved(cls) for cls in ENDPOINTS if cls not in mine]
    app = Starlette(lifespan=lifespan, middleware=[Middleware(OneLength)], exception_handlers={HTTPException: no_route},
                    routes=[*routes, Route("/v1/models", models(False), methods=["GET"]),
                            Route("/v1/models/{model:path}", models(True), methods=["GET"]),
                            Route("/health", health, methods=["GET"]), Route("/metrics", prometheus, methods=["GET"])])
    app.state.batchers, app.state.metrics = batchers, metrics
    return app
