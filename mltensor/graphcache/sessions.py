"""InferenceSession's use of the graph cache: a specialization built once on this machine loads in
a later process without importing the model.

An entry's key is the model's content (SHA-256 of the file, or of the bytes given: never a
path, so an edited file is a new model), the session options that change what is built
(free_dimensions, float16) and what the import of the specialization depended on (input shapes,
dynamic maxima, inputs fed by value). Its extra holds the specialization's inputs and outputs
(IOInfo, as plain data; outputs folded at load keep their values). A session also keeps a note
per model: inputs it learned must be known at load, and why the model cannot be built with
dynamic dimensions, so a later process does not find it out again by a failed import.
A ModelProto source has no stable bytes to key it and is never cached.
"""

import hashlib
import json
import os

import numpy as np

from . import store

_NOTE = "note"


def model_id(source, weights=None):
    """SHA-256 of a model's bytes (the mapped file when weights maps it), or None (also for a
    file that cannot be read: the importer reports that)."""
    try:
        return _model_id(source, weights)
    except OSError:
        return None


def _model_id(source, weights):
    if isinstance(source, (bytes, bytearray, memoryview)):
        return hashlib.sha256(source).hexdigest()
    if isinstance(source, (str, os.PathLike)):
        h = hashlib.sha256()
        buf = weights.main_buffer() if weights is not None else None
        if buf is not None:
            h.update(buf)
            weights.release()  # (hashing touched every page)
        else:
            with open(os.fspath(source), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 24), b""):
                    h.update(chunk)
        if weights is not None:  # external data files are part of the model
            for name, ident in weights.external_identities():
                h.update(f"{name}|{ident}".encode())
        return h.hexdigest()
    return None


# Switches read at build that change what a build makes (fusion, placement, the attention pass,
# the depthwise prologue, autotuning, sizes as launch parameters): a session started with other
# switches builds its own graph rather than loading one made under these. (The float16/int64
# modes are the context's, part of the adapter's folder in store.py.)
BUILD_SWITCHES = ("MLTENSOR_NO_FUSION", "MLTENSOR_NO_PLACEMENT", "MLTENSOR_NO_ATTENTION",
                  "MLTENSOR_FUSE_DEPTHWISE", "MLTENSOR_AUTOTUNE", "MLTENSOR_NO_SIZE_PARAMS")


def session_key(sess, what):
    opts = {"free": sorted(sess._free.items()), "float16": sess._float16, "kind": sess._kind,
            "switches": {k: os.environ[k] for k in BUILD_SWITCHES if os.environ.get(k)}}
    return f"session|{sess._cache_id}|{json.dumps(opts, sort_keys=True, default=str)}|{what}"


def spec_key(sess, shapes, values, dynamic, ones):
    def rows(d, f=repr):  # (repr: a damaged model's names and sizes need not be comparable)
        return sorted((repr(k), f(v)) for k, v in (d or {}).items())

    what = {"shapes": rows(shapes, lambda s: repr(list(s))), "values": rows(values, _array),
            "dynamic": rows(dynamic), "ones": rows(ones)}
    return session_key(sess, json.dumps(what, sort_keys=True, default=str))


def _array(a):
    a = np.asarray(a)
    return [a.dtype.str, list(a.shape), a.tobytes().hex()]


def _unarray(t):
    return np.frombuffer(bytes.fromhex(t[2]), dtype=np.dtype(t[0])).reshape(t[1]).copy()


def _io(infos):
    return [(i.name, i.onnx_type, i.data_type, tuple(i.shape), None if i.const is None else _array(i.const))
            for i in infos]


def _unio(rows):
    from ..onnx.importer import IOInfo

    return [IOInfo(n, t, dt, shape, None if c is None else _unarray(c)) for n, t, dt, shape, c in rows]


def load_spec(sess, key):
    """(graph, inputs, outputs, values) saved under key, or None."""
    try:
        hit = store.load(sess._ctx, key)
    except OSError:
        return None
    if hit is None:
        return None
    graph, extra = hit
    try:
        return graph, _unio(extra["inputs"]), _unio(extra["outputs"]), \
            {n: _unarray(v) for n, v in extra["values"].items()}
    except (KeyError, TypeError, ValueError):
        graph.destroy()
        return None


def save_spec(sess, key, graph, inputs, outputs, values):
    if graph is None:
        return
    extra = {"inputs": _io(inputs), "outputs": _io(outputs),
             "values": {n: _array(v) for n, v in values.items() if not n.startswith("__")}}
    import pickle

    import wgpu

    from ..errors import DOMException

    try:
        store.save(sess._ctx, key, graph, extra)
    except (OSError, pickle.PicklingError, DOMException, wgpu.GPUError):
        # a cache write is best effort: a read-only or full disk, or a device that fails the
        # constants' read-back, costs the next process a build, never this run its result (a
        # lost device says so at this run's own dispatch)
        pass


def load_note(sess):
    try:
        return store.load_note(sess._ctx, session_key(sess, _NOTE)) or {}
    except OSError:
        return {}


def save_note(sess, note):
    try:
        store.save_note(sess._ctx, session_key(sess, _NOTE), note)
    except OSError:
        pass
