"""The code path of one ONNX Conv, from InferenceSession.run to its WGSL text, as a newcomer
follows it: the call stacks (mltensor frames only) when the conv2d node is recorded, when its
kernel is launched by the lowering and when conv2d.wgsl is rendered, walked one after the other
(back up to the common caller, then down the next), with every change of folder marked.

    python -m bench.conv_path

The count it prints is the "folder changes on the ONNX Conv -> WGSL path" of issue 40.
"""

import os
import sys
import tempfile

import numpy as np


def _model(path):
    from onnx import TensorProto, helper, numpy_helper, save

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.random.default_rng(0).random((8, 3, 3, 3), dtype=np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    save(
        helper.make_model(helper.make_graph([conv], "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)]),
        path,
    )


def stacks():
    """{"record" | "launch" | "render": [(file relative to the package, function)]}."""
    os.environ["MLTENSOR_CACHE"] = tempfile.mkdtemp()  # a build, not a graph-cache hit
    import mltensor

    pkg = os.path.dirname(mltensor.__file__)
    path = os.path.join(tempfile.mkdtemp(), "conv.onnx")
    _model(path)
    sess = mltensor.InferenceSession(path)
    found = {}

    def frames(f):
        out = []
        while f is not None:
            if f.f_code.co_filename.startswith(pkg):
                out.append((os.path.relpath(f.f_code.co_filename, pkg), f.f_code.co_qualname))
            f = f.f_back
        return out[::-1]

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(pkg):
            return
        loc = frame.f_locals
        if "record" not in found and code.co_name == "_emit" and loc.get("op") == "conv2d":
            found["record"] = frames(frame)
        elif (
            "launch" not in found
            and code.co_qualname == "KernelContext.launch"
            and getattr(loc.get("kernel"), "name", "").startswith("conv2d")
        ):
            found["launch"] = frames(frame)
        elif "render" not in found and code.co_qualname == "Kernel.source" and "conv2d" in str(loc.get("self")):
            found["render"] = frames(frame)

    sys.setprofile(profile)
    try:
        sess.run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})
    finally:
        sys.setprofile(None)
    return found


def walk(found):
    """[(file, function, returning)] through the three stacks in order."""
    seq = [found[k] for k in ("record", "launch", "render")]
    out = [(f, q, False) for f, q in seq[0]]
    for cur, nxt in zip(seq, seq[1:]):
        k = 0
        while k < min(len(cur), len(nxt)) and cur[k] == nxt[k]:
            k += 1
        out += [(f, q, True) for f, q in cur[k - 1 : -1][::-1]]  # back up to the common caller
        out += [(f, q, False) for f, q in nxt[k:]]
    return out


def main():
    steps = walk(stacks())
    changes, prev = 0, None
    for f, q, back in steps:
        folder = os.path.dirname(f) or "mltensor"
        moved = prev is not None and folder != prev
        changes += moved
        print(f"{'  back in ' if back else ''}{f}:{q}{'   <- folder change' if moved else ''}")
        prev = folder
    folders = {os.path.dirname(f) or "mltensor" for f, _, _ in steps}
    print(
        f"{len(steps)} frames, {len(folders) + 1} folders (shaders/ included), {changes + 1} folder changes "
        "(the last: into shaders/)"
    )


if __name__ == "__main__":
    main()
