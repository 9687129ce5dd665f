"""The serving engine (mltensor/llm/engine.py): continuous batching over one LLM. Greedy replies
against the independent numpy Llama (tests/llm_reference.py), served alone and among concurrent
requests (identical), chunked prompts, stop strings, penalties against a numpy sampler, the
bounded queue, cancel, errors that end one request only, shutdown, asyncio iteration."""

import asyncio
import threading
import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import mltensor  # noqa: E402
from mltensor.llm import LLM  # noqa: E402
from mltensor.llm.batch import LlamaBatch  # noqa: E402
from mltensor.llm.engine import Engine, EngineClosed, QueueFull, sample  # noqa: E402

from llm_reference import NumpyLlama, write_synthetic  # noqa: E402

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_synthetic(
        str(tmp_path_factory.mktemp("engine") / "tok.gguf"), tokenizer=True, hidden=64, heads=4, kv_heads=2, seed=11
    )


@pytest.fixture(scope="module")
def llm(path):
    return LLM(path, mltensor.ml.create_context_sync(), max_context=160)


@pytest.fixture(scope="module")
def engine(llm):
    e = Engine(llm, slots=4, max_queue=64, prefill_chunk=8)
    yield e
    e.shutdown(cancel=True)


@pytest.fixture(scope="module")
def ref(path):
    return NumpyLlama(path)


def _greedy_ref(ref, ids, n, stop_ids):
    ref.reset()
    out, feed = [], list(ids)
    for _ in range(n):
        tok = int(ref.forward(feed).argmax())
        if tok in stop_ids:
            break
        out.append(tok)
        feed = [tok]
    return out


PROMPTS = ["Once upon a time", "The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15", "Hello"]


def _ids_of(llm, text):
    return llm.tokenizer.encode(llm.tokenizer.decode(llm.tokenize(text)))


def test_greedy_alone_matches_reference(llm, engine, ref):
    for text in PROMPTS[:2]:
        ids = llm.tokenize(text)
        req = engine.submit(ids, max_tokens=12, **GREEDY)
        got = "".join(req)
        want = _greedy_ref(ref, ids, 12, llm.tokenizer.stop_ids)
        assert got == llm.tokenizer.decode(want, skip_special=True)
        assert req.completion_tokens == len(want)
        assert req.finish_reason == ("length" if len(want) == 12 else "stop")
        assert req.prompt_tokens == len(ids) and req.ttft_s > 0


def test_concurrent_greedy_equal_solo(llm, engine):
    solo = {}
    for text in PROMPTS:
        solo[text] = "".join(engine.submit(llm.tokenize(text), max_tokens=10, **GREEDY))
    assert len(set(solo.values())) > 1  # the prompts' replies differ: a mix-up would show
    reqs = [(t, engine.submit(llm.tokenize(t), max_tokens=10, **GREEDY)) for t in PROMPTS * 3]
    got = {}
    threads = [
        threading.Thread(target=lambda r=r, i=i: got.__setitem__(i, "".join(r))) for i, (_, r) in enumerate(reqs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [got[i] for i in range(len(reqs))] == [solo[t] for t, _ in reqs]
    m = engine.metrics()
    assert m["batch_rows_total"] > m["steps_total"]  # steps held several rows


def test_long_prompt_is_read_in_chunks(llm, engine, ref):
    ids = llm.tokenize(" ".join(str(i) for i in range(40)))
    assert len(ids) > 3 * engine.prefill_chunk
    steps0 = engine.metrics()["steps_total"]
    req = engine.submit(ids, max_tokens=4, **GREEDY)
    got = "".join(req)
    assert engine.metrics()["steps_total"] - steps0 >= len(ids) // engine.prefill_chunk
    assert got == llm.tokenizer.decode(_greedy_ref(ref, ids, 4, llm.tokenizer.stop_ids), skip_special=True)


def test_stop_string_and_seeded_sampling(llm, engine):
    ids = llm.tokenize(PROMPTS[0])
    full = "".join(engine.submit(ids, max_tokens=12, **GREEDY))
    assert len(full) > 4
    stop = full[3:5]
    req = engine.submit(ids, max_tokens=12, stop=[stop], **GREEDY)
    assert "".join(req) == full[: full.index(stop)] and req.finish_reason == "stop"
    opts = dict(max_tokens=10, temperature=0.9, top_k=20, top_p=0.9, seed=5)
    a, b = ("".join(engine.submit(ids, **opts)) for _ in range(2))
    assert a == b


def test_host_sampler_against_numpy():
    from mltensor.llm.engine import _Options

    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32)
    ctx = [3, 3, 7, 9]
    o = _Options(4, 0.0, 0, 1.0, None, (), 0.5, 0.25, 1.3)
    x = logits.astype(np.float64)
    for t, c in ((3, 2), (7, 1), (9, 1)):
        v = x[t] / 1.3 if x[t] > 0 else x[t] * 1.3
        x[t] = v - c * 0.25 - 0.5
    assert sample(logits, ctx, o, None) == int(np.argmax(x))
    # top-k 1 is greedy; top-p keeps the head: a draw never leaves the top-k
    o = _Options(4, 1.0, 3, 1.0, None, (), 0, 0, 1.0)
    top3 = set(np.argsort(-logits)[:3].tolist())
    draws = {sample(logits, [], o, np.random.default_rng(s)) for s in range(200)}
    assert draws <= top3 and len(draws) > 1
    o = _Options(4, 1.0, 0, 1e-6, None, (), 0, 0, 1.0)
    assert {sample(logits, [], o, np.random.default_rng(s)) for s in range(20)} == {int(np.argmax(logits))}


def test_bad_options_and_limits(llm, engine):
    ids = llm.tokenize("Hi")
    for kw in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 2}, {"presence_penalty": 3}, {"stop": [""]}):
        with pytest.raises(TypeError):
            engine.submit(ids, **kw)
    with pytest.raises(ValueError, match="context"):
        engine.submit(ids, max_tokens=llm.max_context)
    with pytest.raises(ValueError):
        engine.submit([llm.tokenizer.vocab_size], max_tokens=2)
    with pytest.raises(ValueError):
        engine.submit([], max_tokens=2)


def test_queue_full_cancel_and_asyncio(llm):
    e = Engine(llm, slots=1, max_queue=2, prefill_chunk=8)
    try:
        ids = llm.tokenize(PROMPTS[1])
        first = e.submit(ids, max_tokens=100, **GREEDY)
        while e.metrics()["active"] < 1:  # admitted at the next step boundary
            time.sleep(0.001)
        queued = [e.submit(ids, max_tokens=3, **GREEDY) for _ in range(2)]
        with pytest.raises(QueueFull) as info:
            e.submit(ids, max_tokens=3, **GREEDY)
        assert info.value.retry_after > 0
        first.cancel()
        assert first.wait(60) and first.finish_reason == "cancelled"

        async def consume(r):
            return "".join([p async for p in r])

        texts = [asyncio.run(consume(r)) for r in queued]
        assert texts[0] == texts[1] and queued[0].finish_reason in ("stop", "length")
    finally:
        e.shutdown(cancel=True)
    with pytest.raises(EngineClosed):
        e.submit(ids, max_tokens=2)


def test_error_ends_one_request_only(llm, monkeypatch):
    import mltensor.llm.engine as engine_module

    real = engine_module.sample

    def faulty(logits, context, o, rng):  # a bug that hits one request (the one seeded 666)
        if o.seed == 666:
            raise KeyError("boom")
        return real(logits, context, o, rng)

    monkeypatch.setattr(engine_module, "sample", faulty)
    e = Engine(llm, slots=2, prefill_chunk=8)
    try:
        ids = llm.tokenize(PROMPTS[0])
        want = "".join(e.submit(ids, max_tokens=8, **GREEDY))
        bad = e.submit(ids, max_tokens=8, seed=666, **GREEDY)
        good = e.submit(ids, max_tokens=8, **GREEDY)
        with pytest.raises(mltensor.errors.InternalError, match="internal error in mltensor"):
            list(bad)
        assert bad.finish_reason == "error" and isinstance(bad.error.__cause__, KeyError)
        assert "".join(good) == want and good.finish_reason in ("stop", "length")
    finally:
        e.shutdown()


def test_shutdown_finishes_running_requests(llm):
    e = Engine(llm, slots=2, prefill_chunk=8)
    ids = llm.tokenize(PROMPTS[2])
    reqs = [e.submit(ids, max_tokens=6, **GREEDY) for _ in range(3)]
    e.shutdown()
    assert all(r.done and r.finish_reason in ("stop", "length") for r in reqs)
    assert len({"".join(r) for r in reqs}) == 1


def test_a_row_does_not_depend_on_its_batch(llm):
    """The serving step's logits of one sequence are bitwise the same alone, beside a few rows,
    and beside many (prompts and decode rows): what makes batched greedy replies equal solo ones.
    The synthetic file mixes Q4_0, Q4_1, Q8_0 and F16 projections."""
    batch = LlamaBatch(llm.model, 6, rows=256)
    ids = llm.tokenize(PROMPTS[0])
    others = [(s, 0, llm.tokenize(PROMPTS[s % 4] + " and more")) for s in range(1, 6)]
    alone = batch.run([(0, 0, ids)])[0]
    for k in (1, 2, 5):
        got = batch.run([(0, 0, ids)] + others[:k])[0]
        assert np.array_equal(got, alone), k
    t = int(alone.argmax())
    alone = batch.run([(0, len(ids), [t])])[0]
    for k in (1, 3, 5):
        got = batch.run([(0, len(ids), [t])] + [(s, len(o), [3]) for s, _, o in others[:k]])[0]
        assert np.array_equal(got, alone), k


def test_a_prompt_that_extends_a_finished_one_reuses_its_cache(llm, ref):
    """A chat resent with one more message: the slot that holds its start computes only the
    rest (cached_tokens), and the reply is the reference's (as if computed from scratch)."""
    e = Engine(llm, slots=2, prefill_chunk=8)
    try:
        first = llm.tokenize(PROMPTS[1])
        r1 = e.submit(first, max_tokens=6, **GREEDY)
        reply = "".join(r1)
        assert r1.cached_tokens == 0
        ids = first + llm.tokenizer.encode(reply, add_bos=False) + llm.tokenizer.encode(" And then", add_bos=False)
        r2 = e.submit(ids, max_tokens=6, **GREEDY)
        got = "".join(r2)
        assert r2.cached_tokens >= len(first)
        assert got == llm.tokenizer.decode(_greedy_ref(ref, ids, 6, llm.tokenizer.stop_ids), skip_special=True)
        other = e.submit(llm.tokenize("Zebra"), max_tokens=2, **GREEDY)
        list(other)
        assert other.cached_tokens <= 1
    finally:
        e.shutdown()


def test_a_bug_in_the_step_ends_its_requests_and_the_engine_goes_on(llm, monkeypatch):
    """An exception the step itself raises (not one request's) ends the running requests with an
    InternalError instead of killing the step thread (which would leave every caller waiting);
    the next requests are served."""
    e = Engine(llm, slots=2, prefill_chunk=8)
    try:
        ids = llm.tokenize(PROMPTS[0])
        want = "".join(e.submit(ids, max_tokens=6, **GREEDY))
        real = Engine.__dict__["_entry"]
        monkeypatch.setattr(Engine, "_entry", staticmethod(lambda a, toks: 1 / 0))
        r = e.submit(ids, max_tokens=6, **GREEDY)
        with pytest.raises(mltensor.errors.InternalError):
            list(r)
        assert r.finish_reason == "error"
        monkeypatch.setattr(Engine, "_entry", real)
        assert "".join(e.submit(ids, max_tokens=6, **GREEDY)) == want
        assert e.metrics()["active"] == 0
    finally:
        e.shutdown()
