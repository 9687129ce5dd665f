"""The modules an InferenceSession imports on first use only: a process whose builds all come
from the graph cache (session/cache.py) never imports onnx, jinja2 or the TFLite reader
(tests/test_graph_cache.py checks it). Each accessor imports its module once and returns it.
"""


def importer():
    """mltensor.onnx.importer: imports onnx (and the operator families); needed only to parse
    the model or build something the graph cache does not hold."""
    from ..onnx import importer  # start-up: a cache hit never imports onnx

    return importer


def stages():
    """mltensor.stages.plan: a staged model's run (its loops import onnx); a staged
    specialization is never loaded from the cache, so it exists only after an import."""
    from ..stages import plan  # start-up: pulls onnx in (stages/loop.py builds ONNX bodies)

    return plan


def tflite():
    """mltensor.tflite: the TFLite reader and importer (the tflite package)."""
    from .. import tflite  # start-up: a TFLite session loaded from the cache never reads the file

    return tflite
