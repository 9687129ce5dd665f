"""The OpenAI-compatible HTTP app (FastAPI): `create_app(models, embedders)`.

Routes: POST /v1/chat/completions, /v1/completions (streamed as server-sent events, sse-starlette,
or whole), /v1/embeddings; GET /v1/models, /v1/models/{id}, /health, /metrics. Each language model
is an `LLM` with its continuous-batching `Engine` (mltensor/llm/engine.py): a request's prompt is
tokenized in a worker thread, submitted to the engine, and its pieces are read from asyncio
(`async for`), so one event loop serves every stream while the engine's thread decodes them in
shared steps.

Failures are answered, never raised: OpenAI's error body {"error": {"message", "type", "param",
"code"}} with 400 (a wrong field, a prompt too long for the context), 401 (API key), 404 (unknown
model or route), 405, 413, 429 (the engine's queue is full; Retry-After), 500 (an internal error in
this request only; while streaming, an `error` event ends the stream) and 503 (shutting down). A
client that disconnects cancels its request: the engine frees its slot at the next step.

FastAPI, sse-starlette and prometheus_client are imported by create_app (the serve extra): this
module imports without them.
"""

import asyncio
import hmac
import json
import time

from jinja2.exceptions import TemplateError

from ..llm.engine import EngineClosed, QueueFull
from .metrics import Metrics
from .protocol import (
    MAX_BODY_BYTES,
    APIError,
    Reply,
    Sampling,
    check_embedding_input,
    check_messages,
    check_model,
    check_prompt,
    embeddings_response,
    error_body,
    finish_reason,
    parse_body,
)

#: a completions request without max_tokens generates at most this many (OpenAI's default);
#: a chat request without it may fill the context
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: the routes the request counter names (any other path counts as "other")
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics")


class ServedModel:
    """A language model the server serves: its LLM and the Engine that batches its requests."""

    def __init__(self, llm, engine):
        self.llm = llm
        self.engine = engine
        self.created = int(time.time())


class State:
    """What the routes share: the models, the embedders, the API key, the metrics, and whether
    the server is shutting down (`closing`: streams then get `grace` seconds to finish)."""

    def __init__(self, models, embedders, api_key, grace, owns_engines):
        self.models = dict(models)
        self.embedders = dict(embedders or {})
        overlap = set(self.models) & set(self.embedders)
        if overlap:
            raise ValueError(f"[serve] a name serves both a language and an embedding model: {sorted(overlap)}")
        self.api_key = api_key
        self.grace = float(grace)
        self.owns_engines = owns_engines
        self.metrics = Metrics({n: m.engine for n, m in self.models.items()})
        self.closing = asyncio.Event()  # set when shutdown begins (bound to the loop that waits first)
        self.created = int(time.time())

    def begin_shutdown(self):
        """Stop taking requests; streams get `grace` seconds, then are cancelled. Call from the
        event loop's thread."""
        self.closing.set()


def _json(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def create_app(models, embedders=None, *, api_key=None, grace=30.0, owns_engines=True):
    """The FastAPI app serving `models` ({name: ServedModel}) and `embedders` ({name: Embedder}).
    api_key: a Bearer key every route but /health requires (None: open). grace: seconds a stream
    may go on after shutdown begins before it is cancelled. owns_engines: shut the engines down
    when the app stops."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from sse_starlette.sse import EventSourceResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException

    state = State(models, embedders, api_key, grace, owns_engines)

    async def lifespan(app):
        try:
            yield
        finally:
            state.begin_shutdown()
            if state.owns_engines:
                for m in state.models.values():
                    await run_in_threadpool(m.engine.shutdown, cancel=True, timeout=max(state.grace, 1.0))

    app = FastAPI(title="mltensor", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.serve = state

    def error(e, route=None):
        state.metrics.request(route if route in ROUTES else "other", e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(APIError)
    async def _api_error(request, e):
        return error(e, request.url.path)

    @app.exception_handler(HTTPException)
    async def _http_error(request, e):
        if e.status_code == 404:
            msg = f"no route {request.method} {request.url.path} (see GET /v1/models; the API lives under /v1)"
        elif e.status_code == 405:
            msg = f"method {request.method} is not allowed on {request.url.path}"
        else:
            msg = str(e.detail)
        return error(APIError(e.status_code, msg, code="not_found" if e.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def _internal(request, e):
        return error(_internal_error(e), request.url.path)

    def check_key(request):
        if state.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), state.api_key.encode()):
            raise APIError(
                401,
                "missing or incorrect API key: send the header 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def check_open():
        if state.closing.is_set():
            raise APIError(503, "the server is shutting down", code="server_shutdown")

    async def read_body(request):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="request_too_large")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="request_too_large")
        return parse_body(bytes(raw))

    @app.get("/health")
    async def health():
        if state.closing.is_set():
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return {"status": "ok", "models": sorted(state.models) + sorted(state.embedders)}

    def model_card(name, created):
        return {"id": name, "object": "model", "created": created, "owned_by": "mltensor"}

    @app.get("/v1/models")
    async def list_models(request: Request):
        check_key(request)
        data = [model_card(n, m.created) for n, m in sorted(state.models.items())]
        data += [model_card(n, state.created) for n in sorted(state.embedders)]
        state.metrics.request("/v1/models", 200)
        return {"object": "list", "data": data}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str, request: Request):
        check_key(request)
        if name in state.models:
            return model_card(name, state.models[name].created)
        if name in state.embedders:
            return model_card(name, state.created)
        raise APIError(404, f"the model {name!r} does not exist", param="model", code="model_not_found")

    @app.get("/metrics")
    async def metrics(request: Request):
        check_key(request)
        body, ctype = state.metrics.render()
        return Response(body, media_type=ctype)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        route = "/v1/embeddings"
        check_key(request)
        check_open()
        body = await read_body(request)
        name = check_model(body, state.embedders)
        emb = state.embedders[name]
        items, fmt = check_embedding_input(body, emb.vocab_size)
        dims = body.get("dimensions")
        if dims is not None:
            raise APIError(
                400, "dimensions: not supported by this server", param="dimensions", code="unsupported_parameter"
            )
        try:
            vectors, tokens = await run_in_threadpool(emb.embed, items)
        except APIError:
            raise
        except Exception as e:
            raise _internal_error(e) from e
        state.metrics.embedded.labels(name).inc(len(items))
        state.metrics.request(route, 200)
        return JSONResponse(embeddings_response(name, vectors, fmt, tokens))

    async def complete(request, chat):
        route = "/v1/chat/completions" if chat else "/v1/completions"
        check_key(request)
        check_open()
        body = await read_body(request)
        name = check_model(body, state.models)
        served = state.models[name]
        s = Sampling(body)
        llm = served.llm
        if chat:
            messages = check_messages(body)
            ids = await run_in_threadpool(_chat_ids, llm, messages)
        else:
            prompt = check_prompt(body, llm.tokenizer.vocab_size)
            ids = await run_in_threadpool(llm.tokenize, prompt) if isinstance(prompt, str) else prompt
        max_tokens = _max_tokens(s, len(ids), llm.max_context, chat)
        req = _submit(served.engine, ids, s.engine_kwargs(max_tokens))
        reply = Reply(name, chat)
        t0 = time.perf_counter()
        if s.stream:
            state.metrics.request(route, 200)
            return EventSourceResponse(
                _events(req, reply, s, name, t0),
                sep="\n",
                ping=15,
                shutdown_grace_period=state.grace + 2.0,  # ours (grace) ends the stream first
                background=BackgroundTask(req.cancel),  # also when the stream never started
            )
        try:
            text = await _collect(request, req)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            state.metrics.finished(name, req, time.perf_counter() - t0)
            raise _internal_error(e) from e
        state.metrics.finished(name, req, time.perf_counter() - t0)
        if req.finish_reason == "cancelled":
            raise APIError(
                503, "the request was cancelled (the client left, or the server is shutting down)", code="cancelled"
            )
        state.metrics.request(route, 200)
        out = reply.response(
            text, finish_reason(req.finish_reason), req.prompt_tokens, req.completion_tokens, _cached(req)
        )
        return JSONResponse(out)

    async def _collect(request, req):
        """The request's whole text; a client that disconnects meanwhile cancels it."""

        async def watch():
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    req.cancel()
                    return

        watcher = asyncio.create_task(watch())
        stopper = asyncio.create_task(_cancel_on_shutdown(req))
        pieces = []
        try:
            async for piece in req:
                pieces.append(piece)
        except BaseException:
            req.cancel()
            raise
        finally:
            watcher.cancel()
            stopper.cancel()
        return "".join(pieces)

    async def _cancel_on_shutdown(req):
        """Cancel `req` `grace` seconds after shutdown begins (it may finish before)."""
        await state.closing.wait()
        await asyncio.sleep(state.grace)
        req.cancel()

    async def _events(req, reply, s, name, t0):
        """The SSE stream of one request: OpenAI's chunks, then `[DONE]`; an error event if the
        request fails or the server stops it."""
        iu = s.include_usage
        stopper = asyncio.create_task(_cancel_on_shutdown(req))
        try:
            if reply.chat:
                yield _json(reply.chunk(first=True, include_usage=iu))
            try:
                async for piece in req:
                    yield _json(reply.chunk(piece, include_usage=iu))
            except Exception as e:
                state.metrics.finished(name, req, time.perf_counter() - t0)
                yield _json(_internal_error(e).body())
                return
            state.metrics.finished(name, req, time.perf_counter() - t0)
            if req.finish_reason == "cancelled":
                yield _json(error_body("the server is shutting down", "server_error", None, "server_shutdown"))
                return
            yield _json(reply.chunk(None, finish_reason(req.finish_reason), include_usage=iu))
            if iu:
                yield _json(reply.usage_chunk(req.prompt_tokens, req.completion_tokens, _cached(req)))
            yield "[DONE]"
        finally:
            stopper.cancel()
            req.cancel()  # the client left (the task is cancelled here): its slot frees at the next step

    return app


def _cached(req):
    """The prompt tokens the engine reused from a slot's cache (None: an engine that does not say)."""
    return getattr(req, "cached_tokens", None)


def _chat_ids(llm, messages):
    try:
        text = llm.apply_chat_template(messages)
    except TemplateError as e:  # the template's raise_exception: roles out of the order it takes
        raise APIError(
            400, f"the model's chat template rejects these messages: {e}", param="messages", code="invalid_messages"
        ) from None
    return llm.tokenizer.encode_chat(text)


def _max_tokens(s, n_prompt, context, chat):
    """The request's max_tokens, checked against the context (400 context_length_exceeded)."""
    if n_prompt < 1:
        raise APIError(400, "the prompt has no tokens", param="prompt", code="invalid_value")
    room = context - n_prompt
    if s.max_tokens is None:
        mt = room if chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, room)
    else:
        mt = s.max_tokens
    if room < 1 or mt > room:
        raise APIError(
            400,
            f"this model's context holds {context} tokens; the prompt has {n_prompt} and max_tokens asks for "
            f"{mt if mt >= 1 else 1}: shorten the prompt or lower max_tokens",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    return mt


def _submit(engine, ids, kwargs):
    try:
        return engine.submit(ids, **kwargs)
    except QueueFull as e:
        after = max(1, int(-(-float(getattr(e, "retry_after", 1.0) or 1.0) // 1)))
        raise APIError(
            429,
            f"the server is busy (its queue is full): retry after {after} s",
            code="queue_full",
            headers={"Retry-After": str(after)},
        ) from None
    except EngineClosed:
        raise APIError(503, "the server is shutting down", code="server_shutdown") from None
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), code="invalid_value") from None


def _internal_error(e):
    return APIError(
        500,
        f"internal error while serving the request: {type(e).__name__}: {e}",
        type="server_error",
        code="internal_error",
    )
