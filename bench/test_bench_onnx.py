"""InferenceSession on real architectures (random weights) against onnxruntime's CPU provider in
the same run, and the session's per-run host overhead.

- latency: `sess.run(None, {x: numpy})` end to end (upload, dispatch, readback), and the
  MLTensor path (`output_location="ml-tensor"` + a small read as the wait), against
  `onnxruntime.InferenceSession.run` on CPUExecutionProvider.
- host overhead: the Python time of one `run()` with an MLTensor feed and ml-tensor outputs
  (enqueue only; the GPU work is waited on outside the enqueue figure), next to a bare
  `ctx.dispatch` of the same graph.
"""

import os
import sys

import numpy as np
import onnx
import pytest

from mltensor import InferenceSession

from .timing import adapter_name, measure, record

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_onnx_models import light_path, randomize_weights, real_inputs  # noqa: E402

ort = pytest.importorskip("onnxruntime")

ROUNDS = {"squeezenet": 10, "resnet50": 3}


@pytest.fixture(scope="module", params=["squeezenet", "resnet50"])
def model(request, ctx):
    name = request.param
    m = randomize_weights(onnx.load(light_path(name)))
    (vi,) = real_inputs(m)
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    sess = InferenceSession(m, ctx)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    yield name, sess, ref, vi.name, x
    sess.close()


def test_session_latency(benchmark, ctx, model):
    name, sess, ref, iname, x = model
    rounds = ROUNDS[name]
    ours = measure(lambda: sess.run(None, {iname: x}), rounds=rounds, warmup=1)
    theirs = measure(lambda: ref.run(None, {iname: x}), rounds=rounds, warmup=1)
    np.testing.assert_allclose(sess.run(None, {iname: x})[0], ref.run(None, {iname: x})[0], rtol=1e-3, atol=1e-5)
    info = record(benchmark, ours, f"onnx-session-{name}", theirs, "onnxruntime CPU", adapter=adapter_name(ctx))
    print(
        f"\n{name}: ours {ours['total_s'] * 1e3:.1f} ms, onnxruntime CPU {theirs['total_s'] * 1e3:.1f} ms "
        f"(ratio {info['ratio']:.2f}, >1 = we are faster) on {adapter_name(ctx)}"
    )


def test_session_mltensor_path_and_host_overhead(benchmark, ctx, model):
    name, sess, ref, iname, x = model
    rounds = ROUNDS[name]
    tx = ctx.create_tensor_sync(data_type="float32", shape=x.shape, writable=True)
    ctx.write_tensor(tx, x)
    outs = sess.run(None, {iname: tx}, output_location="ml-tensor")
    probe = outs[0]

    def wait():
        ctx.read_tensor_sync(probe)

    ours = measure(lambda: sess.run(None, {iname: tx}, output_location="ml-tensor"), wait, rounds=rounds, warmup=1)
    # bare dispatch of the same graph with the same tensors: what the session adds on top
    g = sess.graph
    ins = {n: tx for n in g.input_descriptors}
    bound = {n: sess._out_tensors[n] for n in g.output_descriptors}
    bare = measure(lambda: ctx.dispatch(g, ins, bound), wait, rounds=rounds, warmup=1)
    info = record(
        benchmark,
        ours,
        f"onnx-session-{name}",
        adapter=adapter_name(ctx),
        host_overhead_s=ours["enqueue_s"],
        bare_dispatch_enqueue_s=bare["enqueue_s"],
        session_extra_s=ours["enqueue_s"] - bare["enqueue_s"],
        kernels=len(g.kernel_names),
    )
    print(
        f"\n{name}: ml-tensor run {ours['total_s'] * 1e3:.1f} ms; host overhead per run "
        f"{ours['enqueue_s'] * 1e6:.0f} us (bare dispatch {bare['enqueue_s'] * 1e6:.0f} us, "
        f"{len(g.kernel_names)} kernels)"
    )
    assert info["host_overhead_s"] > 0
    tx.destroy()
