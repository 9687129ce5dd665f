"""mltensor.serve.ray (issue 44, point 4): the OpenAI routes on a local Ray Serve with 2 replicas
(num_gpus=0: the CPU adapter) behind Ray's HTTP proxy, whose greedy answers equal one process's
(LLM.generate). Ray runs in a child process (its start-up and workers stay out of pytest's)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
pytest.importorskip("prometheus_client")
if not importlib.util.find_spec("ray") or not importlib.util.find_spec("ray.serve"):
    pytest.skip("needs Ray Serve (the ray extra)", allow_module_level=True)

import mltensor  # noqa: E402
from mltensor.llm import LLM  # noqa: E402

from serve_helpers import GREEDY, ROOT, tiny_gguf  # noqa: E402

PROMPTS = ["hello there", "the 12 the", "naive cats", "a b c d", "once upon", "zz top", "42 is", "what now"]

CHILD = """
import concurrent.futures as cf, json, socket, sys
import openai, ray
from ray import serve
from mltensor.serve.ray import build_app

path, prompts = sys.argv[1], json.loads(sys.argv[2])
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
serve.start(http_options={"host": "127.0.0.1", "port": port})
serve.run(build_app({"models": f"tiny={path}", "num_gpus": 0, "num_replicas": 2, "max_context": 160, "slots": 4}),
          name="mltensor", route_prefix="/")
status = serve.status().applications["mltensor"].deployments["mltensor"]
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)

def one(p):
    return client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0).choices[0].text

with cf.ThreadPoolExecutor(8) as ex:
    texts = list(ex.map(one, prompts * 2))
chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompts[0]}],
                                             max_tokens=8, temperature=0, stream=True))
chat = "".join(c.choices[0].delta.content or "" for c in chunks)
try:
    client.completions.create(model="nope", prompt="x")
    err = None
except openai.APIStatusError as e:
    err = [e.status_code, e.code]
print("RESULT " + json.dumps({"replicas": {str(k): v for k, v in status.replica_states.items()},
                              "texts": texts, "chat": chat, "finish": chunks[-1].choices[0].finish_reason,
                              "error": err}))
serve.shutdown()
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_serve_two_replicas_answer_as_one_process(tmp_path):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    r = subprocess.run(
        [sys.executable, "-c", CHILD, path, json.dumps(PROMPTS)],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, RAY_USAGE_STATS_ENABLED="0"),
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout[-2000:], r.stderr[-4000:])
    got = json.loads(lines[-1][len("RESULT ") :])
    assert list(got["replicas"].values()) == [2] and "RUNNING" in next(iter(got["replicas"])), got["replicas"]
    llm = LLM(path, mltensor.ml.create_context_sync(), max_context=160)
    want = [llm.generate(p, max_tokens=12, **GREEDY) for p in PROMPTS * 2]
    assert got["texts"] == want
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    assert got["chat"] == llm.chat(msgs, max_tokens=8, **GREEDY) and got["finish"] in ("stop", "length")
    assert got["error"] == [404, "model_not_found"]
