"""The OpenAI wire format of mltensor.serve, without the web framework: reading a request body into
checked options (every wrong field is an `APIError` naming it, answered as a 4xx with OpenAI's
error body), and writing the responses and stream chunks as OpenAI's API writes them.

Pure Python: the app (app.py) and the Ray deployment (ray.py) share it, and tests read it without
a server.
"""

import base64
import json
import math
import time
import uuid

import numpy as np

#: request bodies larger than this are refused (413) before they are parsed
MAX_BODY_BYTES = 8 << 20
#: OpenAI's limit on stop sequences
MAX_STOP = 4
ROLES = ("system", "developer", "user", "assistant")
#: fields of a request we accept only at their "off" value (a feature the server does not have)
UNSUPPORTED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}


class APIError(Exception):
    """A request the server answers with `status` and OpenAI's error body
    {"error": {"message", "type", "param", "code"}}; `headers` go with it (Retry-After)."""

    def __init__(self, status, message, *, type=None, param=None, code=None, headers=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _ERROR_TYPES.get(status, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self):
        return error_body(self.message, self.type, self.param, self.code)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


def error_body(message, type="invalid_request_error", param=None, code=None):
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _no_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def parse_body(raw):
    """The JSON object of a request body (bytes), or APIError 400/413."""
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="request_too_large")
    if not raw.strip():
        raise APIError(400, "the request body is empty: send a JSON object", code="invalid_json")
    try:
        body = json.loads(raw, parse_constant=_no_constant)  # NaN, Infinity: not JSON
    except RecursionError:
        raise APIError(400, "the request body nests too deeply", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_kind(body)}", code="invalid_json")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which no text is made of
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400, "the request body holds a lone UTF-16 surrogate (\\ud800-\\udfff)", code="invalid_json"
        ) from None
    return body


def _kind(v):
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def _bad(param, message):
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def _int(body, key, default, lo=None, hi=None):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(key, f"must be an integer, got {_kind(v)}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise _bad(key, f"must lie in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


def _number(body, key, default, lo, hi, lo_open=False):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(key, f"must be a number, got {_kind(v)}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise _bad(key, f"must lie in {'(' if lo_open else '['}{lo}, {hi}], got {v}")
    return float(v)


def _bool(body, key, default):
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(key, f"must be a boolean, got {_kind(v)}")
    return v


def check_model(body, known):
    """The requested model's name, or APIError (400 missing, 404 unknown)."""
    model = body.get("model")
    if model is None:
        raise APIError(400, "model: required (GET /v1/models lists them)", param="model", code="missing_required")
    if not isinstance(model, str):
        raise _bad("model", f"must be a string, got {_kind(model)}")
    if model not in known:
        raise APIError(
            404,
            f"the model {model!r} does not exist (served: {', '.join(sorted(known)) or 'none'})",
            param="model",
            code="model_not_found",
        )
    return model


def _unsupported(body):
    for key, off in UNSUPPORTED.items():
        if key in body and body[key] not in off:
            raise APIError(400, f"{key}: not supported by this server", param=key, code="unsupported_parameter")


class Sampling:
    """The generation options of a completions or chat request, checked; `engine_kwargs(max_tokens)`
    is what Engine.submit takes."""

    def __init__(self, body):
        _unsupported(body)
        n = _int(body, "n", 1)
        if n != 1:
            raise APIError(400, f"n: only n=1 is supported, got {n}", param="n", code="unsupported_parameter")
        mt = _int(body, "max_completion_tokens", None, lo=1)
        self.max_tokens = _int(body, "max_tokens", mt, lo=1)
        self.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        self.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
        self.top_k = _int(body, "top_k", 0, lo=0)
        self.seed = _int(body, "seed", None)
        if self.seed is not None:
            self.seed %= 1 << 63  # OpenAI takes any 64-bit integer; the engine takes >= 0
        self.presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
        self.frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
        self.repeat_penalty = _number(body, "repeat_penalty", 1.0, 0.0, 10.0, lo_open=True)
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _bad("stop", "must be a string or an array of strings")
        if len(stop) > MAX_STOP:
            raise _bad("stop", f"at most {MAX_STOP} sequences, got {len(stop)}")
        self.stop = [s for s in stop if s]
        self.stream = _bool(body, "stream", False)
        opts = body.get("stream_options")
        self.include_usage = False
        if opts is not None:
            if not self.stream:
                raise _bad("stream_options", "only allowed when stream is true")
            if not isinstance(opts, dict):
                raise _bad("stream_options", f"must be an object, got {_kind(opts)}")
            self.include_usage = _bool(opts, "include_usage", False)
        user = body.get("user")
        if user is not None and not isinstance(user, str):
            raise _bad("user", f"must be a string, got {_kind(user)}")

    def engine_kwargs(self, max_tokens):
        return dict(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            stop=tuple(self.stop),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repeat_penalty=self.repeat_penalty,
        )


def _content(m, i):
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for j, p in enumerate(c):
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise _bad(
                    f"messages[{i}].content[{j}]", "only text parts ({'type': 'text', 'text': ...}) are supported"
                )
            parts.append(p["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content", f"must be a string or an array of text parts, got {_kind(c)}")


def check_messages(body):
    """The chat messages as the chat template takes them: [{"role", "content": str}]."""
    msgs = body.get("messages")
    if msgs is None:
        raise APIError(400, "messages: required", param="messages", code="missing_required")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "must be a non-empty array of messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}]", f"must be an object, got {_kind(m)}")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    return out


def check_prompt(body, vocab_size):
    """A completions prompt: a str, or a list of token ids (also a one-element array of either)."""
    p = body.get("prompt")
    if p is None:
        raise APIError(400, "prompt: required", param="prompt", code="missing_required")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise _bad("prompt", f"token ids must lie in [0, {vocab_size}), got {bad[:4]}")
        return list(p)
    if isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
        raise APIError(400, "prompt: one prompt per request (n=1)", param="prompt", code="unsupported_parameter")
    raise _bad("prompt", "must be a string or an array of token ids")


def check_embedding_input(body, vocab_size):
    """The embeddings input as a list of str or of token-id lists; the encoding format."""
    x = body.get("input")
    if x is None:
        raise APIError(400, "input: required", param="input", code="missing_required")
    if isinstance(x, str):
        items = [x]
    elif isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        items = [x]
    elif isinstance(x, list) and x:
        items = x
    else:
        raise _bad("input", "must be a string, an array of strings, or token ids")
    for i, it in enumerate(items):
        if isinstance(it, str):
            continue
        if isinstance(it, list) and it and all(isinstance(t, int) and not isinstance(t, bool) for t in it):
            bad = [t for t in it if not 0 <= t < vocab_size]
            if bad:
                raise _bad(f"input[{i}]", f"token ids must lie in [0, {vocab_size}), got {bad[:4]}")
            continue
        raise _bad(f"input[{i}]", f"must be a string or a non-empty array of token ids, got {_kind(it)}")
    fmt = body.get("encoding_format")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise _bad("encoding_format", f"must be 'float' or 'base64', got {fmt!r}")
    return items, fmt


# -- responses -------------------------------------------------------------------------------------


def new_id(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens, completion_tokens, cached_tokens=None):
    """OpenAI's usage object; cached_tokens: the prompt's start the engine found in its cache."""
    u = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return u


class Reply:
    """One completion's response and stream chunks, for `chat` (chat.completion) or not
    (text_completion)."""

    def __init__(self, model, chat):
        self.model = model
        self.chat = chat
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _head(self, obj):
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}

    def response(self, text, finish_reason, prompt_tokens, completion_tokens, cached_tokens=None):
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        return dict(self._head(obj), choices=[choice], usage=usage(prompt_tokens, completion_tokens, cached_tokens))

    def chunk(self, piece=None, finish_reason=None, *, first=False, include_usage=False):
        """One stream chunk: a piece of text, or the last (finish_reason set, no text)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if piece is not None:
                delta["content"] = piece
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            c = dict(self._head("chat.completion.chunk"), choices=[choice])
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish_reason}
            c = dict(self._head("text_completion"), choices=[choice])
        if include_usage:
            c["usage"] = None
        return c

    def usage_chunk(self, prompt_tokens, completion_tokens, cached_tokens=None):
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return dict(self._head(obj), choices=[], usage=usage(prompt_tokens, completion_tokens, cached_tokens))


def embeddings_response(model, vectors, fmt, prompt_tokens):
    data = []
    for i, v in enumerate(vectors):
        if fmt == "base64":
            e = base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
        else:
            e = [float(x) for x in v]
        data.append({"object": "embedding", "index": i, "embedding": e})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def finish_reason(reason):
    """The OpenAI finish_reason of an engine request's (stop / length; a cancelled one: stop)."""
    return "length" if reason == "length" else "stop"
