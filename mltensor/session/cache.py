"""InferenceSession's use of the graph cache: a specialization built once on this machine loads in
a later process without importing the model.

An entry's key is the model's content (SHA-256 of the file, or of the bytes given: never a
path, so an edited file is a new model), the session options that change what is built
(free_dimensions, float16) and what the import of the specialization depended on (input shapes,
dynamic maxima, inputs fed by value). Its extra holds the specialization's inputs and outputs
(IOInfo, as plain data; outputs folded at load keep their values). A session also keeps a note
per model: inputs it learned must be known at load, and why the model cannot be built with
dynamic dimensions, so a later process does not find it out again by a failed import; and a
description of the model (its inputs, outputs and symbolic shapes: see described), so a later
process whose builds all load from here neither imports onnx nor parses the model.
A ModelProto source has no stable bytes to key it and is never cached. A TFLite model run as
stages saves each stage's graph under `stage_key` (its import still runs: it gives the cuts);
an ONNX model's stages are not cached.
"""

import hashlib
import json
import mmap
import os

import numpy as np

from .. import switches
from ..errors import DOMException
from ..onnxio import NUMPY, IOInfo
from ..front.graph import MLGraph, program_of
from ..graphcache import store

_NOTE = "note"


def model_id(source, weights=None):
    """SHA-256 of a model's bytes (the mapped file when weights maps it), or None (also for a
    file that cannot be read: the importer reports that)."""
    ids = model_ids(source, weights)
    return ids[1] if ids is not None else None


def model_ids(source, weights=None, main=None):
    """(id of the main bytes alone, model id), or None: the model id also covers the external
    data files weights mapped (their identities), the first keys the description note. main:
    (hash, identity) of the bytes `described` read, not hashed again if weights mapped them."""
    try:
        if main is not None and weights is not None and weights.main_identity() == main[1]:
            h = main[0]
        else:
            h = _main_hash(source, weights)
    except OSError:
        return None
    if h is None:
        return None
    return h.hexdigest(), _with_externals(h, weights.external_identities() if weights is not None else ())


def _main_hash(source, weights):
    if isinstance(source, (bytes, bytearray, memoryview)):
        return hashlib.sha256(source)
    if isinstance(source, (str, os.PathLike)):
        buf = weights.main_buffer() if weights is not None else None
        if buf is None:
            return _hash_file(os.fspath(source))[0]
        h = hashlib.sha256(buf)
        weights.release()  # (hashing touched every page)
        return h
    return None


def _hash_file(path):
    """(sha256 object of the file's bytes, its identity as onnx/weights.py takes it). Hashed
    from a map of the file, unmapped at once: no copy of the model on the host."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not st.st_size:
            return hashlib.sha256(), (st.st_size, st.st_mtime_ns, st.st_ino)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            h = hashlib.sha256(mm)
    return h, (st.st_size, st.st_mtime_ns, st.st_ino)


def _with_externals(h, identities):
    h = h.copy()
    for name, ident in identities:  # external data files are part of the model
        h.update(f"{name}|{ident}".encode())
    return h.hexdigest()


# Switches read at build that change what a build makes (the one list: mltensor/switches.py):
# a session started with other switches builds its own graph rather than loading one made under
# these. (The float16/int64 modes are also the context's, part of the adapter's folder in store.py.)
BUILD_SWITCHES = switches.BUILD_SWITCHES


def session_key(sess, what, model=None):
    opts = {
        "free": sorted(sess._free.items()),
        "float16": sess._float16,
        "kind": sess._kind,
        "switches": {k: os.environ[k] for k in BUILD_SWITCHES if os.environ.get(k)},
    }
    return f"session|{model or sess._cache_id}|{json.dumps(opts, sort_keys=True, default=str)}|{what}"


def spec_key(sess, shapes, values, dynamic, ones):
    def rows(d, f=repr):  # (repr: a damaged model's names and sizes need not be comparable)
        return sorted((repr(k), f(v)) for k, v in (d or {}).items())

    what = {
        "shapes": rows(shapes, lambda s: repr(list(s))),
        "values": rows(values, _array),
        "dynamic": rows(dynamic),
        "ones": rows(ones),
    }
    return session_key(sess, json.dumps(what, sort_keys=True, default=str))


def stage_key(sess, snapshot):
    """The key of a staged TFLite model's stage (tflite/staged.py): the session's, and the
    snapshot the stage resumes from (where, and the outcomes of the cuts passed: the bytes read
    back, the loops' carried values), which with the model decide its import. A value that is not
    plain data keys by its repr: a miss, never a wrong hit."""

    def value(v):
        return _array(v) if isinstance(v, (np.ndarray, np.generic, bool, int, float)) else repr(v)

    rows = sorted(
        (
            repr(k),
            [value(v) for v in vals],
            [
                [c.avail, c.data_type, list(c.shape), c.is_bool, None if c.host is None else value(c.host)]
                for c in carried
            ],
        )
        for k, (vals, carried) in snapshot.outcomes.items()
    )
    inner = snapshot.inner[0] if snapshot.inner is not None else None
    where = {"at": snapshot.index, "inner": inner, "outcomes": rows}
    return session_key(sess, "tflite-stage|" + json.dumps(where, sort_keys=True, default=str))


def _array(a):
    a = np.asarray(a)
    return [a.dtype.str, list(a.shape), a.tobytes().hex()]


def _unarray(t):
    return np.frombuffer(bytes.fromhex(t[2]), dtype=np.dtype(t[0])).reshape(t[1]).copy()


def _io(infos):
    return [
        (i.name, i.onnx_type, i.data_type, tuple(i.shape), None if i.const is None else _array(i.const)) for i in infos
    ]


def _unio(rows):
    return [IOInfo(n, t, dt, shape, None if c is None else _unarray(c)) for n, t, dt, shape, c in rows]


def load_spec(sess, key):
    """(graph, inputs, outputs, values) saved under key, or None."""
    try:
        hit = store.load(sess._ctx, key)
    except OSError:
        return None
    if hit is None:
        return None
    program, extra = hit
    graph = MLGraph(sess._ctx, program)
    try:
        return (
            graph,
            _unio(extra["inputs"]),
            _unio(extra["outputs"]),
            {n: _unarray(v) for n, v in extra["values"].items()},
        )
    except (KeyError, TypeError, ValueError):
        graph.destroy()
        return None


def save_spec(sess, key, graph, inputs, outputs, values):
    if graph is None:
        return
    extra = {
        "inputs": _io(inputs),
        "outputs": _io(outputs),
        "values": {n: _array(v) for n, v in values.items() if not n.startswith("__")},
    }
    import pickle

    import wgpu

    try:
        store.save(sess._ctx, key, program_of(graph), extra)
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


# The description note: what InferenceSession learns of an ONNX model from its proto before it
# can look a build up (onnx/importer.io_description: inputs, outputs, symbolic shapes), and the
# external data files the model id covers. Keyed by the main bytes' id (the proto's), so a
# later process describes the session from it without importing onnx or parsing the model,
# which it does only when it builds (InferenceSession._proto). A note of another version, or
# that is not what save_description writes, is ignored: the proto is read as without one.
_DESCRIPTION = "description"
DESCRIPTION_VERSION = 1


def save_description(sess, main_id, desc, weights):
    if any(et and et not in NUMPY for _, et in desc["inputs"]):
        return  # (an input of a type onnx alone maps to numpy: described from the proto)
    externals = [name for name, _ in weights.external_identities()] if weights is not None else []
    try:
        store.save_note(
            sess._ctx,
            session_key(sess, _DESCRIPTION, main_id),
            dict(desc, version=DESCRIPTION_VERSION, externals=externals),
        )
    except OSError:
        pass


def described(sess):
    """(model id, description, main) of sess._source (a path or bytes) from its description
    note; model id and description None without a valid note (or with an external data file
    gone: the proto path says what is wrong). main: (hash of the model's bytes, the file's
    identity), None for a file that cannot be read: what same_model checks a proto parsed
    later against (and model_ids need not hash again)."""
    src = sess._source
    try:
        if isinstance(src, bytes):
            h, ident, base = hashlib.sha256(src), None, None
        elif isinstance(src, (str, os.PathLike)):
            h, ident = _hash_file(os.fspath(src))
            base = os.path.dirname(os.path.abspath(os.fspath(src)))
        else:
            return None, None, None
    except OSError:
        return None, None, None
    try:
        desc = _valid_description(store.load_note(sess._ctx, session_key(sess, _DESCRIPTION, h.hexdigest())))
        if desc is None or (desc["externals"] and base is None):
            return None, None, (h, ident)
        ids = []
        for name in desc["externals"]:
            st = os.stat(os.path.join(base, name))  # (a location load_model accepted)
            ids.append((name, (st.st_size, st.st_mtime_ns, st.st_ino)))
    except OSError:
        return None, None, (h, ident)
    return _with_externals(h, ids), desc, (h, ident)


def same_model(sess, weights, main):
    """Whether the model load_model mapped for a session described from its note (main: from
    described) is the one it was described as: the same file, the same external data files."""
    h, ident = main
    if weights is None:
        return True
    if ident is not None and weights.main_identity() != ident:
        return False
    return _with_externals(h, weights.external_identities()) == sess._cache_id


def _valid_description(note):
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    def strs(v):
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    if not isinstance(note, dict) or note.get("version") != DESCRIPTION_VERSION:
        return None
    shapes, params = note.get("shapes"), note.get("params")
    inputs, outputs = note.get("inputs"), note.get("outputs")
    if not (
        isinstance(shapes, dict)
        and isinstance(params, dict)
        and shapes.keys() == params.keys()
        and isinstance(inputs, list)
        and isinstance(outputs, list)
        and strs(note.get("externals"))
    ):
        return None
    for name, dims in shapes.items():
        syms = params[name]
        if dims is None and syms is None:
            continue
        if not (
            isinstance(dims, list)
            and isinstance(syms, list)
            and len(dims) == len(syms)
            and all(d is None or (is_int(d) and d > 0) for d in dims)
            and all(p is None or (isinstance(p, str) and p) for p in syms)
        ):
            return None
    for row in inputs:
        if not (
            isinstance(row, list)
            and len(row) == 2
            and isinstance(row[0], str)
            and row[0] in shapes
            and is_int(row[1])
            and (row[1] == 0 or row[1] in NUMPY)
        ):
            return None
    for row in outputs:
        if not (
            isinstance(row, list)
            and len(row) == 3
            and isinstance(row[0], str)
            and is_int(row[1])
            and isinstance(row[2], list)
            and all(is_int(d) or isinstance(d, str) for d in row[2])
        ):
            return None
    return note
