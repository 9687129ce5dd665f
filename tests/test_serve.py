"""mltensor.serve's OpenAI API (issue 44) through the real `openai` client against the app served
by uvicorn on 127.0.0.1 (a thread of this process): completions and chat, streamed and not,
against LLM.generate / LLM.chat (the unbatched decode loop, an independent path); parallel greedy
requests equal to their solo replies; metrics, several models, the API key. The tiny synthetic
GGUF model of tests/test_llm_api.py."""

import concurrent.futures as cf

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

from serve_helpers import GREEDY, ThreadServer, get, tiny_gguf  # noqa: E402

CONTEXT = 160
PROMPTS = ["hello there", "the 12 the", "naive cats", "a b c d", "once upon", "zz top", "42 is", "what now"]


@pytest.fixture(scope="module")
def ctx():
    return mltensor.ml.create_context_sync()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("serve") / "tiny.gguf")


@pytest.fixture(scope="module")
def llm(path, ctx):
    return LLM(path, ctx, max_context=CONTEXT)


@pytest.fixture(scope="module")
def llm2(tmp_path_factory, ctx):
    return LLM(tiny_gguf(tmp_path_factory.mktemp("serve2") / "other.gguf", seed=5), ctx, max_context=CONTEXT)


@pytest.fixture(scope="module")
def refs(llm):
    """Greedy replies of LLM.generate (its own decode loop, not the engine), made before any server
    runs on this model."""
    out = {}
    for p in PROMPTS:
        out[p] = llm.generate(p, max_tokens=12, **GREEDY)
        out[p, "tokens"] = llm.stats["generated_tokens"]
    assert len({out[p] for p in PROMPTS}) == len(PROMPTS)  # replies that differ: a mix-up would show
    return out


@pytest.fixture(scope="module")
def server(llm, llm2, refs):
    models = {
        "tiny": ServedModel(llm, Engine(llm, slots=4, max_queue=64, prefill_chunk=32)),
        "other": ServedModel(llm2, Engine(llm2, slots=2, max_queue=8, prefill_chunk=16)),
    }
    with ThreadServer(create_app(models)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def test_health_and_models(server, client):
    r = get(server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "models": ["other", "tiny"]}
    assert sorted(m.id for m in client.models.list().data) == ["other", "tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_completions_match_generate(llm, client, refs):
    for p in PROMPTS[:3]:
        r = client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0)
        assert r.object == "text_completion" and r.id.startswith("cmpl-")
        assert r.choices[0].text == refs[p], p
        assert r.usage.prompt_tokens == len(llm.tokenize(p))
        assert r.usage.completion_tokens == refs[p, "tokens"]
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        want_reason = "length" if r.usage.completion_tokens == 12 else "stop"
        assert r.choices[0].finish_reason == want_reason
        # streamed: the same text in pieces, the finish reason in the last chunk
        chunks = list(client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == refs[p]
        assert chunks[-1].choices[0].finish_reason == want_reason
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
        assert len({c.id for c in chunks}) == 1
    # a prompt of token ids
    ids = llm.tokenize(PROMPTS[0])
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0)
    assert r.choices[0].text == refs[PROMPTS[0]]


def test_chat_matches_llm_chat(llm, client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    want = llm.chat(msgs, max_tokens=10, **GREEDY)
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    ids = llm.tokenizer.encode_chat(llm.apply_chat_template(msgs))
    assert r.usage.prompt_tokens == len(ids)
    s = list(
        client.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_completion_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert s[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == want
    assert s[-1].choices == [] and s[-1].usage.completion_tokens == r.usage.completion_tokens
    assert s[-2].choices[0].finish_reason == r.choices[0].finish_reason
    # the same conversation again: the engine finds its prompt in a slot's cache
    assert s[-1].usage.prompt_tokens_details.cached_tokens > 0
    assert all(c.usage is None for c in s[:-1])
    # content as an array of text parts, "developer" as a system message
    parts = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
    ]
    r2 = client.chat.completions.create(model="tiny", messages=parts, max_tokens=10, temperature=0)
    assert r2.choices[0].message.content == want


def test_stop_seed_and_length(client, refs):
    full = client.completions.create(model="tiny", prompt="the 12", max_tokens=24, temperature=0).choices[0].text
    assert len(full) >= 6, full
    stop = full[3:5]
    r = client.completions.create(model="tiny", prompt="the 12", max_tokens=24, temperature=0, stop=[stop, "\x00no"])
    assert r.choices[0].text == full[: full.find(stop)] and r.choices[0].finish_reason == "stop"
    kw = dict(model="tiny", prompt="hello there", max_tokens=16, temperature=0.9, top_p=0.95)
    a = client.completions.create(seed=3, **kw).choices[0].text
    assert client.completions.create(seed=3, **kw).choices[0].text == a  # a seed repeats its draw
    draws = {client.completions.create(seed=s, **kw).choices[0].text for s in range(4)}
    assert len(draws) > 1
    # penalties and top_k are taken (and change a greedy reply's repeats)
    r = client.completions.create(
        model="tiny", prompt="the 12", max_tokens=24, temperature=0, frequency_penalty=2, presence_penalty=1
    )
    assert r.choices[0].text != full or r.choices[0].finish_reason == "stop"
    client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"top_k": 5, "repeat_penalty": 1.3})


def test_errors_through_the_client(client, llm):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", n=2)
    assert e.value.status_code == 400 and "n=1" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=7)
    assert e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi " * 200, max_tokens=4)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=CONTEXT)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="tiny", input="a language model is no embedding model")


def test_parallel_greedy_requests_equal_their_solo_replies(client, refs):
    def one(p, stream):
        kw = dict(model="tiny", prompt=p, max_tokens=12, temperature=0)
        if stream:
            return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
        return client.completions.create(**kw).choices[0].text

    jobs = [(p, i % 2 == 0) for i, p in enumerate(PROMPTS * 2)]
    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        got = list(ex.map(lambda j: one(*j), jobs))
    assert got == [refs[p] for p, _ in jobs]


def test_two_models_in_one_server(client, llm2):
    want = llm2.generate("hello there", max_tokens=8, **GREEDY)
    with cf.ThreadPoolExecutor(4) as ex:
        futs = [
            ex.submit(client.completions.create, model=m, prompt="hello there", max_tokens=8, temperature=0)
            for m in ("other", "tiny", "other", "tiny")
        ]
        got = [f.result().choices[0].text for f in futs]
    assert got[0] == got[2] == want and got[1] == got[3] != want


def test_metrics_exposition(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0)
    r = get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}  # prometheus' own parser

    def value(name, suffix="", **labels):
        for s in fams[name].samples:
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise KeyError(name, labels)

    assert value("mltensor_time_to_first_token_seconds", "_count", model="tiny") >= 1
    assert value("mltensor_time_per_output_token_seconds", "_count", model="tiny") >= 1
    assert value("mltensor_generated_tokens", "_total", model="tiny") >= 4
    assert value("mltensor_http_requests", "_total", route="/v1/completions", status="200") >= 1
    assert value("mltensor_queue_depth", model="tiny") == 0
    assert value("mltensor_slots", model="tiny") == 4 and value("mltensor_slots", model="other") == 2
    assert 0 < value("mltensor_batch_occupancy", model="tiny") <= 1


def test_api_key(llm):
    models = {"tiny": ServedModel(llm, Engine(llm, slots=1, max_queue=4))}
    with ThreadServer(create_app(models, api_key="sekrit")) as s:
        for key in ("none", "sekrit2", "sekri"):
            with pytest.raises(openai.AuthenticationError) as e:
                s.client(api_key=key).completions.create(model="tiny", prompt="hi", max_tokens=2)
            assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
        r = get(s.url + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert get(s.url + "/metrics").status_code == 401
        for auth in ("Bearer", "Basic sekrit", "sekrit", "Bearer  "):
            assert get(s.url + "/v1/models", headers={"Authorization": auth}).status_code == 401, auth
        assert get(s.url + "/health").status_code == 200  # for load balancers: no key
        r = s.client(api_key="sekrit").completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0)
        assert r.choices[0].text == llm.generate("hi", max_tokens=2, **GREEDY)
