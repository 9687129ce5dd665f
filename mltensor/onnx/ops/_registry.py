"""The registry of ONNX operator handlers: `@op(names, attrs=...)` registers a handler under
its ONNX op type (contrib operators as "com.microsoft.<OpType>"); the importer looks a node's
handler up in HANDLERS by handler_key(node)."""


class Handler:
    __slots__ = ("fn", "attrs")

    def __init__(self, fn, attrs):
        self.fn, self.attrs = fn, attrs


HANDLERS = {}


def op(*names, attrs=()):
    def deco(fn):
        for n in names:
            HANDLERS[n] = Handler(fn, set(attrs) if attrs is not None else None)
        return fn

    return deco


def supported_ops() -> list[str]:
    """The ONNX operators the importer maps. Operators that ONNX defines as functions of these are
    expanded at load too, and are not listed.

    Returns
    -------
    list of str
        Sorted: op types of the default domain ("Conv"), and onnxruntime's contrib operators as
        "com.microsoft.<OpType>".
    """
    return sorted(HANDLERS)


# onnxruntime's contrib operators (com.microsoft): their handlers register as
# "com.microsoft.<OpType>" (onnx/ops/contrib_*.py), next to the default domain's plain names
CONTRIB = "com.microsoft"


def handler_key(node):
    """The HANDLERS key of a node: its op type in the default domain, "<domain>.<op type>" in
    the contrib domain, None in any other."""
    if node.domain in ("", "ai.onnx"):
        return node.op_type
    if node.domain == CONTRIB:
        return f"{CONTRIB}.{node.op_type}"
    return None
