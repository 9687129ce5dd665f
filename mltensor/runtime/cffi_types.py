"""Faster first use of wgpu-py's C struct types (a start-up cost, not a per-call one).

wgpu-py builds every WebGPU call's descriptor with `ffi.new("WGPUXxxDescriptor *")`. cffi parses
each distinct type string once per process with pycparser, and before parsing it re-declares
every typedef the ffi knows (936 for wgpu-native's headers) so that pycparser can tell type
names from variables: about 12 ms a type, some 25 types on a model's first build and run,
0.3 s of every process start. Only the typedef names that occur in the parsed text can change
how it parses, so `install` makes wgpu's own ffi (no other) declare just those: 0.5 ms a type,
same result. Anything unexpected in cffi's internals leaves cffi as it is.

`cache_cdef` does the same for the one big parse: wgpu's header (2000 declarations), which
pycparser parses in 0.11 s on every `import wgpu`. The parse result (pycparser's AST, the
macros, the cleaned source) is stored in `<cache dir>/cffi/` keyed by the SHA-256 of the
source and cffi's and pycparser's versions, and loaded in 0.03 s with an unpickler that admits
only pycparser's AST classes. Any failure falls back to parsing.
"""

import hashlib
import os
import pickle
import re
import tempfile
import types

from .._xdg import cache_dir

_WORDS = re.compile(r"\w+")
_SHORT = 4000  # type strings; a long source (a cdef) goes through unchanged


def install(ffi):
    parser = getattr(ffi, "_parser", None)
    orig = getattr(type(parser), "_parse", None)
    if parser is None or orig is None or not isinstance(getattr(parser, "_declarations", None), dict):
        return False
    if getattr(parser, "_mltensor_fast", False):
        return True

    def _parse(self, csource):
        if len(csource) > _SHORT:
            return orig(self, csource)
        words = set(_WORDS.findall(csource))
        saved = self._declarations
        # (the ffi's lock is held by its caller, cffi's _typeof: no other parse sees the swap)
        self._declarations = {k: v for k, v in saved.items() if not k.startswith("typedef ") or k[8:] in words}
        try:
            return orig(self, csource)
        finally:
            self._declarations = saved

    parser._parse = types.MethodType(_parse, parser)
    parser._mltensor_fast = True
    return True


_AST_MODULES = ("pycparser.c_ast", "pycparser.c_parser", "pycparser.plyparser")


class _AstUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module not in _AST_MODULES or name.startswith("_"):
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a cached C parse")
        return super().find_class(module, name)


def cache_cdef():
    """Cache the parse of wgpu's header (call before wgpu is imported)."""
    try:
        import cffi
        import pycparser
        from cffi import cparser
    except ImportError:
        return False
    orig = getattr(cparser.Parser, "_parse", None)
    if orig is None or getattr(orig, "_mltensor_cached", False):
        return orig is not None

    def _parse(self, csource):
        if len(csource) <= _SHORT or "WGPU" not in csource:  # wgpu's header only
            return orig(self, csource)
        h = hashlib.sha256(f"{cffi.__version__}|{pycparser.__version__}|".encode() + csource.encode())
        path = os.path.join(cache_dir(), "cffi", h.hexdigest()[:32] + ".pickle")
        try:
            with open(path, "rb") as f:
                ast, macros, text = _AstUnpickler(f).load()
            if isinstance(macros, dict) and isinstance(text, str) and type(ast).__name__ == "FileAST":
                return ast, macros, text
        except Exception:  # absent, torn, foreign: parse (and store) again
            pass
        result = orig(self, csource)
        tmp = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)  # (atomic: a concurrent reader sees all of it or nothing)
        except (OSError, pickle.PicklingError, RecursionError):
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        return result

    _parse._mltensor_cached = True
    _parse._orig = orig
    cparser.Parser._parse = _parse
    return True
