"""Faster first use of wgpu-py's C struct types (a start-up cost, not a per-call one).

wgpu-py builds every WebGPU call's descriptor with `ffi.new("WGPUXxxDescriptor *")`. cffi parses
each distinct type string once per process with pycparser, and before parsing it re-declares
every typedef the ffi knows (936 for wgpu-native's headers) so that pycparser can tell type
names from variables: about 12 ms a type, some 25 types on a model's first build and run,
0.3 s of every process start. Only the typedef names that occur in the parsed text can change
how it parses, so `install` makes wgpu's own ffi (no other) declare just those: 0.5 ms a type,
same result. Anything unexpected in cffi's internals leaves cffi as it is.
"""

import re
import types

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
        self._declarations = {k: v for k, v in saved.items()
                              if not k.startswith("typedef ") or k[8:] in words}
        try:
            return orig(self, csource)
        finally:
            self._declarations = saved

    parser._parse = types.MethodType(_parse, parser)
    parser._mltensor_fast = True
    return True
