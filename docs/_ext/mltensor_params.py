"""The parameter check of the API reference (issue 46): every public callable's docstring lists
each of its parameters with a type, numpydoc style (rendered as tables by sphinx.ext.napoleon),
and a Returns section when it returns something. Shared by the docs extension (a warning per
problem: an error under -W) and tests/test_docs.py (no Sphinx needed, in the default run).

Public callables: everything `mltensor_docs.public_names()` walks (what `mltensor/__init__.py`
exports, the members of its classes, the `__all__` of its modules: mltensor.onnx, tflite,
models), every MLGraphBuilder operator method, the classes of mltensor.llm and its serving engine
that the reference pages document (LLM_PUBLIC, with the members listed there), and the rest of
mltensor.llm's `__all__` (its building blocks, with their public members). A class documents its constructor's parameters in its
own docstring, as numpydoc does, unless users never construct it (NO_CONSTRUCTOR).
"""

import inspect
import re
import types

# mltensor.llm: the classes api-llm.rst documents (names under mltensor.llm, the serving engine's
# under mltensor.llm.engine), with the members it lists
LLM_PUBLIC = {
    "LLM": ["generate", "chat", "conversation", "tokenize", "detokenize", "apply_chat_template", "build"],
    "Conversation": ["say", "reset", "stats"],
    "GGUFTokenizer": ["encode", "encode_chat", "decode", "apply_chat_template"],
    "engine.Engine": ["submit", "metrics", "shutdown"],
    "engine.Request": ["done", "cancel", "wait"],
    "engine.QueueFull": [],
    "engine.EngineClosed": [],
}

_SECTION = re.compile(r"^(\w[\w ]*)\n-{3,}$", re.MULTILINE)
_ENTRY = re.compile(r"^(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::\s*(.*))?$")


def sections(doc):
    """{section title: body text} of a numpydoc docstring (the summary under "")."""
    doc = inspect.cleandoc(doc or "")
    out, last, title = {}, 0, ""
    for m in _SECTION.finditer(doc):
        out[title] = doc[last : m.start()]
        title, last = m.group(1).strip(), m.end()
    out[title] = doc[last:]
    return out


def documented(doc):
    """{parameter name: its type text or ""} from the Parameters section of `doc`."""
    body = sections(doc).get("Parameters", "")
    out = {}
    for line in body.splitlines():
        if not line.strip() or line[0].isspace():
            continue
        m = _ENTRY.match(line.strip())
        if m:
            for name in m.group(1).split(","):
                out[name.strip().lstrip("*")] = (m.group(2) or "").strip()
    return out


def problems(full, obj, cls_no_constructor=(), method=False):
    """What `obj`'s docstring lacks: a list of strings, empty when complete."""
    if isinstance(obj, property) or isinstance(obj, types.ModuleType):
        return []
    if inspect.isclass(obj):
        if issubclass(obj, BaseException) or full in cls_no_constructor:
            return []
        target, doc = obj.__init__, obj.__doc__
        if target is object.__init__:
            return []
    elif callable(obj):
        target, doc = obj, obj.__doc__
    else:
        return []
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    params = [
        p
        for i, p in enumerate(sig.parameters.values())
        if not (i == 0 and (method or p.name in ("self", "cls")))
        and not p.name.startswith("_")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    have = documented(doc)
    out = []
    for p in params:
        if p.name not in have:
            out.append(f"parameter {p.name!r} is not documented")
        elif not have[p.name]:
            out.append(f"parameter {p.name!r} has no type")
    if not inspect.isclass(obj):
        ret = sig.return_annotation
        returns_value = ret not in (None, "None", inspect.Signature.empty)
        if ret is inspect.Signature.empty:
            out.append("no return annotation")
        if returns_value and "Returns" not in sections(doc) and "Yields" not in sections(doc):
            out.append("no Returns section")
    return out


def public_callables():
    """(dotted name, object) of every public callable the reference documents."""
    import mltensor
    import mltensor_docs

    out = [(full, obj) for full, obj, _ in mltensor_docs.public_names()]
    seen = {full for full, _ in out}
    for name in sorted(vars(mltensor.MLGraphBuilder)):
        full = f"mltensor.MLGraphBuilder.{name}"
        if not name.startswith("_") and full not in seen:
            out.append((full, getattr(mltensor.MLGraphBuilder, name)))
    try:
        from mltensor import llm
        from mltensor.llm import engine  # noqa: F401 (the serving engine's page section)
    except Exception:  # the llm extra missing: its pages are skipped too
        return out
    for cls_name, members in LLM_PUBLIC.items():
        cls = llm
        for part in cls_name.split("."):
            cls = getattr(cls, part)
        out.append((f"mltensor.llm.{cls_name}", cls))
        out += [(f"mltensor.llm.{cls_name}.{m}", inspect.getattr_static(cls, m)) for m in members]
    for name in llm.__all__:  # the building blocks (GGUFFile, LlamaModel, Sampler, ...)
        obj = getattr(llm, name)
        if name in LLM_PUBLIC or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        out.append((f"mltensor.llm.{name}", obj))
        if inspect.isclass(obj):
            out += [(full, v) for full, v, _ in mltensor_docs._members(f"mltensor.llm.{name}", obj)]
    return out


def undocumented_params(pending=()):
    """{dotted name: [problems]} for every public callable with an incomplete docstring, except
    the names in `pending`."""
    import mltensor_docs

    out = {}
    found = public_callables()
    classes = {full for full, obj in found if inspect.isclass(obj)}
    for full, obj in found:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if full in pending:
            continue
        p = problems(full, obj, mltensor_docs.NO_CONSTRUCTOR, method=full.rpartition(".")[0] in classes)
        if p:
            out[full] = p
    return out
