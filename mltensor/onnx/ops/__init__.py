"""ONNX operator handlers: each maps one ONNX node onto MLGraphBuilder calls.

A handler `fn(im, node, ins, attrs) -> output value(s)` gets the Importer, the NodeProto, its input
values (numpy arrays for host constants, MLOperands, None for absent optional inputs) and its
parsed attributes. It returns MLOperands or numpy arrays. `@op(names, attrs=...)` registers it; an
attribute outside `attrs` fails at load. Version differences (attribute vs input, defaults) are
resolved with `im.cur_opset`.

One module per operator family, as in mltensor/ops/ (elementwise, compare, shape, movement,
indexing, reduce, normalization, matmul, conv, pool, resample, quantize, rnn, control_flow); this
package imports every family module; the registry is _registry.py, the helpers they share
_helpers.py (values), _window.py (convolution and pooling windows).
"""

from ._registry import HANDLERS, supported_ops  # noqa: F401 (the importer and the docs read them here)


# Import every family module so each registers its handlers (adding a family is adding a file).
def _load_families():
    import importlib
    import pkgutil

    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")


_load_families()
