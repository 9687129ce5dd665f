"""mltensor serve on Ray Serve: the same OpenAI routes (create_app's FastAPI app as the deployment's
ingress) behind Ray Serve's HTTP proxy, one replica per GPU, each with its own models and engines.
Needs the ray and serve extras: pip install 'mltensor[ray,serve]'.

    serve run mltensor.serve.ray:build_app models=smollm2-135m-instruct          # this machine
    serve run mltensor.serve.ray:build_app models=chat=/models/m.gguf num_gpus=1 num_replicas=4
    RAY_ADDRESS=ray://head:10001 serve run mltensor.serve.ray:build_app models=...  # a cluster

or from Python:

    from ray import serve
    from mltensor.serve.ray import build_app
    serve.run(build_app({"models": "tiny=/m/tiny.gguf", "num_gpus": 0, "num_replicas": 2}))

`build_app(args)` takes the keys of `serve run`'s `key=value` arguments: models (comma-separated
[NAME=]MODEL: GGUF paths, which every node must see, or registry names), embeddings (the same for
ONNX embedding models), num_gpus (per replica, default 1; 0 runs on the CPU adapter), num_replicas
(default: one per GPU of the cluster, or 1 without GPUs), slots, max_queue, max_context,
prefill_chunk, api_key. Ray hides the other GPUs from CUDA only, so each replica opens the adapter
Ray assigned to it by index (mltensor/apps/batch.py, context_for_ray_gpu). Ray Serve balances the
requests over the replicas; each replica batches its own.
"""

import os

from ..apps.batch import context_for_ray_gpu
from ..front.context import ml
from ..llm.api import LLM
from ..llm.engine import Engine
from .app import ServedModel, create_app
from .embeddings import Embedder

#: build_app's keys and their defaults
DEFAULTS = {
    "models": "smollm2-135m-instruct",
    "embeddings": "",
    "num_gpus": 1.0,
    "num_replicas": None,
    "slots": 8,
    "max_queue": 64,
    "max_context": 2048,
    "prefill_chunk": 64,
    "api_key": None,
    "name": "mltensor",
}

_REPLICA = {}  # the app of this replica's process (one replica per Ray actor process)


def _specs(text):
    """'a=x.gguf,b' -> [("a", "x.gguf"), ("b", "b")] (the name of a path: its file stem)."""
    out = []
    for spec in filter(None, (s.strip() for s in str(text or "").split(","))):
        name, eq, src = spec.partition("=")
        if not eq:
            src, name = spec, os.path.splitext(os.path.basename(spec))[0]
        out.append((name, src))
    return out


class Replica:
    """One replica: its MLContext (on the GPU Ray gave it), the models and their engines, and the
    app that serves them."""

    def __init__(self, models, embeddings, options):
        ctx = context_for_ray_gpu("mltensor-serve") or ml.create_context_sync(power_preference="high-performance")
        served = {}
        for name, src in models:
            llm = LLM(src, ctx, max_context=options["max_context"])
            engine = Engine(
                llm, slots=options["slots"], max_queue=options["max_queue"], prefill_chunk=options["prefill_chunk"]
            )
            served[name] = ServedModel(llm, engine)
        embedders = {name: Embedder(src, context=ctx) for name, src in embeddings}
        _REPLICA["app"] = create_app(served, embedders, api_key=options["api_key"])


def _replica_app():
    """The ASGI app Ray Serve wraps (called in the replica after Replica.__init__ built it)."""
    return _REPLICA["app"]


def build_app(args=None):
    """A Ray Serve application (bind()) of the OpenAI routes; `args`: see the module docstring."""
    from ray import serve  # the ray extra

    o = dict(DEFAULTS)
    unknown = set(args or {}) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"[serve.ray] unknown arguments {sorted(unknown)} (known: {', '.join(DEFAULTS)})")
    o.update(args or {})
    models, embeddings = _specs(o["models"]), _specs(o["embeddings"])
    if not models and not embeddings:
        raise ValueError("[serve.ray] no models: pass models=[NAME=]MODEL,... and/or embeddings=...")
    num_gpus = float(o["num_gpus"])
    replicas = o["num_replicas"]
    if replicas is None:
        replicas = _gpus_in_cluster(num_gpus)
    options = {k: int(o[k]) for k in ("slots", "max_queue", "max_context", "prefill_chunk")}
    options["api_key"] = o["api_key"]
    ingress = serve.ingress(_replica_app)(Replica)
    deployment = serve.deployment(
        ingress,
        name=str(o["name"]),
        num_replicas=int(replicas),
        ray_actor_options={"num_gpus": num_gpus, "num_cpus": 1},
        max_ongoing_requests=max(options["slots"] + options["max_queue"], 1),
    )
    return deployment.bind(models, embeddings, options)


def _gpus_in_cluster(per_replica):
    """One replica per GPU of the running cluster (1 without GPUs or with num_gpus=0)."""
    if per_replica <= 0:
        return 1
    import ray

    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    return max(1, int(gpus / per_replica))
