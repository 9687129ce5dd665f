"""Issue 26, quantized models: what 4-bit weights (com.microsoft MatMulNBits, packed on the GPU)
and dynamic int8 (MatMulInteger) buy against the float models they were made from.

- int4 decode step: one token after a past of 64 through InferenceSession, on a Llama-style
  decoder in onnxruntime-genai's int4 form (tests/test_onnx_llm_decoder.py's builder: hidden
  1024, 16 heads / 4 KV heads, MLP 2816, 2 layers, vocabulary 8192, tied int4 embeddings)
  against the float32 model it was quantized from (same graph, MatMul weights), GPU tensors in
  and out, timed alternately round by round (timing.measure_pair); onnxruntime CPU on both in
  the same run (the int4 model as genai exports it for CPU, accuracy_level=4). Target: the
  int4 step no slower than the float one (weights dominate a step).
- constant bytes: each model in its own context, ctx.counters["constant_bytes"] and
  graph.memory after a step. Target: int4 <= 0.2x float32.
- dynamic int8: a BERT-like encoder (hidden 384, 2 layers, seq 128) quantized by
  onnxruntime.quantization.quantize_dynamic against its float model, ours and onnxruntime CPU
  on both in the same run.
Each timed pair also checks its results against onnxruntime (no timed assertions).
"""

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from mltensor import InferenceSession, ml

from .timing import adapter_name, measure_pair, record

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_onnx_integer import _bert  # noqa: E402
from helpers import without_accuracy_level  # noqa: E402
from test_onnx_llm_decoder import Config, float_decoder, quantize_decoder  # noqa: E402

ort = pytest.importorskip("onnxruntime")

CFG = Config(layers=2, hidden=1024, heads=16, kv_heads=4, inter=2816, vocab=8192, max_pos=256)
PAST = 64


def _rel(got, want):
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


class _Model:
    """A model's session in its own context (so the context's constant bytes are its own), GPU
    feeds for one decode step, and onnxruntime CPU on the same model."""

    def __init__(self, model, feeds):
        self.ctx = ml.create_context_sync(power_preference="high-performance")
        self.sess = InferenceSession(model, self.ctx)
        # the reference computes MatMulNBits in f32 (without_accuracy_level()), as we do; the
        # timed onnxruntime runs the model as exported (int4: accuracy_level=4, A quantized to
        # int8, genai's CPU setting)
        self.ref = ort.InferenceSession(
            without_accuracy_level(model).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        self.timed = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        self.feeds = feeds
        self.ops = {n.op_type for n in model.graph.node}
        self.weight_bytes = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
        self.host = self.sess.run(None, feeds)  # builds; the result checked against onnxruntime
        self.gpu = {}
        for name, a in feeds.items():
            t = self.ctx.create_tensor_sync(
                data_type="int64" if a.dtype == np.int64 else "float32", shape=a.shape, writable=True
            )
            self.ctx.write_tensor(t, a)
            self.gpu[name] = t

    def step(self):
        """(enqueue, wait) of one run with GPU tensors in and out; the wait reads the logits."""
        out = {}

        def enqueue():
            out["logits"] = self.sess.run(None, self.gpu, output_location="ml-tensor")[0]

        return enqueue, lambda: self.ctx.read_tensor_sync(out["logits"])

    def ort_step(self):
        return (lambda: self.timed.run(None, self.feeds)), None

    def close(self):
        for t in self.gpu.values():
            t.destroy()
        self.sess.close()
        self.ctx.destroy()


@pytest.fixture(scope="module")
def decoders():
    rng = np.random.default_rng(0)
    f32 = float_decoder(CFG, seed=1)
    q4 = quantize_decoder(f32, CFG, "tied")
    feeds = {
        "input_ids": rng.integers(0, CFG.vocab, (1, 1)).astype(np.int64),
        "attention_mask": np.ones((1, PAST + 1), np.int64),
    }
    for i in range(CFG.layers):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal((1, CFG.kv_heads, PAST, CFG.head_size)).astype(
                np.float32
            )
    models = {"int4": _Model(q4, feeds), "float32": _Model(f32, feeds)}
    yield models
    for m in models.values():
        m.close()


def test_int4_decode_step(benchmark, decoders):
    q4, f32 = decoders["int4"], decoders["float32"]
    assert "MatMulNBits" in q4.ops and "MatMul" not in q4.ops and "MatMulNBits" not in f32.ops
    for m in (q4, f32):  # each against onnxruntime on its own model
        err = _rel(m.host[0], m.ref.run(None, m.feeds)[0])
        assert err <= 1e-3, err
    ours, ref, ratio = measure_pair(q4.step(), f32.step(), rounds=15, warmup=2)
    o4, of, ort_ratio = measure_pair(q4.ort_step(), f32.ort_step(), rounds=15, warmup=2)
    info = record(
        benchmark,
        ours,
        "quant: int4 decode step (past 64)",
        ref,
        "float32 weights, same session path",
        adapter=adapter_name(q4.ctx),
        step_ratio=ratio,
        ort_int4_s=o4["total_s"],
        ort_float32_s=of["total_s"],
        ort_step_ratio=ort_ratio,
        vs_ort_int4=o4["total_s"] / ours["total_s"],
        vs_ort_float32=of["total_s"] / ref["total_s"],
    )
    print(
        f"\nint4 decode step on {info['adapter']}: {ours['total_s'] * 1e3:.1f} ms, float32 "
        f"{ref['total_s'] * 1e3:.1f} ms: int4/float32 x{ratio:.2f} (target <= 1); onnxruntime CPU int4 "
        f"{o4['total_s'] * 1e3:.1f} ms, float32 {of['total_s'] * 1e3:.1f} ms (x{ort_ratio:.2f}); "
        f"onnxruntime/ours: int4 {info['vs_ort_int4']:.2f}, float32 {info['vs_ort_float32']:.2f}"
    )


def test_int4_constant_bytes(benchmark, decoders):
    sizes = {k: m.ctx.counters["constant_bytes"] for k, m in decoders.items()}
    mem = {k: m.sess.graph.memory for k, m in decoders.items()}
    weights = {k: m.weight_bytes for k, m in decoders.items()}
    info = benchmark.extra_info
    info.update(
        group="quant: GPU constant bytes, int4 / float32 decoder",
        adapter=adapter_name(decoders["int4"].ctx),
        ours_total_s=None,
        int4_constant_bytes=sizes["int4"],
        float32_constant_bytes=sizes["float32"],
        ratio=sizes["int4"] / sizes["float32"],
        int4_graph_memory=mem["int4"],
        float32_graph_memory=mem["float32"],
        model_bytes=weights,
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(
        f"\nconstant bytes: int4 {sizes['int4'] / 2**20:.1f} MiB, float32 {sizes['float32'] / 2**20:.1f} MiB: "
        f"x{info['ratio']:.3f} (target <= 0.2); graph.memory int4 {mem['int4']}, float32 {mem['float32']}; "
        f"initializer bytes {weights}"
    )


@pytest.fixture(scope="module")
def berts(tmp_path_factory):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    d = tmp_path_factory.mktemp("bert")
    src, dst = d / "f.onnx", d / "q.onnx"
    onnx.save(_bert(hidden=384, heads=6, ff=1536, layers=2, seed=3), src)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    x = np.random.default_rng(2).standard_normal((1, 128, 384)).astype(np.float32)
    models = {"int8": _Model(onnx.load(dst), {"x": x}), "float32": _Model(onnx.load(src), {"x": x})}
    yield models
    for m in models.values():
        m.close()


def test_dynamic_int8_bert(benchmark, berts):
    q8, f32 = berts["int8"], berts["float32"]
    assert "MatMulInteger" in q8.ops and "MatMulInteger" not in f32.ops
    for m in (q8, f32):
        err = _rel(m.host[0], m.ref.run(None, m.feeds)[0])
        # int8: DynamicQuantizeLinear's rounding of float activations may differ by one step
        assert err <= 1e-2, err
    ours, ref, ratio = measure_pair(q8.step(), f32.step(), rounds=15, warmup=2)
    o8, of, ort_ratio = measure_pair(q8.ort_step(), f32.ort_step(), rounds=15, warmup=2)
    info = record(
        benchmark,
        ours,
        "quant: dynamic int8 BERT-like (seq 128)",
        ref,
        "float32 model, same session path",
        adapter=adapter_name(q8.ctx),
        time_ratio=ratio,
        ort_int8_s=o8["total_s"],
        ort_float32_s=of["total_s"],
        ort_time_ratio=ort_ratio,
        vs_ort_int8=o8["total_s"] / ours["total_s"],
        vs_ort_float32=of["total_s"] / ref["total_s"],
        int8_constant_bytes=q8.ctx.counters["constant_bytes"],
        float32_constant_bytes=f32.ctx.counters["constant_bytes"],
    )
    print(
        f"\ndynamic int8 BERT on {info['adapter']}: {ours['total_s'] * 1e3:.1f} ms, float32 "
        f"{ref['total_s'] * 1e3:.1f} ms: int8/float32 x{ratio:.2f}; onnxruntime CPU int8 "
        f"{o8['total_s'] * 1e3:.1f} ms, float32 {of['total_s'] * 1e3:.1f} ms (x{ort_ratio:.2f}); "
        f"onnxruntime/ours: int8 {info['vs_ort_int8']:.2f}, float32 {info['vs_ort_float32']:.2f}; "
        f"constant bytes int8 {info['int8_constant_bytes'] / 2**20:.1f} MiB, "
        f"float32 {info['float32_constant_bytes'] / 2**20:.1f} MiB"
    )
