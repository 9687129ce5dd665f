"""GGUF files read by mltensor/llm/gguf.py's read_gguf (straight from the mapped file) against the
gguf package's own GGUFReader on the same file: the same metadata (keys, values, Python types)
and tensors (type, shape, dtype, bytes); a big-endian file goes through GGUFReader itself;
malformed files are DataErrors."""

import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from llm_reference import write_synthetic  # noqa: E402

from mltensor.errors import DataError  # noqa: E402
from mltensor.llm.gguf import GGUFFile  # noqa: E402
from mltensor.models import FetchError, fetch_vocab  # noqa: E402


def _reference(path):
    """(metadata, tensors) as the gguf package's GGUFReader gives them."""
    r = gguf.GGUFReader(path, "r")
    meta = {k: f.contents() for k, f in r.fields.items()}
    tensors = {
        t.name: (t.tensor_type.name, tuple(int(x) for x in reversed(t.shape.tolist())), t.data) for t in r.tensors
    }
    return meta, tensors


def _same(path):
    f = GGUFFile(path)
    meta, tensors = _reference(path)
    assert list(f.metadata) == list(meta)
    for k, v in meta.items():
        got = f.metadata[k]
        assert got == v and type(got) is type(v), (k, got, v)
        if isinstance(v, list) and v:
            assert {type(x) for x in got} == {type(x) for x in v}, k
    assert list(f.tensors) == list(tensors)
    for name, (kind, shape, data) in tensors.items():
        k2, s2, d2 = f.tensors[name]
        assert (k2, s2, d2.dtype, d2.shape) == (kind, shape, data.dtype, data.shape), name
        assert np.array_equal(np.asarray(d2).view(np.uint8), np.asarray(data).view(np.uint8)), name
    return f


def _every_value_type(path, endianess=None):
    kw = {} if endianess is None else {"endianess": endianess}
    w = gguf.GGUFWriter(path, "llama", **kw)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "naïve 日本 🤗")
    w.add_array("t.strs", ["", "a b", "▁x", "日本語"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    rng = np.random.default_rng(0)
    w.add_tensor("dense", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("half", rng.standard_normal((2, 32)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_metadata_of_every_value_type(tmp_path):
    f = _same(_every_value_type(str(tmp_path / "v.gguf")))
    assert f.get("t.str") == "naïve 日本 🤗" and f.get("t.u64") == 2**63 + 5 and f.get("t.bool") is True


def test_every_block_format(tmp_path):
    types = {"attn_q": "Q4_K", "attn_k": "Q6_K", "attn_v": "Q5_0", "attn_output": "BF16", "ffn_down": "IQ4_XS"}
    _same(write_synthetic(str(tmp_path / "s.gguf"), hidden=256, ffn=256, vocab=64, types=types, output="Q6_K"))
    _same(write_synthetic(str(tmp_path / "d.gguf")))


def test_a_real_vocabulary(tmp_path):
    try:
        path = fetch_vocab("llama-spm", progress=False)
    except FetchError as e:
        pytest.skip(f"llama.cpp's vocabularies cannot be fetched: {e}")
    assert len(_same(path).get("tokenizer.ggml.tokens")) == 32000


def test_big_endian_goes_through_the_gguf_reader(tmp_path):
    path = _every_value_type(str(tmp_path / "be.gguf"), gguf.GGUFEndian.BIG)
    f = GGUFFile(path)
    assert f.get("t.str") == "naïve 日本 🤗" and f.get("t.i64") == -(2**62)
    assert f.tensors["dense"][2].shape == (3, 64)


def test_malformed(tmp_path):
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    cases = {
        "string past the end": head + struct.pack("<Q", 1000) + b"key",
        "unknown value type": head + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99) + b"\0" * 8,
        "array past the end": head + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 10**6),
        "bad UTF-8": head + struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<I", 4) + b"\0" * 4,
        "version": b"GGUF" + struct.pack("<IQQ", 7, 0, 0),
        "empty": b"",
    }
    for what, data in cases.items():
        p = tmp_path / "m.gguf"
        p.write_bytes(data)
        with pytest.raises(DataError):
            GGUFFile(str(p))
        assert what
    twice = tmp_path / "twice.gguf"  # one key given twice
    kv = struct.pack("<Q", 1) + b"k" + struct.pack("<II", 4, 7)
    twice.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv + kv)
    with pytest.raises(DataError, match="twice"):
        GGUFFile(str(twice))
