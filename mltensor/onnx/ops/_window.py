"""Convolution and pooling windows, shared by conv.py, conv3d.py, pool.py, integer.py and
contrib_qlinear.py: ONNX pads / auto_pad made explicit, 1-D inputs as 2-D, the supported spatial
ranks, WebNN's padding order, a pooling window's output size."""

from ..errors import unsupported


def explicit_pads(attrs, in_sp, k, s, d, transposed=False):
    """ONNX pads / auto_pad -> [begin..., end...] for the spatial dims."""
    n = len(in_sp)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = list(attrs.get("pads", [0] * (2 * n)))
        return p[:n], p[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        unsupported(f"auto_pad {auto!r}")
    begin, end = [], []
    for i in range(n):
        ek = (k[i] - 1) * d[i] + 1
        out = -(-in_sp[i] // s[i])
        total = max(0, (out - 1) * s[i] + ek - in_sp[i])
        small = total // 2
        if auto == "SAME_UPPER":
            begin.append(small)
            end.append(total - small)
        else:
            begin.append(total - small)
            end.append(small)
    return begin, end


def to2d(im, x, sp_rank):
    """1D convolution/pool: [N, C, L] -> [N, C, 1, L]."""
    if sp_rank == 2:
        return x
    if sp_rank == 1:
        return im.b.reshape(x, list(x.shape[:2]) + [1, x.shape[2]])
    spatial_rank(sp_rank)  # (ranks outside 1-3 are refused there)
    unsupported(f"{sp_rank}-D spatial inputs go through conv3d.py, not a 2-D reshape")


def spatial_rank(sp, what="inputs"):
    """1-D and 2-D map onto WebNN's 2-D operators directly, 3-D through conv3d.py; refuse others."""
    if not 1 <= sp <= 3:
        unsupported(f"{sp}-D spatial {what} are not supported (1-D, 2-D and 3-D are: an input of rank 3, 4 or 5)")


def webnn_pad(begin, end):
    return [begin[0], end[0], begin[1], end[1]]


def pool_out(in_sp, k, s, d, begin, end, ceil):
    out = []
    for i in range(len(in_sp)):
        ek = (k[i] - 1) * d[i] + 1
        span = in_sp[i] + begin[i] + end[i] - ek
        if ceil:
            o = -(-span // s[i]) + 1
            if (o - 1) * s[i] >= in_sp[i] + begin[i]:  # last window would start in the padding
                o -= 1
        else:
            o = span // s[i] + 1
        out.append(o)
    return out
