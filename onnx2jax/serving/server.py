"""The HTTP server: OpenAI's API over the engine, as an ASGI app (Starlette), run by uvicorn.

``POST /v1/completions`` and ``/v1/chat/completions`` (``"stream": true``: server-sent events, one per token as it
is made), ``GET /v1/models``, ``/health``, ``/metrics`` (Prometheus text). It owns no model logic: bodies are
checked by :mod:`~onnx2jax.serving.openai_api`, text by :mod:`~onnx2jax.serving.text`, requests run on the
:class:`~onnx2jax.serving.driver.EngineDriver`. A refused request is HTTP 400 naming the field (404 for an unknown
model, 429 with ``Retry-After`` past the queue bound); a client that goes away mid-request has its request
aborted, freeing its slot and pages. :func:`serve` runs it on a socket :func:`bind` bound (port 0: a free one the
OS chooses) until SIGTERM or SIGINT, which stop taking requests,
let those in flight finish (up to a timeout, then abort them) and return.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from onnx2jax.errors import RequestError
from onnx2jax.runtime.search_options import SearchDefaults
from onnx2jax.serving import openai_api as api
from onnx2jax.serving.driver import EngineDriver, Event, QueueFull, describe
from onnx2jax.serving.text import Detokenizer, Text

RETRY_AFTER_S = 1


def _refused(error: RequestError) -> JSONResponse:
    return JSONResponse(api.error(str(error), param=error.field), status_code=400)


def build_app(driver: EngineDriver, text: Text, model_name: str, *, aliases: tuple[str, ...] = (),
              shutdown_timeout: float = 30.0, defaults: SearchDefaults | None = None) -> Starlette:
    """The ASGI app serving ``driver``'s engine under ``model_name`` (``aliases``: other names accepted);
    ``defaults``: the sampling parameters of a request that leaves them out (the folder's genai_config.json
    search options, :func:`~onnx2jax.runtime.search_options.folder_defaults`; None: OpenAI's)."""
    engine = driver.engine
    names = {model_name, *aliases}

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": int(driver.started), "owned_by": "onnx2jax",
             "max_model_len": engine.context_length}]})

    async def health(request: Request) -> Response:
        state = describe(driver)
        return JSONResponse(state, status_code=200 if state["status"] == "ok" else 503)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(driver.metrics(), media_type="text/plain; version=0.0.4")

    async def completions(request: Request) -> Response:
        return await _generate(request, "completion")

    async def chat(request: Request) -> Response:
        return await _generate(request, "chat")

    async def _generate(request: Request, kind: str) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as error:
            return JSONResponse(api.error(f"the body is not JSON: {error}"), status_code=400)
        try:
            api.check_fields(body, api.COMPLETION_FIELDS if kind == "completion" else api.CHAT_FIELDS)
            model = body.get("model")
            if model not in names:
                return JSONResponse(api.error(f"the model {model!r} does not exist; this server serves "
                                              f"{model_name!r}", param="model", code="model_not_found"),
                                    status_code=404)
            if kind == "completion":
                prompt = api.completion_prompt(body)
                ids = text.encode(prompt) if isinstance(prompt, str) else prompt
                default_max = 16  # OpenAI's default for completions
            else:
                ids = text.encode(text.chat_prompt(api.chat_messages(body)), special=False)
                default_max = None
            parsed = api.parse(body, ids, context=engine.context_length, default_max_tokens=default_max,
                               model=model, defaults=defaults)
            rid, queue = driver.add(parsed.prompt, parsed.params)
        except RequestError as error:
            return _refused(error)
        except QueueFull as error:
            return JSONResponse(api.error(f"too many requests: {error}; retry later", kind="rate_limit_error"),
                                status_code=429, headers={"Retry-After": str(RETRY_AFTER_S)})
        except RuntimeError as error:
            return JSONResponse(api.error(str(error), kind="server_error"), status_code=503)
        reply = api.new_id("cmpl" if kind == "completion" else "chatcmpl")
        detok = Detokenizer(text, parsed.stop, parsed.prompt)
        if parsed.stream:
            return StreamingResponse(_events(kind, reply, rid, queue, detok, parsed), media_type="text/event-stream")
        return await _whole(request, kind, reply, rid, queue, detok, parsed)

    def _consume(rid: int, event: Event, detok: Detokenizer) -> list[tuple[str, int | None, str | None]]:
        """An event as (text piece, token, finish reason) items, the last one with the reason where the request
        ends; a stop string ends it here (the engine's request aborted)."""
        items: list[tuple[str, int | None, str | None]] = []
        for token in event.tokens:
            piece = detok.add([token])
            if detok.stopped:
                driver.abort(rid)
                return items + [(piece, None, "stop")]
            items.append((piece, token, None))
        if event.finish_reason is not None:
            items.append((detok.flush(), None, event.finish_reason))
        return items

    async def _events(kind, reply, rid, queue, detok, parsed) -> AsyncIterator[bytes]:
        """The reply's server-sent events: one per token, those of every event waiting in the queue sent in one
        write; the last carries the finish reason and the text held back until the end. Aborts the request when
        left early (a client gone)."""
        events = api.StreamEvents(kind, reply, parsed.model)
        first, count, finished = True, 0, False
        try:
            while not finished:
                waiting = [await queue.get()]
                while not queue.empty():
                    waiting.append(queue.get_nowait())
                frames = []
                for event in waiting:
                    for piece, token, finish in _consume(rid, event, detok):
                        count += token is not None
                        frames.append(events.event(piece, token, finish, first))
                        first, finished = False, finish is not None
                    if finished:
                        break
                if frames:
                    yield b"".join(frames)
        finally:
            if not finished:
                driver.abort(rid)
        if parsed.include_usage:
            yield api.sse({"id": reply, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                           "created": events.created, "model": parsed.model, "choices": [],
                           "usage": api.usage(len(parsed.prompt), count)})
        yield b"data: [DONE]\n\n"

    async def _whole(request, kind, reply, rid, queue, detok, parsed) -> Response:
        pieces, tokens, finish = [], [], None
        try:
            while finish is None:
                try:
                    event = await asyncio.wait_for(queue.get(), 0.25)
                except TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)
                    continue
                for piece, token, reason in _consume(rid, event, detok):
                    pieces.append(piece)
                    if token is not None:
                        tokens.append(token)
                    finish = reason
        finally:
            if finish is None:
                driver.abort(rid)
        return JSONResponse(api.whole(kind, reply, parsed.model, "".join(pieces), tokens, finish,
                                      api.usage(len(parsed.prompt), len(tokens))))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        driver.start()
        yield
        await asyncio.to_thread(driver.stop, timeout=shutdown_timeout)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (port 0: one the OS chooses, free by construction; the socket's
    ``getsockname()[1]`` says which), for :func:`serve`. Binding before serving means the port the server
    announces is already its own: no other process can take it between a check and the bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve(app: Starlette, sock: socket.socket, *, shutdown_timeout: float = 30.0) -> None:
    """Runs ``app`` on the bound ``sock`` (:func:`bind`) until SIGTERM or SIGINT; then stops listening, lets the
    requests in flight finish for up to ``shutdown_timeout`` seconds, and returns (so the process exits 0:
    uvicorn's own handling would re-raise the signal after its graceful shutdown)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGTERM, signal.SIGINT)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=int(shutdown_timeout))
    _Server(config).run(sockets=[sock])
