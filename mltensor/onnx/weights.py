"""Weights read in place from the model file: the ModelProto keeps the graph, not the weights.

`onnx.load` copies every initializer into the protobuf (and numpy_helper.to_array copies it
again per import), so a session held the weights two or three times on the host besides the
copy the GPU needs. Instead, load_weights maps the file (or keeps the bytes the caller gave) and
scans its protobuf wire format for the top-level graph's initializers: each one holding at least
MIN_BYTES of raw_data is rewritten, in a small copy of the model that is then parsed, as ONNX
external data pointing into that map (location LOCATION, offset, length). The importer reads
them as read-only numpy views (Weights.raw), so an import touches the weights once, when
the build uploads them (runtime/constants.py), and the pages can be dropped afterwards
(release()). Models whose weights already live in external data files map those files the same
way instead of loading them into the proto.

Only raw_data is moved (what every exporter writes for large tensors); typed fields (float_data
...), subgraph initializers and small tensors stay in the proto. A file changed while a session
uses it is detected (size, mtime, inode) before each read and raises DataError instead of
reading torn data or crashing on a truncated map.
"""

import mmap
import os

from ..errors import DataError

MIN_BYTES = 1024
LOCATION = "<mltensor:model>"  # external_data location of a tensor moved out of the proto

# protobuf field numbers (onnx.proto)
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 9, 13, 14


class WireError(ValueError):
    """The bytes are not protobuf wire format (onnx.load then reports the model as malformed)."""


def _varint(buf, pos, end):
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _encode_varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, pos, end):
    """(field number, wire type, start of the field's key, start of its value, end of the field)
    for each field of the message in buf[pos:end]."""
    while pos < end:
        key_at = pos
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if wt == 0:
            _, nxt = _varint(buf, pos, end)
            yield num, wt, key_at, pos, nxt
        elif wt == 1:
            yield num, wt, key_at, pos, pos + 8
            nxt = pos + 8
        elif wt == 2:
            n, p = _varint(buf, pos, end)
            nxt = p + n
            yield num, wt, key_at, p, nxt
        elif wt == 5:
            nxt = pos + 4
            yield num, wt, key_at, pos, nxt
        else:
            raise WireError(f"wire type {wt}")
        if nxt > end:
            raise WireError("field runs past its message")
        pos = nxt


def _len_field(num, payload):
    return _encode_varint(num << 3 | 2) + _encode_varint(len(payload)) + payload


def _entry(key, value):
    return _len_field(1, key.encode()) + _len_field(2, value.encode())


def _tensor(buf, start, end, base, index):
    """A TensorProto's bytes, its raw_data moved out when big enough (recorded in `index`)."""
    raw = None
    external = False
    for num, wt, _, vs, ve in _fields(buf, start, end):
        if num == _TENSOR_RAW_DATA and wt == 2:
            raw = (vs, ve)
        elif num in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            external = True
    if raw is None or external or raw[1] - raw[0] < MIN_BYTES:
        return bytes(buf[start:end])
    out = bytearray()
    for num, wt, ks, vs, ve in _fields(buf, start, end):
        if num != _TENSOR_RAW_DATA:
            out += buf[ks:ve]
    off, n = base + raw[0], raw[1] - raw[0]
    out += _len_field(_TENSOR_EXTERNAL_DATA, _entry("location", LOCATION))
    out += _len_field(_TENSOR_EXTERNAL_DATA, _entry("offset", str(off)))
    out += _len_field(_TENSOR_EXTERNAL_DATA, _entry("length", str(n)))
    out += _encode_varint(_TENSOR_DATA_LOCATION << 3) + b"\x01"  # EXTERNAL
    index.append((off, n))
    return bytes(out)


def strip(buf):
    """(model bytes without the big raw_data of the top-level initializers, their (offset,
    length) in buf). Raises WireError when buf is not wire format."""
    end = len(buf)
    out = bytearray()
    index = []
    for num, wt, ks, vs, ve in _fields(buf, 0, end):
        if num != _MODEL_GRAPH or wt != 2:
            out += buf[ks:ve]
            continue
        graph = bytearray()
        for gnum, gwt, gks, gvs, gve in _fields(buf, vs, ve):
            if gnum == _GRAPH_INITIALIZER and gwt == 2:
                graph += _len_field(_GRAPH_INITIALIZER, _tensor(buf, gvs, gve, 0, index))
            else:
                graph += buf[gks:gve]
        out += _len_field(_MODEL_GRAPH, bytes(graph))
    return bytes(out), index


class Weights:
    """The buffers initializers are read from in place: the model file (or the caller's
    bytes) and the external data files it names, each mapped once."""

    def __init__(self, name, base_dir):
        self.name = name
        self.base_dir = base_dir
        self._maps = {}  # location -> (buffer, mmap or None, path or None, file identity)

    def add(self, location, buf, mm=None, path=None):
        self._maps[location] = (buf, mm, path, _identity(path) if path else None)

    def raw(self, location, offset, length):
        """A read-only memoryview of a tensor's bytes (length None: to the end of its file), or
        None when its file is not one this maps (then the loader's own rules apply)."""
        entry = self._maps.get(location)
        if entry is None:
            if location == LOCATION or self.base_dir is None:
                return None
            path = _external_path(self.base_dir, location)
            if path is None:
                raise DataError(
                    f"[onnx] {self.name}: external data location {location!r} lies outside the model's directory"
                )
            entry = self._map_file(location, path)
        buf, _, path, ident = entry
        if path is not None and _identity(path) != ident:
            raise DataError(
                f"[onnx] {self.name}: the file {path} changed since the session loaded it; "
                "create the InferenceSession again"
            )
        size = len(buf)
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise DataError(
                f"[onnx] {self.name}: a tensor's data (offset {offset}, length {length}) lies "
                f"outside its file ({size} bytes)"
            )
        return memoryview(buf)[offset : offset + length]

    def main_buffer(self):
        """The model file's (or the caller's) bytes, or None."""
        entry = self._maps.get(LOCATION)
        return entry[0] if entry is not None else None

    def main_identity(self):
        """(size, mtime, inode) of the model file when it was mapped, or None (bytes)."""
        entry = self._maps.get(LOCATION)
        return entry[3] if entry is not None else None

    def external_identities(self):
        """(location, (size, mtime, inode)) of the external data files mapped so far."""
        return [(loc, e[3]) for loc, e in sorted(self._maps.items()) if loc != LOCATION and e[3]]

    def _map_file(self, location, path):
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.add(location, mm if mm is not None else b"", mm, path)
        return self._maps[location]

    def release(self):
        """Drop the mapped pages from this process's memory (they stay in the page cache and
        come back on the next read): called once a build has uploaded the weights."""
        for _, mm, _, _ in self._maps.values():
            if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                try:
                    mm.madvise(mmap.MADV_DONTNEED)
                except (OSError, ValueError):
                    pass


def _identity(path):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _external_path(base_dir, location):
    """The path of an external data file, which must stay inside the model's directory (as
    onnx's own loader requires)."""
    if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        return None
    return os.path.join(base_dir, location)


def load(source, name):
    """(ModelProto, Weights) of a path or bytes, big top-level initializers left in the file
    (or the caller's buffer) and read in place. Raises WireError for bytes that are not
    protobuf wire format."""
    import onnx

    if isinstance(source, (bytes, bytearray, memoryview)):
        buf = source if isinstance(source, bytes) else bytes(source)
        base_dir, mm, path = None, None, None
    else:
        path = os.path.abspath(os.fspath(source))
        base_dir = os.path.dirname(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        buf = mm if mm is not None else b""
    stripped, _ = strip(memoryview(buf) if mm is None else buf)
    model = onnx.load_model_from_string(stripped)
    weights = Weights(name, base_dir)
    weights.add(LOCATION, buf, mm, path)
    return model, weights
