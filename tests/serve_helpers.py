"""What the serving tests (tests/test_serve*.py) and bench/test_bench_serve.py share: a tiny GGUF
model, an app served by uvicorn on 127.0.0.1 in a thread of this process (`ThreadServer`), the
`openai` client on it, and `mltensor serve` in a child process (`ChildServer`)."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GREEDY = {"temperature": 0, "repeat_penalty": 1}


def tiny_gguf(path, seed=11):
    """A random Llama GGUF file with a byte-level tokenizer and chat template (hidden 64)."""
    from llm_reference import write_synthetic

    return write_synthetic(str(path), tokenizer=True, hidden=64, heads=4, kv_heads=2, seed=seed)


class ThreadServer:
    """`app` served by uvicorn on 127.0.0.1 (a free port) in a daemon thread; `url` once entered.
    Leaving stops it (uvicorn's shutdown: the app's lifespan ends, its engines shut down)."""

    def __init__(self, app, grace=5.0):
        import uvicorn

        self.sock = socket.create_server(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cfg = uvicorn.Config(app, log_level="error", timeout_graceful_shutdown=grace, lifespan="on")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > 60:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()

    def client(self, api_key="none", **kw):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)


class ChildServer:
    """`python -m mltensor.serve ARGS --port 0` (or another `module`) in a child process (this tree's mltensor); `url`
    from its 'listening on' line. `stop(sig)` sends a signal and waits for the exit status."""

    def __init__(self, *args, env=None, module=("mltensor.serve",)):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *module, *map(str, args), "--port", "0"],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines = []
        self.url = None
        t0 = time.monotonic()
        while self.url is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"the server exited ({self.proc.wait()}): {''.join(self.lines)[-3000:]}")
            self.lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
            if time.monotonic() - t0 > 120:
                raise RuntimeError("the server did not start")
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()

    def _read_rest(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def client(self, api_key="none", **kw):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Answer:
    """An HTTP answer: status_code, headers (lower-case names), text, json()."""

    def __init__(self, status, headers, body):
        self.status_code, self.headers, self.text = status, {k.lower(): v for k, v in headers}, body

    def json(self):
        return json.loads(self.text)


def request(method, url, body=b"", headers=None, timeout=60):
    """One raw HTTP request (http.client: any method, any bytes, any headers)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=body, headers=headers or {})
        r = conn.getresponse()
        return Answer(r.status, r.getheaders(), r.read().decode("utf-8", "replace"))
    finally:
        conn.close()


def get(url, **kw):
    return request("GET", url, **kw)


def post(url, body=None, *, raw=None, headers=None, timeout=60):
    data = raw if raw is not None else json.dumps(body).encode()
    return request("POST", url, data, headers or {"content-type": "application/json"}, timeout)
