"""torchvision models as litert-torch converts them (tests/litert_torch_models.py: MobileNetV3-small,
ResNet-18, EfficientNet-B0, a 2-layer ViT; random seeded weights) against LiteRT's interpreter on
the same input: every operator they use is one the importer converts, and the outputs agree to
1e-4 relative to the largest output.

The models are made on first use by a Python with `litert-torch` and `torchvision`
(MLTENSOR_LITERT_TORCH_PYTHON, or .venv-litert from `MLTENSOR_SETUP_LITERT_TORCH=1 bash setup.sh`;
it needs its own environment: litert-torch pins torch < 2.15), cached under the cache directory
keyed on the generator and the versions; without one these tests skip.
"""

import os

import numpy as np
import pytest
from test_tflite_state import HERE, converted

from tflite_reference import external_python

import mltensor

pytest.importorskip("ai_edge_litert")

GENERATOR = os.path.join(HERE, "litert_torch_models.py")
ENV = "MLTENSOR_LITERT_TORCH_PYTHON"
NAMES = ("mobilenet_v3_small", "resnet18", "efficientnet_b0", "vit_small")


@pytest.fixture(scope="module")
def models():
    py = external_python(ENV, ".venv-litert", "MLTENSOR_SETUP_LITERT_TORCH", "litert-torch and torchvision")
    return converted(GENERATOR, "litert-torch", py, ("litert-torch", "torch", "torchvision"), timeout=2400)


def test_operators_supported(models):
    from tflite_reference import operator_coverage

    used, missing = operator_coverage([os.path.join(models, f"{n}.tflite") for n in NAMES])
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"} <= used
    assert not missing, sorted(missing)


@pytest.mark.parametrize("name", NAMES)
def test_matches_litert(ctx, models, name):
    from ai_edge_litert.interpreter import Interpreter

    with open(os.path.join(models, f"{name}.tflite"), "rb") as f:
        data = f.read()
    it = Interpreter(model_content=data)
    it.allocate_tensors()
    (d,) = it.get_input_details()
    x = np.random.default_rng(1).standard_normal(d["shape"]).astype(np.float32)
    it.set_tensor(d["index"], x)
    it.invoke()
    ref = it.get_tensor(it.get_output_details()[0]["index"])
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
    assert got.shape == ref.shape
    scale = float(np.abs(ref).max())
    assert scale > 1e-5 and float(ref.std()) > 0.1 * scale  # (not vanished, not one value)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * scale)
