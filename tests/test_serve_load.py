"""mltensor.serve under load and bad input (issue 44, point 3): a set of malformed and hostile
requests all answered 4xx with OpenAI's JSON error body and the server alive after; a load test
whose every reply equals its prompt's solo reply (nothing lost, duplicated or mixed with another
request's tokens); a full queue answered 429 with Retry-After; a client that disconnects frees its
slot; an internal error in one request is a 500 (an error event when streaming) while the others
go on."""

import concurrent.futures as cf
import http.client
import json
import random
import socket
import time

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
pytest.importorskip("prometheus_client")

import mltensor  # noqa: E402
from mltensor.llm import LLM  # noqa: E402
from mltensor.llm.engine import Engine  # noqa: E402
from mltensor.serve import ServedModel, create_app  # noqa: E402

from serve_helpers import GREEDY, ThreadServer, get, post, request, tiny_gguf  # noqa: E402

CONTEXT = 256


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(
        tiny_gguf(tmp_path_factory.mktemp("load") / "tiny.gguf"), mltensor.ml.create_context_sync(), max_context=CONTEXT
    )


@pytest.fixture(scope="module")
def served(llm):
    engine = Engine(llm, slots=8, max_queue=512, prefill_chunk=32)
    with ThreadServer(create_app({"tiny": ServedModel(llm, engine)})) as s:
        s.engine = engine
        yield s


def _wait_idle(engine, timeout=20):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        m = engine.metrics()
        if m["active"] == 0 and m["queue_depth"] == 0:
            return m
        time.sleep(0.02)
    raise AssertionError(f"the engine did not go idle: {engine.metrics()}")


# -- the bad-input set ------------------------------------------------------------------------------

J = {"content-type": "application/json"}
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def _bad_requests():
    """(method, path, body bytes, headers, expected status): >= 30 malformed or hostile requests."""
    js = lambda o: json.dumps(o).encode()  # noqa: E731
    c = lambda **kw: js(dict({"model": "tiny", "messages": MSG}, **kw))  # noqa: E731
    p = lambda **kw: js(dict({"model": "tiny", "prompt": "hi"}, **kw))  # noqa: E731
    return [
        ("POST", CHAT, b"", J, 400),  # empty body
        ("POST", CHAT, b"{", J, 400),  # truncated JSON
        ("POST", CHAT, b"\xff\xfe\x00garbage", J, 400),  # not UTF-8
        ("POST", CHAT, b"[1, 2, 3]", J, 400),  # not an object
        ("POST", CHAT, b'"just a string"', J, 400),
        (
            "POST",
            CHAT,
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            J,
            400,
        ),
        ("POST", CHAT, b"[" * 100000 + b"]" * 100000, J, 400),  # nesting past the parser's recursion
        ("POST", CHAT, js({"messages": MSG}), J, 400),  # no model
        ("POST", CMPL, b'{"model": "tiny", "prompt": "a \\ud800 b"}', J, 400),  # a lone surrogate
        ("POST", CHAT, js({"model": 7, "messages": MSG}), J, 400),
        ("POST", CHAT, js({"model": "nope", "messages": MSG}), J, 404),
        ("POST", CHAT, js({"model": "tiny"}), J, 400),  # no messages
        ("POST", CHAT, c(messages=[]), J, 400),
        ("POST", CHAT, c(messages="hi"), J, 400),
        ("POST", CHAT, c(messages=[{"role": "wizard", "content": "hi"}]), J, 400),
        ("POST", CHAT, c(messages=[{"role": "user", "content": 5}]), J, 400),
        ("POST", CHAT, c(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), J, 400),
        ("POST", CHAT, c(messages=[["user", "hi"]]), J, 400),
        ("POST", CHAT, c(max_tokens="10"), J, 400),
        ("POST", CHAT, c(max_tokens=0), J, 400),
        ("POST", CHAT, c(max_tokens=-5), J, 400),
        ("POST", CHAT, c(max_tokens=10**12), J, 400),  # past the context
        ("POST", CHAT, c(max_tokens=True), J, 400),
        ("POST", CHAT, c(temperature="hot"), J, 400),
        ("POST", CHAT, c(temperature=-1), J, 400),
        ("POST", CHAT, c(top_p=0), J, 400),
        ("POST", CHAT, c(top_p=1.5), J, 400),
        ("POST", CHAT, c(top_k=-1), J, 400),
        ("POST", CHAT, c(presence_penalty=3), J, 400),
        ("POST", CHAT, c(frequency_penalty=[1]), J, 400),
        ("POST", CHAT, c(seed="x"), J, 400),
        ("POST", CHAT, c(stop=5), J, 400),
        ("POST", CHAT, c(stop=["a", "b", "c", "d", "e"]), J, 400),
        ("POST", CHAT, c(n=3), J, 400),
        ("POST", CHAT, c(stream="yes"), J, 400),
        ("POST", CHAT, c(stream_options={"include_usage": True}), J, 400),  # without stream
        ("POST", CHAT, c(logprobs=True), J, 400),
        ("POST", CHAT, c(tools=[{"type": "function", "function": {"name": "f"}}]), J, 400),
        ("POST", CHAT, c(messages=[{"role": "user", "content": "hi " * 400}]), J, 400),  # prompt past the context
        ("POST", CMPL, p(prompt=None), J, 400),
        ("POST", CMPL, p(prompt=[]), J, 400),
        ("POST", CMPL, p(prompt=[1, 2, 10**9]), J, 400),  # token ids outside the vocabulary
        ("POST", CMPL, p(prompt=[-1]), J, 400),
        ("POST", CMPL, p(prompt=["a", "b"]), J, 400),  # several prompts
        ("POST", CMPL, p(prompt={"text": "hi"}), J, 400),
        ("POST", CMPL, p(echo=True), J, 400),
        ("POST", CMPL, p(best_of=3), J, 400),
        ("POST", CMPL, b"x" * (9 << 20), J, 413),  # a body past the limit
        ("POST", "/v1/embeddings", js({"model": "tiny", "input": "x"}), J, 404),  # no embedding model of that name
        ("GET", CHAT, b"", {}, 405),
        ("DELETE", "/v1/models", b"", {}, 405),
        ("PUT", CMPL, p(), J, 405),
        ("GET", "/v2/chat/completions", b"", {}, 404),
        ("POST", "/../../etc/passwd", b"", {}, 404),
        ("GET", "/v1/models/nope", b"", {}, 404),
        ("POST", "/admin", js({"model": "tiny"}), J, 404),
    ]


def test_the_bad_input_set_is_answered_4xx_json(served):
    bad = _bad_requests()
    assert len(bad) >= 30
    for method, path, body, headers, status in bad:
        r = request(method, served.url + path, body, headers)
        assert r.status_code == status, (method, path, body[:80], r.status_code, r.text[:300])
        e = r.json()["error"]
        assert set(e) == {"message", "type", "param", "code"} and e["message"], e
    # a request whose Content-Length promises more than it sends, then hangs up
    with socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1]))) as s:
        s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"model"')
    # headers and a request line no server should take
    conn = http.client.HTTPConnection("127.0.0.1", int(served.url.rsplit(":", 1)[1]), timeout=30)
    conn.putrequest("POST", CHAT)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", "-1")
    conn.endheaders()
    assert conn.getresponse().status == 400
    conn.close()
    # the server is alive and answers as before
    assert get(served.url + "/health").json()["status"] == "ok"
    r = post(served.url + CMPL, {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    _wait_idle(served.engine)


VALUES = [None, True, False, 0, 1, -1, 2, 3.5, -0.0, 1e308, -1e308, 10**20, 2**63, -(2**63), 0.5, ""]
VALUES += ["x", "\x00", "stop", [], [1], ["a"], [[1]], [0, 1, 2], {}, {"a": 1}, [{}], {"type": "text"}]
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k"]
FIELDS += ["seed", "stop", "presence_penalty", "frequency_penalty", "repeat_penalty", "n", "stream"]
FIELDS += ["stream_options", "logprobs", "tools", "user", "input", "encoding_format", "dimensions", "echo"]
FIELDS += ["logit_bias", "response_format"]


def test_random_field_values_are_never_a_500(served):
    """A seeded fuzz: valid requests with 1-3 fields set to values of every JSON kind; each answer
    is a 200 or a 4xx with OpenAI's error body."""
    rng = random.Random(0)
    for _ in range(150):
        path = rng.choice([CHAT, CMPL, "/v1/embeddings"])
        body = {"model": "tiny", "max_tokens": 4}
        body.update({"messages": MSG} if path == CHAT else {"prompt": "hi"})
        for _ in range(rng.randint(1, 3)):
            f, v = rng.choice(FIELDS), rng.choice(VALUES)
            if f == "messages" and rng.random() < 0.5:
                v = [
                    {
                        "role": rng.choice(["user", "system", "assistant", "tool", 5, None]),
                        "content": rng.choice(VALUES),
                    }
                ]
            body[f] = v
        r = post(served.url + path, body)
        assert r.status_code < 500, (path, body, r.text[:300])
        if r.status_code >= 400:
            assert r.json()["error"]["message"], (path, body, r.text[:300])
    _wait_idle(served.engine)


# -- load ------------------------------------------------------------------------------------------

LOAD_PROMPTS = ["hello there", "the 12 the", "naive cats", "a b c d", "once upon", "zz top", "42 is", "what now"]


def _load(served, llm, clients, requests, max_tokens):
    """`requests` completions (half streamed, prompts in turn) from `clients` threads; every reply
    must equal its prompt's solo reply (LLM.generate), every response id be new."""
    solo = {p: llm.generate(p, max_tokens=max_tokens, **GREEDY) for p in LOAD_PROMPTS}
    assert len(set(solo.values())) == len(solo)  # different replies: a mix-up shows
    client = served.client()
    before = served.engine.metrics()

    def one(i):
        p = LOAD_PROMPTS[i % len(LOAD_PROMPTS)]
        kw = dict(model="tiny", prompt=p, max_tokens=max_tokens, temperature=0)
        if i % 2:
            chunks = list(client.completions.create(stream=True, **kw))
            return i, p, {c.id for c in chunks}, "".join(c.choices[0].text for c in chunks)
        r = client.completions.create(**kw)
        return i, p, {r.id}, r.choices[0].text

    with cf.ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(one, range(requests)))
    assert sorted(i for i, *_ in results) == list(range(requests))  # none lost
    ids = [next(iter(s)) for _, _, s, _ in results]
    assert all(len(s) == 1 for _, _, s, _ in results) and len(set(ids)) == requests  # none duplicated
    wrong = [(i, p, text) for i, p, _, text in results if text != solo[p]]
    assert not wrong, wrong[:3]  # none mixed with another's tokens
    after = _wait_idle(served.engine)
    assert after["requests_finished_total"] - before["requests_finished_total"] == requests
    assert get(served.url + "/health").status_code == 200


def test_load_small(served, llm):
    _load(served, llm, clients=8, requests=48, max_tokens=8)


@pytest.mark.slow
def test_load_full(served, llm):
    _load(served, llm, clients=32, requests=300, max_tokens=16)


# -- a full queue, a disconnect, an internal error ---------------------------------------------------


def test_full_queue_is_429_with_retry_after(llm):
    engine = Engine(llm, slots=1, max_queue=1, prefill_chunk=16)
    with ThreadServer(create_app({"tiny": ServedModel(llm, engine)})) as s:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 200, "temperature": 0}
        with cf.ThreadPoolExecutor(6) as ex:
            answers = list(ex.map(lambda _: post(s.url + CMPL, body), range(6)))
        busy = [r for r in answers if r.status_code == 429]
        assert busy and len(busy) + sum(r.status_code == 200 for r in answers) == 6
        for r in busy:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "queue_full" and r.json()["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):  # the client sees it as OpenAI's rate limit
            with cf.ThreadPoolExecutor(4) as ex:
                futs = [ex.submit(s.client().completions.create, **body) for _ in range(4)]
                [f.result() for f in futs]
        _wait_idle(engine)
        assert post(s.url + CMPL, dict(body, max_tokens=2)).status_code == 200


def test_a_client_that_disconnects_frees_its_slot(served):
    engine = served.engine
    _wait_idle(engine)
    port = int(served.url.rsplit(":", 1)[1])
    for stream in (True, False):
        before = engine.metrics()
        body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 240, "temperature": 0, "stream": stream})
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", CMPL, body=body, headers=J)
        if stream:
            r = conn.getresponse()
            assert r.status == 200
            r.fp.readline()  # the first event has come: the request runs
        else:
            t0 = time.monotonic()
            while engine.metrics()["active"] == 0 and time.monotonic() - t0 < 10:
                time.sleep(0.005)
        conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away
        conn.close()
        after = _wait_idle(engine)
        generated = after["generated_tokens_total"] - before["generated_tokens_total"]
        assert after["requests_finished_total"] == before["requests_finished_total"] + 1
        assert generated < 240, (stream, generated)  # cancelled before its end
    assert get(served.url + "/health").status_code == 200


class _Trap:
    """The engine's tokenizer with a fault: decoding token `trigger` raises (a stand-in for a bug
    met by one request while the others stream)."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.trigger = None

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def decode(self, ids, **kw):
        if self.trigger is not None and self.trigger in ids:
            raise RuntimeError("injected fault")
        return self._tok.decode(ids, **kw)


def test_an_internal_error_ends_one_request_only(llm):
    engine = Engine(llm, slots=4, max_queue=16, prefill_chunk=16)
    trap = engine.tokenizer = _Trap(llm.tokenizer)
    with ThreadServer(create_app({"tiny": ServedModel(llm, engine)})) as s:
        client = s.client()
        ids = {p: llm.generate(p, max_tokens=10, return_ids=True, **GREEDY) for p in LOAD_PROMPTS}
        text = {p: llm.generate(p, max_tokens=10, **GREEDY) for p in LOAD_PROMPTS}
        # a victim whose reply holds a token that no other prompt's reply holds
        victim, trigger = next(
            (p, t) for p in LOAD_PROMPTS for t in ids[p] if all(t not in ids[q] for q in LOAD_PROMPTS if q != p)
        )
        others = [p for p in LOAD_PROMPTS if p != victim]
        trap.trigger = trigger

        def one(p, stream):
            kw = dict(model="tiny", prompt=p, max_tokens=10, temperature=0)
            try:
                if stream:
                    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
                return client.completions.create(**kw).choices[0].text
            except openai.APIError as e:
                return e

        jobs = [(victim, False), (victim, True)] + [(p, i % 2 == 0) for i, p in enumerate(others)]
        with cf.ThreadPoolExecutor(len(jobs)) as ex:
            got = list(ex.map(lambda j: one(*j), jobs))
        plain, streamed = got[0], got[1]
        assert isinstance(plain, openai.InternalServerError) and plain.status_code == 500
        assert "injected fault" in plain.message and plain.code == "internal_error"
        assert isinstance(streamed, openai.APIError) and "injected fault" in streamed.message  # the error event
        assert got[2:] == [text[p] for p in others]  # the others are whole
        trap.trigger = None
        assert (
            client.completions.create(model="tiny", prompt=victim, max_tokens=10, temperature=0).choices[0].text
            == text[victim]
        )


def test_a_failing_prompt_is_a_500_json(llm):
    """An exception in the server's own code (here: the chat template) is a 500 with a message."""
    engine = Engine(llm, slots=1, max_queue=4)
    with ThreadServer(create_app({"tiny": ServedModel(llm, engine)})) as s:
        real = llm.apply_chat_template
        llm.apply_chat_template = lambda messages, **kw: (_ for _ in ()).throw(KeyError("broken template"))
        try:
            r = post(s.url + CHAT, {"model": "tiny", "messages": MSG, "max_tokens": 2})
        finally:
            llm.apply_chat_template = real
        assert r.status_code == 500 and "broken template" in r.json()["error"]["message"]
        # a template that refuses the messages (raise_exception: Mistral's, Gemma's roles) is the client's
        from jinja2.exceptions import TemplateError

        llm.apply_chat_template = lambda messages, **kw: (_ for _ in ()).throw(TemplateError("roles must alternate"))
        try:
            r = post(s.url + CHAT, {"model": "tiny", "messages": MSG, "max_tokens": 2})
        finally:
            llm.apply_chat_template = real
        assert r.status_code == 400 and "roles must alternate" in r.json()["error"]["message"]
        assert post(s.url + CHAT, {"model": "tiny", "messages": MSG, "max_tokens": 2}).status_code == 200
