"""Stateful and control-flow models made by TensorFlow's own TFLite converter: the test set of
tests/test_tflite_state.py.

Run with a Python that has `tensorflow-cpu` and `tf-keras` (never imported by the test process):

    python tests/tflite_state_models.py OUT_DIR

writes OUT_DIR/<name>.tflite for each model below and OUT_DIR/versions.json. Weights are seeded.

- stream_float, stream_int8, stream_int8_variables: a microWakeWord-style streaming model (Keras 2, tf-keras): two
  ring buffers of past frames held in non-trainable variables (`add_weight` + `assign`, as
  microWakeWord's Stream layer), each feeding a valid convolution over time, then a dense layer;
  converted with resource variables (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE and
  its initialization subgraph), in float and full-integer forms: int8 activations with float
  variables and edges, and (stream_int8_variables, as microWakeWord converts) int8 variables, an
  int8 input and a uint8 output.
- cond: tf.cond on a value computed from the input (IF with two branch subgraphs).
- loop_fixed: tf.while_loop with a constant trip count (WHILE, its counter folded at load).
- loop_dynamic: tf.while_loop whose trip count is a graph input (refused at load).
- lstm_keras3: a Keras 3 LSTM, which its converter writes as a WHILE over the time steps.
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
KERAS3 = "--keras3" in sys.argv
os.environ["TF_USE_LEGACY_KERAS"] = "0" if KERAS3 else "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

FRAMES = (1, 10)  # [frames per call, features]


def _write(out, name, data):
    path = os.path.join(out, f"{name}.tflite")
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


def streaming_model():
    keras = tf.keras
    layers = keras.layers

    class RingBuffer(layers.Layer):
        """The last `frames` inputs, kept in a variable between calls (microWakeWord's Stream)."""

        def __init__(self, frames, **kw):
            super().__init__(**kw)
            self.frames = frames

        def build(self, shape):
            self.ring = self.add_weight(
                name="ring", shape=(1, self.frames, shape[-1]), initializer="zeros", trainable=False
            )

        def call(self, x):
            new = tf.concat([self.ring[:, x.shape[1] :], x], axis=1)
            self.ring.assign(new)
            return new

    keras.utils.set_random_seed(0)
    x_in = keras.Input(FRAMES, batch_size=1)
    h = RingBuffer(4, name="stream_1")(x_in)
    h = layers.Conv1D(8, 4, activation="relu")(h)
    h = RingBuffer(3, name="stream_2")(h)
    h = layers.Conv1D(6, 3, activation="relu")(h)
    h = layers.Flatten()(h)
    return keras.Model(x_in, layers.Dense(2, activation="sigmoid")(h))


def stream(out):
    model = streaming_model()
    for form in ("float", "int8", "int8_variables"):
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.experimental_enable_resource_variables = True
        if form.startswith("int8"):
            rng = np.random.default_rng(0)

            def representative():
                for _ in range(32):
                    yield [rng.standard_normal((1, *FRAMES)).astype(np.float32)]

            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.representative_dataset = representative
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if form == "int8_variables":  # int8 state too, with int8 graph edges, as microWakeWord's models
            conv._experimental_variable_quantization = True
            conv.inference_input_type = tf.int8
            conv.inference_output_type = tf.uint8
        _write(out, f"stream_{form}", conv.convert())


class Functions(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32)])
    def cond(self, x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2.0 + 1.0, lambda: tf.exp(x) - x)

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32)])
    def loop_fixed(self, x):
        _, y = tf.while_loop(lambda i, y: i < 7, lambda i, y: (i + 1, y * 0.5 + tf.sin(y)), [tf.constant(0), x])
        return y

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32), tf.TensorSpec([], tf.int32)])
    def loop_dynamic(self, x, n):
        _, y = tf.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 0.5 + tf.sin(y)), [tf.constant(0), x])
        return y


def functions(out):
    m = Functions()
    for name in ("cond", "loop_fixed", "loop_dynamic"):
        conv = tf.lite.TFLiteConverter.from_concrete_functions([getattr(m, name).get_concrete_function()], m)
        _write(out, name, conv.convert())


def lstm_keras3(out):
    import keras

    keras.utils.set_random_seed(0)
    x_in = keras.Input((6, 5), batch_size=1)
    h = keras.layers.LSTM(8)(x_in)
    model = keras.Model(x_in, keras.layers.Dense(3)(h))
    _write(out, "lstm_keras3", tf.lite.TFLiteConverter.from_keras_model(model).convert())


def main(out):
    os.makedirs(out, exist_ok=True)
    if KERAS3:
        lstm_keras3(out)
        return
    stream(out)
    functions(out)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="0")
    subprocess.run([sys.executable, os.path.abspath(__file__), out, "--keras3"], check=True, env=env)
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
    main([a for a in sys.argv[1:] if a != "--keras3"][0])
