"""mltensor.serve: an OpenAI-compatible HTTP server (`mltensor serve`, `python -m mltensor.serve`)
for GGUF language models, whose concurrent requests share decode steps (mltensor.llm.engine's
continuous batching), and ONNX sentence-embedding models; `mltensor.serve.ray` deploys the same
routes on Ray Serve, one replica per GPU.

- protocol.py: the OpenAI wire format: request checks (APIError: OpenAI's error body), responses
  and stream chunks;
- app.py: the FastAPI app (`create_app`): routes, streaming, errors, disconnects, shutdown;
- embeddings.py: `Embedder`, an ONNX encoder with mean pooling and normalisation;
- metrics.py: the Prometheus registry of GET /metrics;
- cli.py: the console entry; ray.py: the Ray Serve deployment.

Needs the serve extra (pip install 'mltensor[serve]': FastAPI, uvicorn, sse-starlette,
prometheus_client, and the llm extra's packages); importing this package does not.
"""

from .app import ServedModel, create_app
from .embeddings import Embedder
from .protocol import APIError

__all__ = ["APIError", "Embedder", "ServedModel", "create_app"]
