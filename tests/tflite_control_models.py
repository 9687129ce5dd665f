"""Control flow decided at run time, in models made by TensorFlow's own TFLite converter: the test
set of tests/test_tflite_control.py.

Run with a Python that has `tensorflow-cpu` (never imported by the test process):

    python tests/tflite_control_models.py OUT_DIR

writes OUT_DIR/<name>.tflite for each model below and OUT_DIR/versions.json. Weights are seeded.

- while_bound: tf.while_loop whose trip count is a graph input `n` (the counter and an
  accumulator come out too), between dense layers: the model's input is read after the loop.
- while_threshold: tf.while_loop until a value computed from the input crosses a threshold (no
  trip count anywhere: the data decides it, 0 iterations for a large input).
- while_nested_cond: a while loop whose body holds a tf.cond on its state (IF inside the WHILE,
  both branches the same shape) and a second loop after it.
- cond_shapes: tf.cond on a value computed from the input whose branches give different shapes
  ([1, 3] and [1, 12]).
- while_nested: a loop bounded by an input whose body holds a loop bounded by the outer counter
  (a run-time WHILE inside a WHILE body: refused, naming it).
- cond_while: tf.cond on a value computed from the input whose true branch holds a tf.while_loop
  bounded by an input (a run-time WHILE inside an IF branch), the other branch a plain one.
- cond_in_cond: tf.cond on a computed value whose true branch holds a tf.cond whose branches give
  different shapes ([1, 3] and [1, 12]; the other outer branch [1, 2]).
- while_growing: a loop whose value grows by a column an iteration (shape_invariants): refused.
- while_long: tf.while_loop with a constant bound of 300 iterations (too many to unroll: executed).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def _write(out, name, data):
    path = os.path.join(out, f"{name}.tflite")
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)


class Models(tf.Module):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.w1 = tf.constant(rng.standard_normal((6, 8)).astype(np.float32) * 0.4)
        self.w2 = tf.constant(rng.standard_normal((8, 8)).astype(np.float32) * 0.3)
        self.w3 = tf.constant(rng.standard_normal((8, 6)).astype(np.float32) * 0.4)

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32), tf.TensorSpec([], tf.int32)])
    def while_bound(self, x, n):
        h = tf.tanh(tf.matmul(x, self.w1))

        def body(i, h, acc):
            h = tf.tanh(tf.matmul(h, self.w2) + 0.1)
            return i + 1, h, acc + tf.reduce_sum(h)

        i, h, acc = tf.while_loop(lambda i, h, acc: i < n, body, [tf.constant(0), h, tf.constant(0.0)])
        return tf.matmul(h, self.w3) + x, i, acc

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32)])
    def while_threshold(self, x):
        def body(i, y):
            return i + 1, y * 1.25 + 0.05 * tf.sin(y)

        i, y = tf.while_loop(lambda i, y: tf.reduce_sum(tf.abs(y)) < 40.0, body, [tf.constant(0), x])
        return y, i

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32), tf.TensorSpec([], tf.int32)])
    def while_nested_cond(self, x, n):
        def body(i, y):
            y = tf.cond(tf.reduce_sum(y) > 0, lambda: y * 0.5 - 0.3, lambda: tf.exp(y) * 0.9)
            return i + 1, y

        _, y = tf.while_loop(lambda i, y: i < n, body, [tf.constant(0), x])
        _, z = tf.while_loop(lambda j, z: tf.reduce_max(z) < 3.0, lambda j, z: (j + 1, z + 0.25), [tf.constant(0), y])
        return z

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32)])
    def cond_shapes(self, x):
        return tf.cond(
            tf.reduce_sum(x) > 0,
            lambda: tf.tanh(x[:, :3] * 2.0),
            lambda: tf.concat([x, tf.exp(x[:, :3]), x[:, 3:] - 1.0], axis=1),
        )

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32), tf.TensorSpec([], tf.int32)])
    def while_nested(self, x, n):
        def body(i, y):
            _, y = tf.while_loop(lambda j, z: j < i, lambda j, z: (j + 1, z * 0.9 + 0.1), [tf.constant(0), y])
            return i + 1, y

        return tf.while_loop(lambda i, y: i < n, body, [tf.constant(0), x])[1]

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32), tf.TensorSpec([], tf.int32)])
    def cond_while(self, x, n):
        def looped():
            _, y = tf.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * 0.8 + 0.3), [tf.constant(0), x])
            return tf.tanh(y) + 1.0

        return tf.cond(tf.reduce_sum(x) > 0, looped, lambda: x * 2.0 - 1.0) * 1.5

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32)])
    def cond_in_cond(self, x):
        def inner():
            return tf.cond(tf.reduce_max(x) > 1.0, lambda: tf.tanh(x[:, :3]), lambda: tf.concat([x, x * 2.0], axis=1))

        return tf.cond(tf.reduce_sum(x) > 0, inner, lambda: x[:, :2] - 1.0)

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32), tf.TensorSpec([], tf.int32)])
    def while_growing(self, x, n):
        _, y = tf.while_loop(
            lambda i, y: i < n,
            lambda i, y: (i + 1, tf.concat([y, y[:, :1] * 0.5], axis=1)),
            [tf.constant(0), x],
            shape_invariants=[tf.TensorShape([]), tf.TensorShape([1, None])],
        )
        return y

    @tf.function(input_signature=[tf.TensorSpec([1, 6], tf.float32)])
    def while_long(self, x):
        _, y = tf.while_loop(
            lambda i, y: i < 300, lambda i, y: (i + 1, y * 0.99 + 0.01 * tf.cos(y)), [tf.constant(0), x]
        )
        return y


NAMES = (
    "while_bound",
    "while_threshold",
    "while_nested_cond",
    "cond_shapes",
    "while_nested",
    "cond_while",
    "cond_in_cond",
    "while_growing",
    "while_long",
)


def main(out):
    os.makedirs(out, exist_ok=True)
    m = Models()
    for name in NAMES:
        conv = tf.lite.TFLiteConverter.from_concrete_functions([getattr(m, name).get_concrete_function()], m)
        _write(out, name, conv.convert())
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump({"tensorflow": tf.__version__, "numpy": np.__version__}, f)


if __name__ == "__main__":
    main(sys.argv[1])
