"""`mltensor serve` as a process (issue 44): started from the command line on 127.0.0.1 and a free
port, answering the openai client; SIGTERM / SIGINT shut it down gracefully: a running stream
finishes within --shutdown-timeout (or, past it, ends with an error event), the process exits 0."""

import signal
import threading
import time

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("sse_starlette")
pytest.importorskip("prometheus_client")

from serve_helpers import ChildServer, get, tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("cli") / "tiny.gguf")


def _stream_in_thread(client, out, **kw):
    def run():
        try:
            for c in client.completions.create(model="tiny", stream=True, **kw):
                out.setdefault("chunks", []).append(c)
        except Exception as e:  # noqa: BLE001 - what the client saw is the finding
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t


def _first_chunk(out, timeout=60):
    t0 = time.monotonic()
    while not out.get("chunks") and "error" not in out:
        assert time.monotonic() - t0 < timeout, "no chunk came"
        time.sleep(0.002)


@pytest.mark.timeout(300)
def test_serve_answers_then_finishes_its_streams_on_sigterm(path):
    with ChildServer("--model", f"tiny={path}", "--max-context", 256, "--shutdown-timeout", 60) as s:
        assert s.url.startswith("http://127.0.0.1:")
        client = s.client()
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens >= 1
        out = {}
        t = _stream_in_thread(client, out, prompt="hello", max_tokens=240, temperature=0)
        _first_chunk(out)
        assert s.stop(signal.SIGTERM) == 0  # waits for the stream: it is within the grace
        t.join(60)
        assert "error" not in out, out.get("error")
        assert out["chunks"][-1].choices[0].finish_reason in ("length", "stop")
        assert "Traceback" not in "".join(s.lines), "".join(s.lines)[-3000:]


@pytest.mark.timeout(300)
def test_serve_cancels_streams_past_the_grace(path):
    with ChildServer(
        "serve",
        "--model",
        f"tiny={path}",
        "--max-context",
        256,
        "--shutdown-timeout",
        0,
        module=("mltensor.apps.command",),
    ) as s:
        client = s.client()
        out = {}
        t = _stream_in_thread(client, out, prompt="hello", max_tokens=240, temperature=0)
        _first_chunk(out)
        t0 = time.monotonic()
        assert s.stop(signal.SIGINT) == 0
        assert time.monotonic() - t0 < 30
        t.join(60)
        assert not t.is_alive()
        # the stream ended early: an error event naming the shutdown, or (when the whole reply was
        # out before the signal) its last chunk
        if "error" in out:
            assert isinstance(out["error"], openai.APIError) and "shutting down" in str(out["error"]), out["error"]
        else:
            assert out["chunks"][-1].choices[0].finish_reason is not None
        assert "Traceback" not in "".join(s.lines), "".join(s.lines)[-3000:]


@pytest.mark.timeout(300)
def test_serve_two_models_and_an_api_key_from_the_environment(path):
    args = ["--model", f"chat={path}", "--model", path, "--max-context", 64]  # the second named by its stem
    with ChildServer(*args, env={"MLTENSOR_API_KEY": "k3y"}) as s:
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        assert sorted(m.id for m in s.client(api_key="k3y").models.list().data) == ["chat", "tiny"]
        assert get(s.url + "/health").status_code == 200
        assert s.stop() == 0
