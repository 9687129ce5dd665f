"""Independent references for the TFLite tests: MediaPipe's three custom operators written out in
numpy straight from their C++ reference kernels (mediapipe/util/tflite/operations/*.cc, version 2),
and a LiteRT run of a model that uses them, with LiteRT doing every builtin operator and these
functions the custom ones."""

import math
import os

import numpy as np


def landmarks_to_transform_matrix(landmarks, opts):
    """Landmarks2TransformMatrix v2: landmarks [1, N, 3] -> [1, 4, 4] (float32 as in the kernel)."""
    f = np.float32
    lm = landmarks.reshape(-1, landmarks.shape[-1]).astype(f)
    left, right = lm[opts["left_rotation_idx"]], lm[opts["right_rotation_idx"]]
    rotation = f(opts.get("target_rotation_radians", 0.0)) - f(math.atan2(right[1] - left[1], right[0] - left[0]))
    idx = list(opts["subset_idxs"])
    pairs = [(idx[2 * i], idx[2 * i + 1]) for i in range(len(idx) // 2)]
    if len(idx) % 2:
        pairs.append((idx[-1], idx[-1]))
    pts = [lm[i] for pair in pairs for i in pair]
    r = float(rotation)

    def mat3(*v):
        return np.array(v, np.float64).reshape(3, 3)

    rot = mat3(math.cos(r), -math.sin(r), 0, math.sin(r), math.cos(r), 0, 0, 0, 1)
    rot_inv = mat3(math.cos(-r), -math.sin(-r), 0, math.sin(-r), math.cos(-r), 0, 0, 0, 1)
    rotated = [rot @ np.array([p[0], p[1], 1.0]) for p in pts]
    hi = np.max(rotated, axis=0)
    lo = np.min(rotated, axis=0)
    width, height = hi[0] - lo[0], hi[1] - lo[1]
    centre = rot_inv @ np.array([(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, 1.0])
    t = np.eye(4)
    shift = np.eye(4)
    shift[0, 3], shift[1, 3] = centre[0], centre[1]
    t = t @ shift
    rr = -r
    rotation4 = np.eye(4)
    rotation4[:2, :2] = [[math.cos(rr), -math.sin(rr)], [math.sin(rr), math.cos(rr)]]
    t = t @ rotation4
    sx, sy = opts["scale_x"] * width / opts["output_width"], opts["scale_y"] * height / opts["output_height"]
    scale = np.diag([sx, sy, 1, 1])
    t = t @ scale
    shift2 = np.eye(4)
    shift2[0, 3], shift2[1, 3] = -opts["output_width"] / 2.0, -opts["output_height"] / 2.0
    t = t @ shift2
    return t.astype(np.float32).reshape(1, 4, 4)


def landmarks_to_transform_matrix_v1(landmarks, opts):
    """Landmarks2TransformMatrix v1: landmarks [1, 1, 1, 3N] -> [1, 4, 4]."""
    lm = landmarks.reshape(-1, 3).astype(np.float64)
    left, right = lm[opts["left_rotation_idx"]], lm[opts["right_rotation_idx"]]
    alpha = -math.atan((right[1] - left[1]) / (right[0] - left[0]))
    idx = list(opts["subset"])
    hi, lo = [-100000.0, -100000.0], [100000.0, 100000.0]
    for i in idx:
        x, y = lm[i, 0], lm[i, 1]
        r = (x * math.cos(alpha) - y * math.sin(alpha), x * math.sin(alpha) + y * math.cos(alpha))
        hi = [max(hi[0], r[0]), max(hi[1], r[1])]
        lo = [min(lo[0], r[0]), min(lo[1], r[1])]
    rng = opts["landmarks_range"]
    bbox = ((hi[0] - lo[0]) * opts["bbox_size_multiplier"], (hi[1] - lo[1]) * opts["bbox_size_multiplier"])
    scale = np.array([[bbox[0] / rng, 0, 0], [0, bbox[1] / rng, 0], [0, 0, 1]])
    mid = ((hi[0] + lo[0]) / 2, (hi[1] + lo[1]) / 2)
    rm = (mid[0] * math.cos(-alpha) - mid[1] * math.sin(-alpha), mid[0] * math.sin(-alpha) + mid[1] * math.cos(-alpha))
    rotation = np.array([[math.cos(-alpha), -math.sin(-alpha), rm[0] / rng * 2 - 1],
                         [math.sin(-alpha), math.cos(-alpha), rm[1] / rng * 2 - 1], [0, 0, 1]])  # fmt: skip
    ih, iw = opts["input_hw"]
    oh, ow = opts["output_hw"]
    to_relative = np.array([[2 / (ow - 1), 0, -1], [0, 2 / (oh - 1), -1], [0, 0, 1]])
    to_absolute = np.array([[(iw - 1) / 2, 0, (iw - 1) / 2], [0, (ih - 1) / 2, (ih - 1) / 2], [0, 0, 1]])
    itm = to_absolute @ rotation @ scale @ to_relative
    out = [itm[0, 0], itm[0, 1], 0, itm[0, 2], itm[1, 0], itm[1, 1], 0, itm[1, 2],
           itm[2, 0], itm[2, 1], itm[2, 2], 0, 0, 0, 0, 1]  # fmt: skip
    return np.array(out, np.float32).reshape(1, 4, 4)


def transform_tensor_bilinear(data, matrix, opts, version=2):
    """TransformTensorBilinear: data [1, H, W, C], matrix [1, 4, 4] -> [1, oh, ow, C], pixel by pixel."""
    _, h, w, c = data.shape
    oh, ow = opts["output_size"] if version == 1 else (opts["output_height"], opts["output_width"])
    m = matrix.reshape(16).astype(np.float32)
    xt, yt = m[0:4].copy(), m[4:8].copy()
    if version == 2:
        xt[3] += xt[0] * np.float32(0.5) + xt[1] * np.float32(0.5) - np.float32(0.5)
        yt[3] += yt[0] * np.float32(0.5) + yt[1] * np.float32(0.5) - np.float32(0.5)
    out = np.zeros((1, oh, ow, c), np.float32)

    def read(yy, xx):
        return np.zeros(c, np.float32) if yy < 0 or xx < 0 or yy >= h or xx >= w else data[0, yy, xx]

    for oy in range(oh):
        for ox in range(ow):
            coord = np.array([ox, oy, 0, 1], np.float32)
            tx, ty = float(xt @ coord), float(yt @ coord)
            if tx < 0 or tx > w - 1 or ty < 0 or ty > h - 1:
                continue
            fx, fy = math.floor(tx), math.floor(ty)
            rx, ly = tx - fx, ty - fy
            upper = (1 - rx) * read(fy, fx) + rx * read(fy, fx + 1)
            lower = (1 - rx) * read(fy + 1, fx) + rx * read(fy + 1, fx + 1)
            out[0, oy, ox] = ly * lower + (1 - ly) * upper
    return out


def transform_landmarks(landmarks, matrix, dims=None, scale=1.0):
    """TransformLandmarks: v2 landmarks [1, N, 2|3]; v1 [1, H, W, C] with `dims` values a landmark
    and the translation times `scale`. x, y transformed, z kept."""
    m = matrix.reshape(16)
    dims = dims or landmarks.shape[-1]
    flat = landmarks.astype(np.float32).reshape(-1, dims)
    out = flat.copy()
    for i in range(flat.shape[0]):
        x, y = flat[i, 0], flat[i, 1]
        out[i, 0] = m[0] * x + m[1] * y + m[3] * scale
        out[i, 1] = m[4] * x + m[5] * y + m[7] * scale
    return out.reshape(landmarks.shape)


def run_custom_op(code, version, inputs, custom_options):
    from flatbuffers import flexbuffers

    opts = flexbuffers.Loads(custom_options) if custom_options else {}
    if code == "Landmarks2TransformMatrix":
        return (landmarks_to_transform_matrix_v1 if version == 1 else landmarks_to_transform_matrix)(inputs[0], opts)
    if code == "TransformTensorBilinear":
        return transform_tensor_bilinear(inputs[0], inputs[1], opts, version)
    if code == "TransformLandmarks":
        if version == 1:
            return transform_landmarks(inputs[0], inputs[1], opts["dimensions"], opts["scale"])
        return transform_landmarks(inputs[0], inputs[1])
    raise KeyError(code)


def litert_with_custom_ops(data, feeds_in_order):
    """Run a model whose custom operators LiteRT lacks: the custom operators are cut out (their outputs
    become model inputs, their inputs model outputs); LiteRT runs the rest, the numpy kernels above
    the custom operators, repeated until every custom operator has seen final inputs."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.interpreter import Interpreter
    import flatbuffers

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(data, 0))
    sg = model.subgraphs[0]
    codes = model.operatorCodes
    custom = []
    keep = []
    for op in sg.operators:
        code = codes[op.opcodeIndex]
        if code.customCode is not None and max(code.builtinCode, code.deprecatedBuiltinCode) == 32:  # CUSTOM
            custom.append((code.customCode.decode(), code.version, list(op.inputs), list(op.outputs),
                           bytes(bytearray(op.customOptions)) if op.customOptions is not None else b""))  # fmt: skip
        else:
            keep.append(op)
    n_in, n_out = len(sg.inputs), len(sg.outputs)
    cut_out = [o for c in custom for o in c[3]]
    cut_in = sorted({i for c in custom for i in c[2]} - set(cut_out))
    sg.operators = keep
    sg.inputs = list(sg.inputs) + cut_out
    sg.outputs = list(sg.outputs) + cut_in
    b = flatbuffers.Builder(len(data) + 1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    it = Interpreter(model_content=bytes(b.Output()))
    it.allocate_tensors()
    in_det, out_det = it.get_input_details(), it.get_output_details()
    values = {o: np.zeros(sg.tensors[o].shape, np.float32) for o in cut_out}
    for _ in range(len(custom) + 1):
        for d, v in zip(in_det[:n_in], feeds_in_order):
            it.set_tensor(d["index"], v)
        for d, o in zip(in_det[n_in:], cut_out):
            it.set_tensor(d["index"], values[o])
        it.invoke()
        got = {i: it.get_tensor(d["index"]) for d, i in zip(out_det[n_out:], cut_in)}
        got.update(values)
        for code, version, ins, outs, copts in custom:
            values[outs[0]] = run_custom_op(code, version, [got[i] for i in ins], copts)
            got[outs[0]] = values[outs[0]]
    return [it.get_tensor(d["index"]) for d in out_det[:n_out]]


def operator_coverage(paths):
    """The operators the TFLite files at `paths` use, every subgraph's (builtin names as the schema
    spells them, MediaPipe custom codes as they are), and those of them the importer does not
    convert: (used, unsupported), two sets."""
    from mltensor.tflite import supported_operators
    from mltensor.tflite.reader import read

    used = set()
    for p in paths:
        with open(p, "rb") as f:
            m = read(f.read())
        for sg in m.subgraphs:
            used |= {op.custom_code if op.custom_code is not None else op.name for op in sg.operators}
    return used, used - set(supported_operators())


def litert_outputs(data, feeds):
    """LiteRT's (ai-edge-litert's default interpreter) outputs of TFLite model bytes `data` fed
    `feeds` in input order."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=bytes(data))
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], v)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def run_model(ctx, data, feeds):
    """(inputs, outputs) of TFLite model bytes `data` imported by mltensor and dispatched once on
    `ctx` with `feeds` in input order: the importer's input list and the outputs read back."""
    from mltensor.tflite import import_model

    graph, inputs, outputs = import_model(data, ctx)
    ins = {}
    for (name, dt, shape), v in zip(inputs, feeds):
        ins[name] = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
        ctx.write_tensor(ins[name], v)
    outs = {name: ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True) for name, dt, shape in outputs}
    ctx.dispatch(graph, ins, outs)
    res = [ctx.read_tensor_sync(outs[name]) for name, _, _ in outputs]
    for t in [*ins.values(), *outs.values()]:
        t.destroy()
    graph.destroy()
    return inputs, res


def external_python(env, venv, flag, what):
    """The interpreter that converts test models in a child process: `env`'s value, else the
    repository's `venv` (made by `<flag>=1 bash setup.sh`), else the test is skipped saying so
    (`what`: the packages it needs)."""
    import pytest

    py = os.environ.get(env)
    local = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), venv, "bin", "python")
    if not py and os.path.exists(local):
        py = local
    if not py:
        pytest.skip(f"needs {what} to convert the models: {flag}=1 bash setup.sh, or set {env} to a Python with {what}")
    return py


def model_bytes(directory, name):
    """The bytes of `name`.tflite in `directory` (a converted() folder)."""
    with open(os.path.join(directory, f"{name}.tflite"), "rb") as f:
        return f.read()
