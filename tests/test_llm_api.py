"""The Python API of mltensor.llm (mltensor/llm/api.py): LLM.generate / chat / stream / stop /
seeds / token ids, Conversation's cache kept between turns, two threads on one LLM; greedy ids
against the independent numpy Llama (tests/llm_reference.py) on the small synthetic GGUF file
with a tokenizer that tests/test_llm.py uses."""

import threading

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from helpers import in_threads  # noqa: E402
import mltensor  # noqa: E402
from mltensor.llm import DEFAULTS, LLM  # noqa: E402

from llm_reference import NumpyLlama, write_synthetic  # noqa: E402

GREEDY = {"temperature": 0, "repeat_penalty": 1}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_synthetic(
        str(tmp_path_factory.mktemp("llmapi") / "tok.gguf"), tokenizer=True, hidden=64, heads=4, kv_heads=2, seed=11
    )


@pytest.fixture(scope="module")
def llm(path):
    return LLM(path, mltensor.ml.create_context_sync(), max_context=160)


@pytest.fixture(scope="module")
def ref(path):
    return NumpyLlama(path)


def _greedy_ref(ref, ids, n, stop_ids, penalty=1.0, last_n=64):
    """numpy's greedy continuation of `ids` (llama.cpp's repeat penalty over the last ids)."""
    ref.reset()
    ctx, out, feed = list(ids), [], list(ids)
    for _ in range(n):
        logits = ref.forward(feed).copy()
        if penalty != 1.0:
            for t in set(ctx[-last_n:]):
                logits[t] = logits[t] / penalty if logits[t] > 0 else logits[t] * penalty
        tok = int(logits.argmax())
        if tok in stop_ids:
            break
        out.append(tok)
        ctx.append(tok)
        feed = [tok]
    return out


def test_defaults_are_llama_cpp():
    assert DEFAULTS == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "repeat_penalty": 1.1}


def test_generate_greedy_matches_reference(llm, ref):
    t = llm.tokenizer
    for prompt in ("hello there", "the 12 the"):
        ids = llm.tokenize(prompt)
        want = _greedy_ref(ref, ids, 12, t.stop_ids)
        got = llm.generate(prompt, max_tokens=12, return_ids=True, **GREEDY)
        assert got == want, prompt
        # a list of ids in, the same continuation; the text is the ids' text
        assert llm.generate(ids, max_tokens=12, **GREEDY) == llm.detokenize(want, skip_special=True)
        assert llm.stats["generated_tokens"] == len(want)
        assert llm.stats["stop_reason"] == ("stop" if len(want) < 12 else "length")
    # the repeat penalty on the GPU as llama.cpp applies it (greedy over the penalized logits)
    ids = llm.tokenize("the the the")
    want = _greedy_ref(ref, ids, 10, t.stop_ids, penalty=1.7)
    assert llm.generate(ids, max_tokens=10, temperature=0, repeat_penalty=1.7, return_ids=True) == want


def test_tokenize_round_trip(llm):
    for s in ("", "hello there", "naïve 日本 🤗\n", "<|im_start|>hi<|im_end|>"):
        ids = llm.tokenize(s)
        assert all(isinstance(i, int) for i in ids)
        assert llm.detokenize(ids) == s
    assert llm.detokenize(llm.tokenize("<|im_start|>hi<|im_end|>"), skip_special=True) == "hi"
    with pytest.raises(ValueError, match="token ids"):
        llm.detokenize([10**6])
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([-1, 3])


def test_stream_seed_and_stop(llm):
    a = llm.generate("hello there", max_tokens=16, seed=3)
    pieces = list(llm.generate("hello there", max_tokens=16, seed=3, stream=True))
    assert "".join(pieces) == a and len(pieces) > 1  # reproducible, streamed in pieces
    draws = {llm.generate("hello there", max_tokens=16, seed=s) for s in range(4)}
    assert len(draws) > 1  # the seed matters (sampling at llama.cpp's defaults)
    ids = llm.generate("hello there", max_tokens=16, seed=3, return_ids=True)
    assert list(llm.generate("hello there", max_tokens=16, seed=3, stream=True, return_ids=True)) == ids
    # stop strings: the text ends before the first one, streamed or not
    full = llm.generate("the 12", max_tokens=24, **GREEDY)
    assert len(full) >= 6, full
    stop = full[3:5]
    cut = full[: full.find(stop)]
    assert llm.generate("the 12", max_tokens=24, stop=[stop, "\x00never"], **GREEDY) == cut
    assert "".join(llm.generate("the 12", max_tokens=24, stop=stop, stream=True, **GREEDY)) == cut
    assert llm.stats["stop_reason"] == "stop"


def test_chat_matches_reference(llm, ref):
    t = llm.tokenizer
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    ids = t.encode_chat(t.apply_chat_template(msgs))
    want = t.decode(_greedy_ref(ref, ids, 10, t.stop_ids), skip_special=True)
    assert llm.chat(msgs, max_tokens=10, **GREEDY) == want
    assert "".join(llm.chat(msgs, max_tokens=10, stream=True, **GREEDY)) == want
    # the same conversation again: its prompt comes from the cache, one token fed for the logits
    assert llm.stats["cached_tokens"] == len(ids) - 1 and llm.stats["prefill_tokens"] == 1


def test_conversation_keeps_its_cache(llm, ref):
    t = llm.tokenizer
    conv = llm.conversation(system="S", max_tokens=6, **GREEDY)
    first = conv.say("hello there")
    n1 = llm.stats["prompt_tokens"]
    assert llm.stats["prefill_tokens"] == n1 and llm.stats["cached_tokens"] == 0
    # what reaches the model, counted at the session: host arrays of ids (prompts), GPU tensors
    # (the sampled ids fed back, one each)
    session, fed = conv._cache.session, []
    feed = session.feed
    session.feed = lambda ids: fed.append(len(ids) if isinstance(ids, np.ndarray) else 1) or feed(ids)
    second = conv.say("the 12")
    s = llm.stats
    assert fed[0] == s["prefill_tokens"] and sum(fed) == s["prefill_tokens"] + s["generated_tokens"] - 1
    # the second turn feeds only what the cache lacks: not the first turn's prompt again
    assert s["cached_tokens"] >= n1 and s["prefill_tokens"] == s["prompt_tokens"] - s["cached_tokens"]
    assert s["prefill_tokens"] < s["prompt_tokens"] - n1 + 1
    assert conv.messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "the 12"},
        {"role": "assistant", "content": second},
    ]
    # the reply equals the numpy model's over the whole conversation, fed from scratch
    ids = t.encode_chat(t.apply_chat_template(conv.messages[:-1]))
    assert second == t.decode(_greedy_ref(ref, ids, 6, t.stop_ids), skip_special=True)
    # a stream closed early (as Ctrl-C in mltensor-chat): the partial reply stays, the next turn works
    stream = conv.say("hello again", stream=True, max_tokens=12)
    got = next(stream)
    stream.close()
    assert conv.messages[-1] == {"role": "assistant", "content": got}
    third = conv.say("bye")
    ids = t.encode_chat(t.apply_chat_template(conv.messages[:-1]))
    assert third == t.decode(_greedy_ref(ref, ids, 6, t.stop_ids), skip_special=True)
    conv.reset()
    assert conv.messages == [{"role": "system", "content": "S"}]


def test_two_threads_on_one_llm(llm):
    prompts = ["hello there", "the 12", "12 he", "the the"]
    want = {p: llm.generate(p, max_tokens=8, return_ids=True, **GREEDY) for p in prompts}
    got = {}

    def work(p):
        for _ in range(2):
            r = llm.generate(p, max_tokens=8, return_ids=True, **GREEDY)
            assert got.setdefault(p, r) == r

    in_threads(work, [(p,) for p in prompts])  # (a thread's exception or assertion re-raised here)
    assert got == want
    # in one thread, a second call while a stream is open: an error, not a deadlock
    s = llm.generate("hello there", max_tokens=8, stream=True, **GREEDY)
    next(s)
    with pytest.raises(RuntimeError, match="still open"):
        llm.generate("x", max_tokens=2)
    s.close()
    assert llm.generate("x", max_tokens=2, **GREEDY) is not None


def test_errors(llm, tmp_path):
    with pytest.raises(TypeError, match="max_tokens"):
        llm.generate("x", max_tokens=0)
    with pytest.raises(TypeError, match="top_p"):
        llm.generate("x", top_p=0)
    with pytest.raises(TypeError, match="repeat_penalty"):
        llm.generate("x", repeat_penalty=0)
    with pytest.raises(TypeError, match="unknown options"):
        llm.generate("x", temprature=0)
    with pytest.raises(TypeError, match="stop"):
        llm.generate("x", stop=[""])
    with pytest.raises(ValueError, match="does not fit"):
        llm.generate(list(np.arange(200) % 250))
    with pytest.raises(TypeError, match="role"):
        llm.chat([{"content": "x"}])
    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct"):
        LLM(str(tmp_path / "none.gguf"))


def test_chat_cli_ctrl_c_keeps_the_conversation(path):
    """mltensor-chat over the API: Ctrl-C during a reply (here: raised by the first write of a
    piece) stops that reply; the next message continues the same conversation."""
    import io

    from mltensor.apps import chat

    class Interrupting(io.StringIO):
        def __init__(self):
            super().__init__()
            self.armed = True

        def write(self, text):
            if self.armed and text.strip():
                self.armed = False
                raise KeyboardInterrupt
            return super().write(text)

    out, err = Interrupting(), io.StringIO()
    args = ["--model", path, "--max-tokens", "5", "--max-context", "160", "--temperature", "0", "--repeat-penalty", "1"]
    rc = chat.main(args, stdin=io.StringIO("hello there\nthe 12\n"), stdout=out, stderr=err)
    assert rc == 0, err.getvalue()
    assert "[interrupted]" in err.getvalue()
    stats = [line for line in err.getvalue().splitlines() if line.startswith("[prompt tokens")]
    assert len(stats) == 2 and "cached tokens" in stats[1]  # the second turn reused the first's cache
    # the same through the API: a stream closed after its first piece, then the next message
    llm = LLM(path, max_context=160)
    conv = llm.conversation(max_tokens=5, **GREEDY)
    stream = conv.say("hello there", stream=True)
    next(stream)
    stream.close()
    assert out.getvalue().split("\n")[1] == conv.say("the 12")


# -- the real SmolLM2-135M-Instruct ----------------------------------------------------------------


def _longest_repeat(ids):
    """The most times one 6-token run occurs in `ids` (a reply that loops repeats one many times)."""
    runs = [tuple(ids[i : i + 6]) for i in range(len(ids) - 5)]
    return max((runs.count(r) for r in set(runs)), default=0)


@pytest.mark.slow
def test_smollm2_api():
    llm = LLM("smollm2-135m-instruct", max_context=512)
    q = [{"role": "user", "content": "What is the capital of France?"}]
    assert "Paris" in llm.chat(q, max_tokens=24, **GREEDY)
    assert llm.stats["prompt_tokens"] == 37 and llm.stats["template"] == "file"
    # llama.cpp's default sampling does not loop on a small model, seed after seed
    story = [{"role": "user", "content": "Tell me a long story about a robot."}]
    for seed in (0, 1):
        ids = llm.tokenize(llm.chat(story, max_tokens=128, seed=seed))
        assert _longest_repeat(ids) <= 2, llm.detokenize(ids)


@pytest.mark.slow
def test_smollm2_chat_cli_sigint():
    """A real Ctrl-C (SIGINT) during a reply of mltensor-chat: the reply stops, the next message
    is answered in the same conversation (its cache reused), the exit status is 0."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [
        sys.executable,
        "-m",
        "mltensor.apps.chat",
        "--max-context",
        "512",
        "--max-tokens",
        "60",
        "--temperature",
        "0",
    ]
    p = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, cwd=root
    )
    out = []
    reader = threading.Thread(target=lambda: out.extend(iter(lambda: p.stdout.read(1), "")), daemon=True)
    reader.start()
    try:
        p.stdin.write("Tell me a long story about a robot.\n")
        p.stdin.flush()
        t0 = time.time()
        while len("".join(out)) < 12 and time.time() - t0 < 300:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        p.stdin.write("What is the capital of France?\n")
        p.stdin.close()
        assert p.wait(300) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    reader.join(10)
    err = p.stderr.read()
    second = "".join(out).split("\n")[1]
    assert "[interrupted]" in err and "Paris" in second, (out, err)
    assert "cached tokens" in [line for line in err.splitlines() if line.startswith("[prompt tokens")][1]
