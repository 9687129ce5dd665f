"""MediaPipe selfie segmentation (256x256) through the TFLite importer, against LiteRT's CPU
interpreter in the same run, and the number of kernels one inference launches before and after
fusion (the graph compiled a second time with MLTENSOR_NO_FUSION=1).

- latency: write the input, dispatch, read the mask (end to end, as an application does it), and
  the MLTensor path (input already on the device; the wait is the mask's readback).
- LiteRT: `set_tensor` + `invoke` + `get_tensor` on the same input (XNNPACK CPU delegate).
"""

import os

import numpy as np
import pytest

from mltensor import models
from mltensor.tflite import import_model

from .timing import adapter_name, measure, record

litert = pytest.importorskip("ai_edge_litert.interpreter")

ROUNDS = 10


def _photo(height, width):
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = Image.open(f).convert("RGB").resize((width, height), Image.BILINEAR)
    return (np.asarray(img, dtype=np.float32) / 255.0)[None]


@pytest.fixture(scope="module")
def selfie(ctx):
    try:
        path = models.fetch("selfie_segmentation", progress=False)
    except models.FetchError as e:
        pytest.skip(f"model unavailable: {e}")
    graph, inputs, outputs = import_model(path, ctx)
    old = os.environ.get("MLTENSOR_NO_FUSION")
    os.environ["MLTENSOR_NO_FUSION"] = "1"
    try:
        unfused, _, _ = import_model(path, ctx)
    finally:
        if old is None:
            del os.environ["MLTENSOR_NO_FUSION"]
        else:
            os.environ["MLTENSOR_NO_FUSION"] = old
    yield path, graph, unfused, inputs, outputs
    graph.destroy()
    unfused.destroy()


def test_selfie_latency_vs_litert(benchmark, ctx, selfie):
    path, graph, unfused, inputs, outputs = selfie
    (iname, _, ishape), (oname, _, oshape) = inputs[0], outputs[0]
    x = _photo(*ishape[1:3])
    tin = ctx.create_tensor_sync(data_type="float32", shape=ishape, writable=True)
    tout = ctx.create_tensor_sync(data_type="float32", shape=oshape, readable=True)

    def ours_e2e():
        ctx.write_tensor(tin, x)
        ctx.dispatch(graph, {iname: tin}, {oname: tout})
        return ctx.read_tensor_sync(tout)

    ours = measure(ours_e2e, rounds=ROUNDS, warmup=2)
    ctx.write_tensor(tin, x)
    ours_dev = measure(lambda: ctx.dispatch(graph, {iname: tin}, {oname: tout}),
                       lambda: ctx.read_tensor_sync(tout), rounds=ROUNDS, warmup=1)  # fmt: skip

    it = litert.Interpreter(model_path=path)
    it.allocate_tensors()
    i_idx, o_idx = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]

    def theirs_run():
        it.set_tensor(i_idx, x)
        it.invoke()
        return it.get_tensor(o_idx)

    theirs = measure(theirs_run, rounds=ROUNDS, warmup=2)
    err = float(np.abs(ours_e2e() - theirs_run()).max())
    assert err < 1e-3

    # Launch counts: after fusion (what dispatch runs) and with fusion disabled.
    fused_n, unfused_n = len(graph.kernel_names), len(unfused.kernel_names)
    # The unfused graph computes the same mask.
    tout2 = ctx.create_tensor_sync(data_type="float32", shape=oshape, readable=True)
    ctx.write_tensor(tin, x)
    ctx.dispatch(unfused, {iname: tin}, {oname: tout2})
    assert float(np.abs(ctx.read_tensor_sync(tout2) - theirs_run()).max()) < 1e-3
    launches0 = ctx.counters["kernel_launches"]
    ctx.dispatch(graph, {iname: tin}, {oname: tout})
    ctx.read_tensor_sync(tout)
    measured_launches = ctx.counters["kernel_launches"] - launches0

    info = record(
        benchmark, ours, "tflite-selfie-256", theirs, "LiteRT CPU (XNNPACK)",
        adapter=adapter_name(ctx), max_abs_error=err, kernels_fused=fused_n, kernels_unfused=unfused_n,
        kernel_launches_per_run=measured_launches, device_only_total_s=ours_dev["total_s"],
        device_only_enqueue_s=ours_dev["enqueue_s"],
    )  # fmt: skip
    print(
        f"\nselfie 256x256: ours {ours['total_s'] * 1e3:.1f} ms end to end "
        f"({ours_dev['total_s'] * 1e3:.1f} ms with the input on the device, enqueue "
        f"{ours_dev['enqueue_s'] * 1e3:.2f} ms), LiteRT CPU {theirs['total_s'] * 1e3:.1f} ms "
        f"(ratio {info['ratio']:.2f}, >1 = we are faster) on {adapter_name(ctx)}; "
        f"kernels per inference {unfused_n} unfused -> {fused_n} fused "
        f"({measured_launches} counted); max abs error {err:.2e}"
    )
    assert fused_n < unfused_n
    assert measured_launches >= fused_n
    for t in (tin, tout, tout2):
        t.destroy()
