"""Synthetic models built with onnx.helper: small, seeded, shaped like real exports.

`tiny_gpt2()` is a causal decoder with the inputs, outputs and graph structure of a GPT-2 exported
from `transformers` with past key values (input_ids [batch, sequence]; past_key_values.{i}.key /
.value [batch, heads, past_sequence, head_size]; logits and present.{i}.key / .value, one step
longer), including the shape arithmetic exporters emit: position ids from
Range(past, past + sequence), the causal mask sliced from a constant [1, 1, n_positions,
n_positions] buffer at [past, past + sequence), heads split with Reshape to a shape computed from
Shape(), GPT-2's tanh GELU. Its weights are seeded random numbers: it predicts nothing, but every
step is checkable against onnxruntime, which is what the decode example, the tests and the
benchmarks need (mltensor.models lists the pretrained models). Its output head is untied and its
weights large enough that greedy decoding wanders over the vocabulary instead of repeating a token.
"""

import numpy as np


def _constant_and_node(inits, nodes):
    """c(name, value, dtype): an initializer; n(op, inputs, outputs, **attrs): a node named by its
    position (its output name, or names). Both append to the given lists: the model builders'
    shorthand."""
    from onnx import helper, numpy_helper

    def c(name, value, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def n(op, ins, outs=None, **attrs):
        outs = outs or [f"{op}_{len(nodes)}"]
        nodes.append(helper.make_node(op, ins, outs, name=f"{op}_{len(nodes)}", **attrs))
        return outs[0] if len(outs) == 1 else outs

    return c, n


def tiny_gpt2(*, layers=2, heads=4, head_size=16, vocab=512, n_positions=256, seed=0, opset=17, attention_mask=False):
    """ONNX bytes of the model described above; embedding width heads * head_size. With
    attention_mask, also the int64 input attention_mask [batch, "past_sequence + sequence"]
    (1 keeps a position, 0 masks it out), added to the scores as transformers does."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    E, H, D = heads * head_size, heads, head_size
    inits, nodes = [], []

    def w(name, *shape, scale=0.02):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    c, n = _constant_and_node(inits, nodes)

    ones = lambda name: c(name, np.ones(E, np.float32), np.float32)  # noqa: E731
    zeros = lambda name: c(name, np.zeros(E, np.float32), np.float32)  # noqa: E731
    w("wte", vocab, E, scale=0.5)
    w("wpe", n_positions, E, scale=0.1)
    c("bias", np.tril(np.ones((n_positions, n_positions), bool)).reshape(1, 1, n_positions, n_positions), bool)
    c("one", 1), c("two", 2), c("ax0", [0]), c("ax2", [2]), c("ax3", [3])
    c("heads_dims", [H, D]), c("embed_dim", [E]), c("neg_big", np.float32(-3.4028235e38), np.float32)
    c("scale", np.float32(np.sqrt(D)), np.float32)
    c("gelu_a", np.float32(0.044715), np.float32), c("gelu_b", np.float32(np.sqrt(2 / np.pi)), np.float32)
    (
        c("half", np.float32(0.5), np.float32),
        c("onef", np.float32(1.0), np.float32),
        c("three", np.float32(3), np.float32),
    )

    # positions past .. past + sequence (as transformers' export computes them)
    past_len = n("Gather", [n("Shape", ["past_key_values.0.key"]), "two"], axis=0)
    seq_len = n("Gather", [n("Shape", ["input_ids"]), "one"], axis=0)
    total = n("Add", [past_len, seq_len])
    pos = n("Unsqueeze", [n("Range", [past_len, total, "one"]), "ax0"])
    h = n("Add", [n("Gather", ["wte", "input_ids"], axis=0), n("Gather", ["wpe", pos], axis=0)])
    # the causal mask: rows past .. past + sequence, columns 0 .. past + sequence
    mask = n(
        "Slice",
        [
            n("Slice", ["bias", n("Unsqueeze", [past_len, "ax0"]), n("Unsqueeze", [total, "ax0"]), "ax2"]),
            "ax0",
            n("Unsqueeze", [total, "ax0"]),
            "ax3",
        ],
    )
    bs = n("Slice", [n("Shape", ["input_ids"]), "ax0", "ax2"])  # [batch, sequence]
    split_shape = n("Concat", [bs, "heads_dims"], axis=0)
    merge_shape = n("Concat", [bs, "embed_dim"], axis=0)

    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])]
    pad = None
    if attention_mask:  # (1 - mask) * -10000 as [batch, 1, 1, past + sequence]
        inputs.append(
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "past_sequence + sequence"])
        )
        c("mask_big", np.float32(-10000.0), np.float32), c("ax12", [1, 2])
        keep = n("Cast", ["attention_mask"], to=TensorProto.FLOAT)
        pad = n("Unsqueeze", [n("Mul", [n("Sub", ["onef", keep]), "mask_big"]), "ax12"])
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])]
    for i in range(layers):
        p = f"h{i}."
        a = n("LayerNormalization", [h, ones(p + "ln1.g"), zeros(p + "ln1.b")], axis=-1, epsilon=1e-5)
        qkv = n("Add", [n("MatMul", [a, w(p + "attn.w", E, 3 * E, scale=0.3)]), w(p + "attn.b", 3 * E)])
        q, k, v = n("Split", [qkv, c(p + "split", [E, E, E])], [p + "q", p + "k", p + "v"], axis=2)
        heads_of = lambda t: n("Transpose", [n("Reshape", [t, split_shape])], perm=[0, 2, 1, 3])  # noqa: E731
        q, k, v = heads_of(q), heads_of(k), heads_of(v)
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        k = n("Concat", [pk, k], [f"present.{i}.key"], axis=2)
        v = n("Concat", [pv, v], [f"present.{i}.value"], axis=2)
        scores = n("Div", [n("MatMul", [q, n("Transpose", [k], perm=[0, 1, 3, 2])]), "scale"])
        if pad is not None:
            scores = n("Add", [scores, pad])
        probs = n("Softmax", [n("Where", [mask, scores, "neg_big"])], axis=-1)
        attn = n("Reshape", [n("Transpose", [n("MatMul", [probs, v])], perm=[0, 2, 1, 3]), merge_shape])
        h = n("Add", [h, n("Add", [n("MatMul", [attn, w(p + "proj.w", E, E, scale=0.3)]), w(p + "proj.b", E)])])
        m = n("LayerNormalization", [h, ones(p + "ln2.g"), zeros(p + "ln2.b")], axis=-1, epsilon=1e-5)
        f = n("Add", [n("MatMul", [m, w(p + "fc.w", E, 4 * E, scale=0.3)]), w(p + "fc.b", 4 * E)])
        inner = n("Mul", [n("Add", [f, n("Mul", [n("Pow", [f, "three"]), "gelu_a"])]), "gelu_b"])
        g = n("Mul", [n("Mul", [f, "half"]), n("Add", [n("Tanh", [inner]), "onef"])])
        h = n("Add", [h, n("Add", [n("MatMul", [g, w(p + "out.w", 4 * E, E, scale=0.3)]), w(p + "out.b", E)])])
        for kind in ("key", "value"):
            dims = ["batch", H, "past_sequence", D]
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, dims))
            outputs.append(
                helper.make_tensor_value_info(
                    f"present.{i}.{kind}", TensorProto.FLOAT, ["batch", H, "past_sequence + sequence", D]
                )
            )
    h = n("LayerNormalization", [h, ones("lnf.g"), zeros("lnf.b")], axis=-1, epsilon=1e-5)
    n("MatMul", [h, w("lm_head", E, vocab, scale=1.0)], ["logits"])
    graph = helper.make_graph(nodes, "tiny_gpt2", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="mltensor")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def past_names(model_inputs):
    """The (past input, present output) name pairs of a decoder exported with past key values:
    past_key_values.{i}.key / .value -> present.{i}.key / .value."""
    out = []
    for name in model_inputs:
        if name.startswith("past_key_values."):
            out.append((name, "present." + name[len("past_key_values.") :]))
    return out


def vit(
    *,
    layers=12,
    hidden=768,
    heads=12,
    mlp=3072,
    image=224,
    patch=16,
    classes=1000,
    seed=0,
    opset=17,
    batch="batch",
    external_data=None,
):
    """ONNX bytes of a ViT image classifier shaped like transformers' ViT-B/16 export (the
    defaults: 86 M parameters, 344 MB of float32 weights): a 16x16 stride-16 patch Conv, the class
    token and position embeddings, pre-norm encoder layers (LayerNormalization, one fused QKV
    MatMul split into heads, Softmax attention, exact-erf GELU MLP), the final norm and a
    classifier on the class token. Input pixel_values [batch, 3, image, image], output logits
    [batch, classes]; `batch` an int fixes it. Seeded random weights, checkable against
    onnxruntime. external_data: a file path: the weights go to `<path>.data` beside it (ONNX
    external data) and the model is written to `path`, which is returned instead of bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    E, H, D = hidden, heads, hidden // heads
    n_patches = (image // patch) ** 2
    inits, nodes = [], []

    def w(name, *shape, scale=0.02):
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= scale
        inits.append(numpy_helper.from_array(a, name))  # noqa: F821 (w runs before `del inits` below)
        return name

    c, n = _constant_and_node(inits, nodes)

    def norm(x, p):
        g = c(p + ".g", 1 + rng.standard_normal(E) * 0.05, np.float32)
        b = c(p + ".b", rng.standard_normal(E) * 0.05, np.float32)
        return n("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-12)

    c("scale", np.float32(1 / np.sqrt(D)), np.float32)
    c("sqrt2", np.float32(np.sqrt(2)), np.float32)
    c("half", np.float32(0.5), np.float32), c("onef", np.float32(1.0), np.float32)
    c("heads_dims", [0, -1, H, D]), c("merge_dims", [0, -1, E]), c("zero", [0]), c("one", [1])
    # patches: [batch, E, 14, 14] -> [batch, 196, E], then the class token in front
    x = n(
        "Conv",
        ["pixel_values", w("patch.w", E, 3, patch, patch), w("patch.b", E)],
        kernel_shape=[patch, patch],
        strides=[patch, patch],
    )
    x = n("Transpose", [n("Reshape", [x, c("pflat", [0, E, -1])])], perm=[0, 2, 1])
    batch_dim = n("Slice", [n("Shape", ["pixel_values"]), "zero", "one"])
    cls = n("Expand", [w("cls", 1, 1, E), n("Concat", [batch_dim, c("cls_rest", [1, E])], axis=0)])
    x = n("Add", [n("Concat", [cls, x], axis=1), w("pos", 1, n_patches + 1, E)])
    for i in range(layers):
        p = f"layer{i}"
        a = norm(x, p + ".ln1")
        qkv = n("Add", [n("MatMul", [a, w(p + ".qkv.w", E, 3 * E)]), w(p + ".qkv.b", 3 * E)])
        q, k, v = n("Split", [qkv, c(p + ".split", [E, E, E])], [p + ".q", p + ".k", p + ".v"], axis=2)
        heads_of = lambda t: n("Transpose", [n("Reshape", [t, "heads_dims"])], perm=[0, 2, 1, 3])  # noqa: E731
        q, k, v = heads_of(q), heads_of(k), heads_of(v)
        scores = n("Mul", [n("MatMul", [q, n("Transpose", [k], perm=[0, 1, 3, 2])]), "scale"])
        ctx_ = n("MatMul", [n("Softmax", [scores], axis=-1), v])
        merged = n("Reshape", [n("Transpose", [ctx_], perm=[0, 2, 1, 3]), "merge_dims"])
        x = n("Add", [x, n("Add", [n("MatMul", [merged, w(p + ".proj.w", E, E)]), w(p + ".proj.b", E)])])
        m = norm(x, p + ".ln2")
        f = n("Add", [n("MatMul", [m, w(p + ".fc1.w", E, mlp)]), w(p + ".fc1.b", mlp)])
        g = n("Mul", [n("Mul", [f, "half"]), n("Add", [n("Erf", [n("Div", [f, "sqrt2"])]), "onef"])])
        x = n("Add", [x, n("Add", [n("MatMul", [g, w(p + ".fc2.w", mlp, E)]), w(p + ".fc2.b", E)])])
    x = norm(x, "final")
    first = n("Squeeze", [n("Slice", [x, "zero", "one", "one"]), "one"])
    n("Gemm", [first, w("head.w", classes, E), w("head.b", classes)], ["logits"], transB=1)
    graph = helper.make_graph(
        nodes,
        "vit",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="mltensor")
    model.ir_version = 8
    del inits, graph
    if external_data is None:
        return model.SerializeToString()
    import os

    onnx.save_model(
        model,
        external_data,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=os.path.basename(external_data) + ".data",
        size_threshold=1024,
    )
    return external_data
