"""The ONNX backend test kit (onnx.backend.test.BackendTest) node cases, run on mltensor.

Out-of-scope cases are listed with reasons in mltensor/onnx/exclusions.py (the one place).

- Default run: a deterministic subset (at most 150 in-scope cases, round-robin over the op
  families in DEFAULT_MODULES). Generating cases costs time (onnx computes the expected outputs
  when a case module is imported), so only those modules are imported.
- `-m slow`: the full sweep through `BackendTest(backend, __name__)` (all ~1,900 node cases), which
  prints "passed / in-scope / all" and asserts at least 90% of the in-scope cases pass.
- As a script: `python tests/test_onnx_backend.py [--all] [-k REGEX] [--timeout S] [-v]` prints
  the same summary and the failures grouped by first error line.
"""

import collections
import functools
import importlib
import os
import re
import sys
import time
import unittest
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

warnings.filterwarnings("ignore", category=RuntimeWarning)

from onnx.backend.test import BackendTest  # noqa: E402

from mltensor.onnx.backend import MLTensorBackend  # noqa: E402
from mltensor.onnx.exclusions import exclusion_reason  # noqa: E402

# Case modules of onnx.backend.test.case.node the default run draws from (CNN and transformer
# building blocks first).
DEFAULT_MODULES = [
    "abs",
    "add",
    "averagepool",
    "batch_normalization",
    "cast",
    "clip",
    "concat",
    "conv",
    "convtranspose",
    "div",
    "elu",
    "equal",
    "erf",
    "exp",
    "expand",
    "flatten",
    "gather",
    "gemm",
    "gelu",
    "globalaveragepool",
    "globalmaxpool",
    "hardsigmoid",
    "hardswish",
    "identity",
    "instance_normalization",
    "layernormalization",
    "leakyrelu",
    "less",
    "lrn",
    "matmul",
    "max",
    "maxpool",
    "mean",
    "min",
    "mul",
    "neg",
    "not_",
    "pad",
    "pow",
    "prelu",
    "reciprocal",
    "reducemean",
    "reducesum",
    "reducemax",
    "relu",
    "reshape",
    "resize",
    "shape",
    "sigmoid",
    "slice",
    "softmax",
    "split",
    "sqrt",
    "squeeze",
    "sub",
    "sum",
    "tanh",
    "transpose",
    "unsqueeze",
    "where",
    "tile",
    "argmax",
    "cumsum",
    "softplus",
    "trilu",
    "depthtospace",
    "gathernd",
    "lstm",
    "gru",
    "einsum",
    "logsoftmax",
    "floor",
    "sin",
    "greater",
    "and_",
]
DEFAULT_LIMIT = 150


class CasesBackendTest(BackendTest):
    """BackendTest over a given list of node TestCases (instead of generating all of them)."""

    def __init__(self, backend, parent_module, cases):  # noqa: D107 (no super(): it loads everything)
        self.backend = backend
        self._parent_module = parent_module
        self._include_patterns, self._exclude_patterns, self._xfail_patterns = set(), set(), set()
        self._test_kwargs = {}
        self._test_items = collections.defaultdict(dict)
        for tc in cases:
            self._add_model_test(tc, "Node")


def _cases_of_modules(modules):
    import onnx.backend.test.case.node as node_pkg

    before = len(node_pkg._NodeTestCases)
    seen = {}
    for m in modules:
        n0 = len(node_pkg._NodeTestCases)
        importlib.import_module(f"onnx.backend.test.case.node.{m}")
        seen[m] = node_pkg._NodeTestCases[n0:]
    del before
    return seen


def default_cases():
    """Round-robin over DEFAULT_MODULES' in-scope cases (sorted by name), at most DEFAULT_LIMIT."""
    per = _cases_of_modules(DEFAULT_MODULES)
    queues = [
        sorted((c for c in per[m] if exclusion_reason(c.name) is None), key=lambda c: c.name) for m in DEFAULT_MODULES
    ]
    out = []
    i = 0
    while len(out) < DEFAULT_LIMIT and any(queues):
        q = queues[i % len(queues)]
        if q:
            out.append(q.pop(0))
        i += 1
    return sorted(out, key=lambda c: c.name)


def run_item(item):
    """Run one BackendTest item; returns (status, message): passed / failed / skipped."""
    try:
        item.func(None)
        return "passed", ""
    except unittest.SkipTest as e:
        return "skipped", str(e)
    except Exception as e:  # noqa: BLE001 (we tally every failure)
        msg = f"{type(e).__name__}: {e}".strip().splitlines()
        return "failed", msg[0] if msg else type(e).__name__


def cpu_items(bt):
    items = bt._test_items["NodeModel"]
    return {n: it for n, it in sorted(items.items()) if n.endswith("_cpu")}


def sweep(items, *, pattern=None, verbose=False, timeout=None, out=sys.stdout):
    """Run all in-scope items; returns (passed, in_scope, all, failures)."""
    passed = in_scope = 0
    failures = {}
    t_start = time.time()
    names = [n for n in items if pattern is None or re.search(pattern, n)]
    for name in names:
        if exclusion_reason(name):
            continue
        if timeout and time.time() - t_start > timeout:
            print(f"[timeout] stopped after {in_scope} cases", file=out)
            break
        in_scope += 1
        t0 = time.time()
        status, msg = run_item(items[name])
        if status == "passed":
            passed += 1
        else:
            failures[name] = msg
        if verbose:
            print(f"{status:7s} {time.time() - t0:6.2f}s {name} {msg[:200]}", file=out, flush=True)
    return passed, in_scope, len(names), failures


def summary(passed, in_scope, total, failures, out=sys.stdout):
    pct = 100.0 * passed / max(in_scope, 1)
    print(
        f"ONNX node conformance: {passed} passed / {in_scope} in-scope / {total} all cases ({pct:.1f}% of in-scope)",
        file=out,
    )
    groups = collections.defaultdict(list)
    for n, m in failures.items():
        groups[re.sub(r"\d+", "N", m)[:160]].append(n)
    for m, ns in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ns):4d}  {m}\n        {' '.join(ns[:8])}{' ...' if len(ns) > 8 else ''}", file=out)


# Every node case with a float16 input or output (in these modules) runs by default too: float16
# computes in f16 where the context has "shader-f16" (tests/test_f16.py).
FLOAT16_MODULES = [
    "attention",
    "cast",
    "castlike",
    "celu",
    "dequantizelinear",
    "isinf",
    "isnan",
    "max",
    "min",
    "mod",
    "rangeop",
    "swiglu",
]


def float16_cases():
    """In-scope node cases of FLOAT16_MODULES whose graph has a float16 input or output."""
    import onnx
    import onnx.backend.test.case.node as node_pkg

    for m in FLOAT16_MODULES:
        importlib.import_module(f"onnx.backend.test.case.node.{m}")
    f16 = onnx.TensorProto.FLOAT16

    def uses_f16(tc):
        g = tc.model.graph if tc.model is not None else None
        return g is not None and any(v.type.tensor_type.elem_type == f16 for v in list(g.input) + list(g.output))

    out = {c.name: c for c in node_pkg._NodeTestCases if exclusion_reason(c.name) is None and uses_f16(c)}
    return [out[n] for n in sorted(out)]


# -- pytest ------------------------------------------------------------------------------------


@functools.cache
def _items(kind):
    """{name: runnable case} of the default sweep ("default") or the float16 cases ("float16")."""
    cases = default_cases() if kind == "default" else float16_cases()
    return cpu_items(CasesBackendTest(MLTensorBackend, __name__, cases))


def _names(kind):
    try:
        return list(_items(kind))
    except Exception as e:  # pragma: no cover - keep collection alive
        return [f"collection_error: {e}"]


@pytest.mark.parametrize("name", _names("default"))
def test_node_case(name):
    status, msg = run_item(_items("default")[name])
    if status == "skipped":
        pytest.skip(msg)
    assert status == "passed", msg


# Known float16 failures (strict xfail: a fix makes them fail until removed here).
FLOAT16_KNOWN = {
    # f16 mode only: intermediate results are float16 (as in WebNN implementations); 2 of 192
    # outputs are 2 float16 ulps (4.9e-4) off, past the kit's rtol 1e-3 (tests/test_f16.py bounds
    # accumulating families at 1e-2); the f32 mode passes
    "test_attention_4d_causal_fp16_cpu": "f16",
    "test_attention_4d_causal_fp16_expanded_cpu": "f16",
    # both modes, and on main before float16 compute: importer bugs unrelated to float16
    # (Mod fmod=1 gives NaN for x % inf and 0 for -0; the expanded Range computes a wrong shape)
    "test_mod_float_edge_cases_fmod_0_float16_cpu": "any",
    "test_range_float16_type_positive_delta_expanded_cpu": "any",
}


@pytest.mark.parametrize("name", _names("float16"))
def test_node_case_float16(name):
    from mltensor.session import default_context

    known = FLOAT16_KNOWN.get(name)
    known = known == "any" or (known == "f16" and default_context()._f16)
    status, msg = run_item(_items("float16")[name])
    if known:
        assert status != "passed", f"{name} passes now: remove it from FLOAT16_KNOWN"
        pytest.xfail(f"known float16 failure (FLOAT16_KNOWN): {msg}")
    if status == "skipped":
        pytest.skip(msg)
    assert status == "passed", msg


@pytest.mark.slow
def test_full_node_sweep(capsys):
    bt = BackendTest(MLTensorBackend, __name__)
    items = cpu_items(bt)
    passed, in_scope, total, failures = sweep(items)
    with capsys.disabled():
        summary(passed, in_scope, total, failures)
    assert passed >= 0.9 * in_scope, f"{passed}/{in_scope} in-scope node cases pass (< 90%)"


def test_exclusions_have_reasons():
    from mltensor.onnx.exclusions import EXCLUDED

    for pat, reason in EXCLUDED:
        re.compile(pat)
        assert reason and "\n" not in reason


def test_backend_run_node():
    from onnx import helper

    node = helper.make_node("Relu", ["x"], ["y"])
    x = np.array([[-1.0, 2.0]], dtype=np.float32)
    (y,) = MLTensorBackend.run_node(node, [x])
    assert y.shape == (1, 2)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, [[0.0, 2.0]])
    assert MLTensorBackend.supports_device("CPU")
    assert not MLTensorBackend.supports_device("CUDA")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="every node case (BackendTest), not the default subset")
    ap.add_argument("-k", dest="pattern", help="regex over case names")
    ap.add_argument("--timeout", type=float, help="stop after this many seconds")
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    t = time.time()
    items = cpu_items(BackendTest(MLTensorBackend, __name__)) if a.all else _items("default")
    print(f"loaded {len(items)} cases in {time.time() - t:.1f}s", flush=True)
    res = sweep(items, pattern=a.pattern, verbose=a.v, timeout=a.timeout)
    summary(*res)
