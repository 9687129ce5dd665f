"""Next-token sampling on the GPU: greedy, temperature, top-k, top-p (shaders/llm_sample.wgsl).

`_sample_token(logits, rnd, temperature=, top_k=, top_p=)` is an internal builder operator (leading
underscore, not WebNN) registered when mltensor.llm is imported: logits float32 [1, V] (or [V]),
rnd float32 [1] (a uniform number in [0, 1), not read when greedy), output int32 [1], the chosen
id. Settings are build-time constants: a Sampler (sampler.py) builds one small graph per setting.
"""

import numpy as np

from ..ir.registry import builder_op, lowering, register
from ..ops._checks import check_number
from ..runtime.wgsl import Binding, Kernel, f32_lit

WG = 256

register(
    "_sample_token",
    {"logits": ("float32",), "rnd": ("float32",), "output": ("int32",)},
    ranks={"logits": (1, 2), "rnd": (1, 1)},
)


def check_settings(temperature: float, top_k: int, top_p: float) -> tuple[float, int, float]:
    where = "_sample_token"
    temperature = check_number(where, "temperature", temperature)
    top_p = check_number(where, "top_p", top_p)
    if not (temperature >= 0.0 and np.isfinite(temperature)):
        raise TypeError(f"[{where}] temperature must be a finite number >= 0, got {temperature}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise TypeError(f"[{where}] top_k must be an integer >= 0 (0: off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise TypeError(f"[{where}] top_p must be in (0, 1], got {top_p}")
    return temperature, top_k, top_p


@builder_op
def _sample_token(b, logits, rnd=None, *, temperature=0.0, top_k=0, top_p=1.0, label=None):
    where = "_sample_token"
    temperature, top_k, top_p = check_settings(temperature, top_k, top_p)
    b._operand(logits, where, "logits")
    if (
        logits.data_type != "float32"
        or not all(isinstance(d, int) for d in logits.shape)
        or logits.rank not in (1, 2)
        or (logits.rank == 2 and logits.shape[0] != 1)
    ):
        raise TypeError(
            f"[{where}] logits must be float32 [V] or [1, V] with static sizes, got "
            f"{logits.data_type} {list(logits.shape)}"
        )
    greedy = temperature == 0.0 or top_k == 1
    ins = [logits]
    if not greedy:
        if rnd is None:
            raise TypeError(f"[{where}] sampling with temperature > 0 needs rnd (a float32 [1] uniform number)")
        b._operand(rnd, where, "rnd")
        if rnd.data_type != "float32" or tuple(rnd.shape) != (1,):
            raise TypeError(f"[{where}] rnd must be float32 [1], got {rnd.data_type} {list(rnd.shape)}")
        ins.append(rnd)
    V = logits.shape[-1]
    if V >= 1 << 31:
        raise TypeError(f"[{where}] a vocabulary of {V} does not fit int32 ids")
    attrs = {"greedy": greedy, "temperature": temperature, "top_k": 0 if top_k >= V else top_k, "top_p": top_p, "V": V}
    return b._emit1(where, ins, attrs, "int32", (1,), label)


@lowering("_sample_token")
def _lower(kc, node):
    a = node.attrs
    V = a["V"]
    p = {
        "V": V,
        "WG": WG,
        "CH": -(-V // WG),
        "greedy": a["greedy"],
        "top_k": a["top_k"],
        "top_p": a["top_p"],
        "TOP_P": f32_lit(a["top_p"]),
        "TEMP_INV": f32_lit(0.0 if a["greedy"] else 1.0 / a["temperature"]),
    }
    bindings = [Binding("logits", "f32")]
    args = [node.inputs[0]]
    if not a["greedy"]:
        bindings.append(Binding("rnd", "f32"))
        args.append(node.inputs[1])
    bindings.append(Binding("out", "i32", True))
    args.append(kc.out(node))
    mode = "greedy" if a["greedy"] else f"k{a['top_k']}_p{a['top_p']:g}"
    # loops of a thread (runtime/wgsl.py LOOP_BUDGET): the maximum, the sum, each of the 32 radix
    # rounds of top-k and of top-p walking V / WG logits (a tree of 8 each), two chunk walks and
    # the first thread's two walks over the WG chunk sums: past ~220000 logits refused
    ch, rounds = p["CH"], 32 * ((a["top_k"] > 0) + (a["top_p"] < 1.0))
    iters = (2 + rounds) * (ch + 10) + 2 * (ch + 1) + 2 * (WG + 1) + 16
    kc.launch(Kernel(f"llm_sample_{V}_{mode}", "llm_sample.wgsl", p, bindings), args, (1, 1, 1), iters=iters)
