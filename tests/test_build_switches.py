"""The environment switches that change what a build makes (mltensor/switches.py): one list, read
only through `switch()` / `value()`, and the graph cache's session key derived from it. Needs no
GPU: it reads the package's source with `ast`."""

import ast
import os
import re
import types

import pytest

from mltensor import switches
from mltensor.session import cache as sessions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "mltensor")
NAME_RE = re.compile(r"MLTENSOR_[A-Z0-9_]+")

# The other MLTENSOR_* variables the package reads, each with why it is no build switch (it does
# not change the kernels or the graph a build makes). A new variable goes here or into
# switches.BUILD_SWITCHES.
OTHER = {
    "MLTENSOR_CACHE": "where the caches live",
    "MLTENSOR_CACHE_MAX_BYTES": "the graph cache's size bound",
    "MLTENSOR_GRAPH_CACHE": "whether sessions use the graph cache at all",
    "MLTENSOR_COMPILE_THREADS": "how many threads compile the same kernels",
    "MLTENSOR_DUMP_WGSL": "what a compile error says",
    "MLTENSOR_NO_NATIVE_REPLAY": "how a dispatch replays its launches (C or Python), not what they are",
    "MLTENSOR_LOOP_CAP": "whether a build is refused; a build that succeeds makes the same kernels",
    "MLTENSOR_AUTOTUNE_BUDGET": "time spent tuning (time-dependent choices cannot be a key)",
    "MLTENSOR_API_KEY": "the key mltensor serve asks clients for",
    "MLTENSOR_LLAMA_CPP_PYTHON": "the interpreter llama.cpp runs in for the tests and the bench",
    "MLTENSOR_IREE_PYTHON": "which interpreter runs the corpus benchmark's IREE peer (bench/, not a build)",
    "MLTENSOR_LITERT_TORCH_PYTHON": "which Python the tests convert torchvision models with (tests only)",
}

_READERS = ("switch", "value")


def _names_in_code():
    """[(name, path:line, read through switch()/value())] for every string constant in the
    package that is exactly an MLTENSOR_* name (docstrings and messages mention them in passing,
    as longer strings)."""
    found = []
    for d, _, files in os.walk(PKG):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
            through = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    fn = node.func
                    name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
                    if name in _READERS:
                        through.update(id(a) for a in node.args)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME_RE.fullmatch(node.value):
                    where = f"{os.path.relpath(path, ROOT)}:{node.lineno}"
                    found.append((node.value, where, id(node) in through))
    return found


def test_build_switches_are_read_only_through_the_list():
    """A build switch read from os.environ directly (or handed around as a string) would escape
    the graph cache's key: every use of its name is an argument of switch() / value()."""
    found = _names_in_code()
    assert any(n == "MLTENSOR_NO_DERIVED_SIZES" for n, _, _ in found)  # (the scan sees the code)
    direct = [
        f"{n} at {w}"
        for n, w, ok in found
        if n in switches.BUILD_SWITCHES and not ok and not w.startswith(os.path.join("mltensor", "switches.py"))
    ]
    assert not direct, "read these through mltensor.switches.switch(): " + ", ".join(direct)
    unknown = sorted({f"{n} at {w}" for n, w, _ in found if n not in switches.BUILD_SWITCHES and n not in OTHER})
    assert not unknown, (
        "new MLTENSOR_* variables: add each to switches.BUILD_SWITCHES if it changes what a "
        "build makes, else to OTHER here: " + ", ".join(unknown)
    )
    # every listed switch is read somewhere (no stale entries), and OTHER names no build switch
    read = {n for n, _, ok in found if ok}
    assert set(switches.BUILD_SWITCHES) <= read, set(switches.BUILD_SWITCHES) - read
    assert not set(OTHER) & set(switches.BUILD_SWITCHES)


def test_switch_refuses_a_name_not_in_the_list(monkeypatch):
    monkeypatch.setenv("MLTENSOR_NO_DERIVED_SIZES", "1")
    assert switches.switch("MLTENSOR_NO_DERIVED_SIZES")
    monkeypatch.setenv("MLTENSOR_NO_DERIVED_SIZES", "0")
    assert not switches.switch("MLTENSOR_NO_DERIVED_SIZES")
    with pytest.raises(KeyError, match="not a build switch"):
        switches.switch("MLTENSOR_NO_SUCH_SWITCH")
    with pytest.raises(KeyError, match="not a build switch"):
        switches.value("MLTENSOR_CACHE")


def test_session_key_changes_with_every_build_switch(monkeypatch):
    """The graph cache keys a session's graphs on the switches set: a build under
    MLTENSOR_NO_DERIVED_SIZES=1 (or any other listed switch) is never loaded without it."""
    assert tuple(sessions.BUILD_SWITCHES) == switches.BUILD_SWITCHES
    for name in switches.BUILD_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    sess = types.SimpleNamespace(_free={}, _float16=False, _kind="onnx", _cache_id="model")
    plain = sessions.session_key(sess, "spec")
    keys = {plain}
    for name in switches.BUILD_SWITCHES:
        monkeypatch.setenv(name, "1")
        keys.add(sessions.session_key(sess, "spec"))
        monkeypatch.delenv(name)
    assert len(keys) == len(switches.BUILD_SWITCHES) + 1
    assert sessions.session_key(sess, "spec") == plain
    monkeypatch.setenv("MLTENSOR_NO_DERIVED_SIZES", "1")
    assert sessions.session_key(sess, "spec") != plain
    assert switches.build_key() == {"MLTENSOR_NO_DERIVED_SIZES": "1"}
