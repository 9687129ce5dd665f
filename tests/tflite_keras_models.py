"""Small Keras models converted by TensorFlow's own TFLite converter: the test set of
tests/test_tflite_keras.py.

Run with a Python that has `tensorflow-cpu` (never imported by the test process itself):

    python tests/tflite_keras_models.py OUT_DIR [NAME ...]

writes OUT_DIR/<model>_<form>.tflite for each model and each form (float, dynamic-range,
full-integer with int8 I/O, full-integer with float I/O, 16x8: int16 activations with float
I/O), and OUT_DIR/versions.json. Weights are
seeded, so a file depends only on the TensorFlow version.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Keras 2 (the tf-keras package) where installed: its LSTM converts to the fused
# UNIDIRECTIONAL_SEQUENCE_LSTM; Keras 3's converts to a WHILE loop.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
layers = keras.layers


def _calibrated(model, shape):
    """The batch normalizations' statistics set from one batch of inputs (a step of SGD with
    learning rate 0, momentum 0): activations of unit scale all the way, not the vanishing ones of
    fresh BN statistics."""
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            layer.momentum = 0.0
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")
    x = np.random.default_rng(1).standard_normal((16, *shape)).astype(np.float32)
    model.fit(x, np.zeros((16, *model.outputs[0].shape[1:]), np.float32), batch_size=16, epochs=1, verbose=0)
    return model


def mobilenet_v2():
    """MobileNetV2 with alpha 0.35 at 96x96 (random weights, calibrated), 10 classes, logits out."""
    model = keras.applications.MobileNetV2(
        input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10, classifier_activation=None
    )
    return _calibrated(model, (96, 96, 3))


def mobilenet_v3():
    """MobileNetV3Small with alpha 0.75 at 96x96 (hard-swish, squeeze-and-excitation blocks),
    random weights, calibrated, 10 classes, logits out."""
    model = keras.applications.MobileNetV3Small(
        input_shape=(96, 96, 3), alpha=0.75, weights=None, classes=10, classifier_activation=None,
        include_preprocessing=False,
    )  # fmt: skip
    return _calibrated(model, (96, 96, 3))


def transformer_block():
    """Token embeddings -> one pre-norm transformer block (LayerNorm, 2-head attention, GELU MLP)."""
    x_in = keras.Input((16, 32), batch_size=1)
    h = layers.LayerNormalization(epsilon=1e-5)(x_in)
    h = layers.MultiHeadAttention(num_heads=2, key_dim=16)(h, h)
    x = layers.Add()([x_in, h])
    h = layers.LayerNormalization(epsilon=1e-5)(x)
    h = layers.Dense(64, activation="gelu")(h)
    h = layers.Dense(32)(h)
    x = layers.Add()([x, h])
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(x_in, layers.Dense(4)(x))


def mlp():
    x_in = keras.Input((48,), batch_size=1)
    h = layers.Dense(64, activation="relu")(x_in)
    h = layers.Dense(16, activation="tanh")(h)
    return keras.Model(x_in, layers.Dense(3, activation="softmax")(h))


def lstm():
    x_in = keras.Input((8, 6), batch_size=1)
    h = layers.LSTM(12, return_sequences=True)(x_in)
    h = layers.LSTM(10)(h)
    return keras.Model(x_in, layers.Dense(3)(h))


MODELS = {
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3": mobilenet_v3,
    "transformer": transformer_block,
    "mlp": mlp,
    "lstm": lstm,
}
FORMS = ("float", "dynamic", "int8", "int8_float_io", "int16x8")
# TensorFlow 2.21's converter crashes (SIGSEGV) quantizing the LSTM to full integer; it refuses
# HARD_SWISH in 16x8 (MobileNetV3), and LiteRT 2.3 aborts running the transformer's 16x8 form
MODEL_FORMS = {
    "lstm": ("float", "dynamic"),
    "mobilenet_v3": ("float", "dynamic", "int8", "int8_float_io"),
    "transformer": ("float", "dynamic", "int8", "int8_float_io"),
}


def _input_shape(model):
    return [int(d) for d in model.inputs[0].shape[1:]]


def convert(model, form, seed=0):
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if form != "float":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if form.startswith("int8") or form == "int16x8":
        shape = _input_shape(model)
        rng = np.random.default_rng(seed)

        def representative():
            for _ in range(16):
                yield [rng.standard_normal([1] + shape).astype(np.float32)]

        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if form == "int16x8":  # int16 activations, int8 weights, int64 biases; float I/O
            conv.target_spec.supported_ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
            ]
        if form == "int8":
            conv.inference_input_type = tf.int8
            conv.inference_output_type = tf.int8
    return conv.convert()


def main(argv):
    out = argv[0]
    names = argv[1:] or list(MODELS)
    os.makedirs(out, exist_ok=True)
    for name in names:
        keras.utils.set_random_seed(0)
        model = MODELS[name]()
        for form in MODEL_FORMS.get(name, FORMS):
            data = convert(model, form)
            path = os.path.join(out, f"{name}_{form}.tflite")
            with open(path + ".part", "wb") as f:
                f.write(data)
            os.replace(path + ".part", path)
    import importlib.metadata as meta

    versions = {"tensorflow": tf.__version__, "numpy": np.__version__}
    for pkg in ("tf-keras", "keras"):
        try:
            versions[pkg] = meta.version(pkg)
        except meta.PackageNotFoundError:
            pass
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump(versions, f)


if __name__ == "__main__":
    main(sys.argv[1:])
