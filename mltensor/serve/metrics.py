"""GET /metrics: Prometheus' text format (prometheus_client, one registry per app).

Counted by the server: HTTP requests by route and status; per model, the time to first token,
the time per output token after the first and the request's duration (histograms), embeddings
inputs. Read from each engine at scrape time (Engine.metrics()): queue depth, active requests,
slots, requests, prompt and generated tokens, decode steps, the rows those steps decoded, and the
batch occupancy (mean rows per step, over slots).
"""

import threading

#: seconds; from a few ms (a GPU's token) to a minute (a long prompt on a software adapter)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Engine.metrics() keys: (metric name, kind, help)
ENGINE_METRICS = {
    "queue_depth": ("mltensor_queue_depth", "gauge", "requests waiting for a slot"),
    "active": ("mltensor_active_requests", "gauge", "requests holding a slot"),
    "slots": ("mltensor_slots", "gauge", "sequences one decode step can hold"),
    "requests_total": ("mltensor_engine_requests", "counter", "requests submitted to the engine"),
    "requests_finished_total": ("mltensor_engine_requests_finished", "counter", "requests the engine finished"),
    "prompt_tokens_total": ("mltensor_prompt_tokens", "counter", "prompt tokens read"),
    "generated_tokens_total": ("mltensor_generated_tokens", "counter", "tokens generated"),
    "steps_total": ("mltensor_decode_steps", "counter", "batched decode steps run"),
    "batch_rows_total": ("mltensor_batch_rows", "counter", "rows (prompt and generated tokens) of all steps"),
    "decode_rows_total": ("mltensor_decode_rows", "counter", "rows that sampled a token, summed over the steps"),
}


def token_intervals(token_times):
    """Seconds between consecutive tokens, from the engine's per-token clock readings."""
    t = [float(x) for x in token_times or ()]
    return [b - a for a, b in zip(t, t[1:]) if b >= a]


class Metrics:
    """The server's Prometheus registry. `engines`: {model name: Engine}."""

    def __init__(self, engines):
        from prometheus_client import CollectorRegistry, Counter, Histogram  # the serve extra

        self.engines = engines
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mltensor_http_requests", "HTTP requests answered, by route and status", ["route", "status"], registry=r
        )
        self.ttft = Histogram(
            "mltensor_time_to_first_token_seconds",
            "time from the request's arrival in the engine to its first token",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "mltensor_time_per_output_token_seconds",
            "time between consecutive tokens of a request",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "mltensor_request_duration_seconds",
            "time a completion request took, by model and finish reason",
            ["model", "finish_reason"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.embedded = Counter("mltensor_embedding_inputs", "texts embedded", ["model"], registry=r)
        r.register(_EngineCollector(engines))
        self._lock = threading.Lock()

    def request(self, route, status):
        self.requests.labels(route, str(status)).inc()

    def finished(self, model, req, seconds):
        """Record a finished engine request's latencies."""
        if req.ttft_s is not None:
            self.ttft.labels(model).observe(req.ttft_s)
        for dt in token_intervals(getattr(req, "token_times", None)):
            self.tpot.labels(model).observe(dt)
        self.duration.labels(model, req.finish_reason or "unknown").observe(seconds)

    def render(self):
        """(body bytes, content type) of the exposition."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EngineCollector:
    """Each engine's metrics() at scrape time, labelled by model."""

    def __init__(self, engines):
        self.engines = engines

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fams = {}
        for key, (name, kind, doc) in ENGINE_METRICS.items():
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fams[key] = cls(name, doc, labels=["model"])
        occ = GaugeMetricFamily(
            "mltensor_batch_occupancy",
            "mean sampling rows per step over the slots (decode_rows / decode_steps / slots)",
            labels=["model"],
        )
        for model, engine in self.engines.items():
            m = engine.metrics()
            for key, fam in fams.items():
                if key in m:
                    fam.add_metric([model], float(m[key]))
            steps, slots = m.get("steps_total", 0), m.get("slots", 0)
            rows = m.get("decode_rows_total", m.get("batch_rows_total", 0))
            occ.add_metric([model], rows / steps / slots if steps and slots else 0.0)
        yield from fams.values()
        yield occ
