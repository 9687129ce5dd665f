"""Dynamic dimensions: named sizes known only at dispatch, and the size expressions built on them.

`MLDynamicDimension(name, max_size)` is the WebNN proposal's descriptor entry (webnn issue #883):
an input's dimension that each dispatch may choose, up to `max_size`. Every shape derived from it
carries a `Sym`, an integer expression over the named dimensions (`past + 1`, `12*seq`,
`(seq + 1) // 2`), kept in a canonical form so that equal expressions compare equal: broadcasting
and "these must be equal" checks work on Syms as on ints, structurally.

A Sym is deliberately not an int. Code that needs a value at build time (range(), int(), numpy
shapes, an f-string baked into WGSL as `{n}u`) fails loudly instead of silently using some size;
kernels render a Sym with `wgsl()` into an expression that reads the dimension from the dispatch's
immediate data (`dims.d_past`, see dynamic/kernels.py), and the host evaluates it with `eval()`
for workgroup counts. Bounds (`lo`, `hi`) come from interval arithmetic over [1, max_size] per
dimension: buffers are sized for `hi`, and order comparisons are answered only when the bounds
decide them (else TypeError), so validation at build is against the maximum, never a guess.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeAlias, cast

U32_MAX = 0xFFFFFFFF

Size: TypeAlias = "int | Sym"  # a size: a static int or an expression over dynamic dimensions
_Terms: TypeAlias = "dict[tuple[_Atom, ...], int]"  # a Sym's terms: {monomial: coefficient}


class MLDynamicDimension:
    # IDL (proposal): dictionary MLDynamicDimension { required DOMString name; required unsigned long maxSize; };
    """A dimension chosen at dispatch (WebNN proposal, webnn issue #883): an entry of a shape given
    to `MLGraphBuilder.input` or `MLContext.create_tensor_sync` that each dispatch may choose, up to
    `max_size`.

    Parameters
    ----------
    name : str
        Ties equal dimensions together: every dimension of this name, in every input of a graph,
        takes the same size at a dispatch.
    max_size : int
        The largest size, in [1, 2**32-1]: buffers are sized for it.

    Raises
    ------
    TypeError
        An empty or non-string `name`, or a `max_size` that is not an integer in range.
    """

    __slots__ = ("name", "max_size")

    def __init__(self, name: str, max_size: int) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"[MLDynamicDimension] name must be a non-empty string, got {name!r}")
        if isinstance(max_size, bool) or not hasattr(max_size, "__index__") or not 1 <= int(max_size) <= U32_MAX:
            raise TypeError(f"[MLDynamicDimension] max_size must be an integer in [1, 2**32-1], got {max_size!r}")
        self.name = name
        self.max_size = int(max_size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MLDynamicDimension) and (self.name, self.max_size) == (other.name, other.max_size)

    def __hash__(self) -> int:
        return hash(("MLDynamicDimension", self.name, self.max_size))

    def __repr__(self) -> str:
        return f"MLDynamicDimension(name={self.name!r}, max_size={self.max_size})"


def field_name(name: str) -> str:
    """The WGSL struct field holding dimension `name` (an identifier derived from the name; a
    short hash keeps two names that sanitize alike apart)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if s != name:
        s += f"_{sum(map(ord, name)) % 997}"
    return "d_" + s


def param_field(slot: int) -> str:
    """The WGSL struct field holding launch parameter `slot` (never a dimension's: those start
    with d_)."""
    return f"p{slot}"


# -- atoms: the named dimensions and the non-polynomial parts of an expression -------------------


class _Atom:
    """A factor of a monomial. Kinds: "dim" (args: name, max), "div" (floor division), "mod",
    "max", "min" (args: Syms or ints), "param" (args: slot, value: a static size passed to one
    launch's kernel as immediate data, dynamic/kernels.py SizeParams). Compared and hashed by a
    canonical key; a param's key is its slot only, so kernels that differ only in the values of
    their parameters render and compare equal."""

    __slots__ = ("kind", "args", "key")
    kind: str
    args: tuple[Any, ...]
    key: tuple[Any, ...]

    def __init__(self, kind: str, args: Iterable[Any]) -> None:
        self.kind, self.args = kind, tuple(args)
        if kind == "param":
            self.key = ("param", (self.args[0],))
            return
        self.key = (
            kind,
            tuple(a.key if isinstance(a, Sym) else (("int", a) if isinstance(a, int) else a) for a in self.args),
        )

    def __eq__(self, o: object) -> bool:
        return isinstance(o, _Atom) and self.key == o.key

    def __hash__(self) -> int:
        return hash(self.key)

    def bounds(self) -> tuple[int, int]:
        if self.kind == "dim":
            return 1, self.args[1]
        if self.kind == "param":  # its launch's value: every decision is the static build's
            return self.args[1], self.args[1]
        a, b = self.args
        (alo, ahi), (blo, bhi) = _bounds(a), _bounds(b)
        if self.kind == "div":
            blo, bhi = max(blo, 1), max(bhi, 1)  # a divisor is positive where it is used
            return alo // bhi if alo >= 0 else alo // blo, ahi // blo if ahi >= 0 else ahi // bhi
        if self.kind == "mod":
            return 0, bhi - 1
        if self.kind == "max":
            return max(alo, blo), max(ahi, bhi)
        return min(alo, blo), min(ahi, bhi)

    def eval(self, values: Mapping[str, int]) -> int:
        if self.kind == "dim":
            return values[self.args[0]]
        if self.kind == "param":
            value: int = self.args[1]
            return value
        a, b = (_eval(x, values) for x in self.args)
        return {"div": lambda: a // b, "mod": lambda: a % b, "max": lambda: max(a, b), "min": lambda: min(a, b)}[
            self.kind
        ]()

    def names(self) -> set[str]:
        if self.kind == "dim":
            return {self.args[0]}
        if self.kind == "param":
            return set()
        return set[str]().union(*(a.names() for a in self.args if isinstance(a, Sym)))

    def text(self) -> str:
        if self.kind == "dim":
            name: str = self.args[0]
            return name
        if self.kind == "param":
            return f"p{self.args[0]}"
        a, b = (_text(x, group=True) for x in self.args)
        return {"div": f"{a} // {b}", "mod": f"{a} % {b}", "max": f"max({a}, {b})", "min": f"min({a}, {b})"}[self.kind]

    def wgsl(self) -> str:
        if self.kind == "dim":
            return f"dims.{field_name(self.args[0])}"
        if self.kind == "param":
            return f"dims.{param_field(self.args[0])}"
        if self.kind in ("div", "mod") and _bounds(self.args[0])[0] < 0:
            # (workgroup counts of a size checked positive at dispatch are computed on the host,
            # in Python's floor semantics; WGSL's u32 division would be wrong for a negative one)
            raise TypeError(
                f"[dynamic dimensions] {self.text()}: a division of a possibly negative size "
                "cannot be computed in a kernel"
            )
        a, b = (wgsl(x) for x in self.args)
        return {"div": f"({a} / {b})", "mod": f"({a} % {b})", "max": f"max({a}, {b})", "min": f"min({a}, {b})"}[
            self.kind
        ]


def _bounds(x: Size) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (x.lo, x.hi)


def _eval(x: Size, values: Mapping[str, int]) -> int:
    return x if isinstance(x, int) else x.eval(values)


def _text(x: Size, group: bool = False) -> str:
    if isinstance(x, int):
        return str(x)
    s = str(x)
    return f"({s})" if group and len(x.terms) > 1 else s


def _mkey(monomial: tuple[_Atom, ...]) -> str:
    """A deterministic sort key of a monomial (its atoms' keys, not object addresses)."""
    return repr(tuple(a.key for a in monomial))


def _mul_bounds(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    ps = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(ps), max(ps)


class Sym:
    """A size expression: sum of coefficient * product of atoms (terms: {monomial: coefficient},
    a monomial a sorted tuple of atoms, () the constant). Never constant: arithmetic that cancels
    every atom returns a plain int."""

    __slots__ = ("terms", "key", "_hash", "_bounds")
    terms: _Terms
    key: tuple[Any, ...]
    _hash: int
    _bounds: tuple[int, int] | None

    def __init__(self, terms: _Terms) -> None:
        self.terms = terms  # dict, canonical: no zero coefficients, at least one non-constant term
        self.key = tuple(sorted(((tuple(a.key for a in m), c) for m, c in terms.items()), key=repr))
        self._hash = hash(self.key)
        self._bounds = None

    # -- construction ----------------------------------------------------------------------------

    @staticmethod
    def dim(name: str, max_size: int) -> Sym:
        return Sym({(_Atom("dim", (name, int(max_size))),): 1})

    @staticmethod
    def param(slot: int, value: int) -> Sym:
        """Launch parameter `slot` of a kernel, `value` for this launch (dynamic/kernels.py)."""
        return Sym({(_Atom("param", (int(slot), int(value))),): 1})

    @staticmethod
    def _make(terms: _Terms) -> Size:
        terms = {m: c for m, c in terms.items() if c}
        if not terms:
            return 0
        if list(terms) == [()]:
            return terms[()]
        return Sym(terms)

    @staticmethod
    def _terms(x: Size) -> _Terms:
        if isinstance(x, Sym):
            return x.terms
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"[dynamic dimensions] cannot combine a dynamic dimension with {x!r}")
        return {(): x} if x else {}

    @staticmethod
    def _atom(kind: str, a: Size, b: Size) -> Sym:
        return Sym({(_Atom(kind, (a, b)),): 1})

    # -- arithmetic ------------------------------------------------------------------------------

    def __add__(self, o: Size) -> Size:
        if not isinstance(o, (int, Sym)) or isinstance(o, bool):
            return NotImplemented
        t = dict(self.terms)
        for m, c in Sym._terms(o).items():
            t[m] = t.get(m, 0) + c
        return Sym._make(t)

    __radd__ = __add__

    def __neg__(self) -> Size:
        return Sym._make({m: -c for m, c in self.terms.items()})

    def __sub__(self, o: Size) -> Size:
        if not isinstance(o, (int, Sym)) or isinstance(o, bool):
            return NotImplemented
        return self + (-o)

    def __rsub__(self, o: Size) -> Size:
        if not isinstance(o, (int, Sym)) or isinstance(o, bool):
            return NotImplemented
        return (-self) + o

    def __mul__(self, o: Size) -> Size:
        if not isinstance(o, (int, Sym)) or isinstance(o, bool):
            return NotImplemented
        t: _Terms = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in Sym._terms(o).items():
                m = tuple(sorted(m1 + m2, key=lambda a: repr(a.key)))
                t[m] = t.get(m, 0) + c1 * c2
        return Sym._make(t)

    __rmul__ = __mul__

    def __floordiv__(self, o: Size) -> Size:
        if not isinstance(o, (int, Sym)) or isinstance(o, bool):
            return NotImplemented
        q = exact_div(self, o)
        if q is not None:
            return q
        if self.hi <= 0 and isinstance(o, int) and o > 0:
            return -cdiv(-self, o)  # so the ceiling idiom -(-n // k) works on sizes too
        if isinstance(o, int) and o <= 0:
            raise ZeroDivisionError(f"dimension {self} divided by {o}")
        return Sym._atom("div", self, o)

    def __rfloordiv__(self, o: int) -> Size:
        if not isinstance(o, int) or isinstance(o, bool):
            return NotImplemented
        if o < 0:
            raise TypeError(f"[dynamic dimensions] {o} // {self}: negative numerator")
        return Sym._atom("div", o, self) if o else 0

    def __mod__(self, o: Size) -> Size:
        if not isinstance(o, (int, Sym)) or isinstance(o, bool):
            return NotImplemented
        if exact_div(self, o) is not None:
            return 0
        if self.lo < 0:
            raise TypeError(f"[dynamic dimensions] {self} may be negative: no remainder")
        return Sym._atom("mod", self, o)

    # -- comparisons: structural equality, order only where the bounds decide ------------------

    def __eq__(self, o: object) -> bool:
        return isinstance(o, Sym) and self.key == o.key

    def __ne__(self, o: object) -> bool:
        return not self.__eq__(o)

    def __hash__(self) -> int:
        return self._hash

    def _order(self, o: Size, op: str) -> bool:
        d = self - o
        lo, hi = _bounds(d)
        res = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0)}[op]
        if res[0]:
            return True
        if res[1]:
            return False
        raise TypeError(
            f"[dynamic dimensions] whether {self} {op} {o} depends on the sizes given at "
            "dispatch (dimensions range over [1, max_size])"
        )

    def __lt__(self, o: Size) -> bool:
        return self._order(o, "<")

    def __le__(self, o: Size) -> bool:
        return self._order(o, "<=")

    def __gt__(self, o: Size) -> bool:
        return self._order(o, ">")

    def __ge__(self, o: Size) -> bool:
        return self._order(o, ">=")

    def __bool__(self) -> bool:
        return True

    def __int__(self) -> NoReturn:
        raise TypeError(
            f"[dynamic dimensions] dimension {self} has no value before dispatch (kernels read it "
            "from the dispatch's sizes: dynamic/dims.py)"
        )

    __index__ = __int__

    # -- queries ---------------------------------------------------------------------------------

    @property
    def lo(self) -> int:
        return self._range()[0]

    @property
    def hi(self) -> int:
        return self._range()[1]

    @property
    def max_size(self) -> int:
        """The largest value over all allowed sizes (buffers are sized for it)."""
        return self.hi

    @property
    def name(self) -> str:
        return str(self)

    def _range(self) -> tuple[int, int]:
        if self._bounds is None:
            lo = hi = 0
            for m, c in self.terms.items():
                b = (1, 1)
                for a in m:
                    b = _mul_bounds(b, a.bounds())
                b = _mul_bounds(b, (c, c))
                lo, hi = lo + b[0], hi + b[1]
            self._bounds = (lo, hi)
        return self._bounds

    def names(self) -> set[str]:
        """The named dimensions this expression reads."""
        return set[str]().union(*(a.names() for m in self.terms for a in m))

    def eval(self, values: Mapping[str, int]) -> int:
        """Its value for {dimension name: size}."""
        total = 0
        for m, c in self.terms.items():
            v = c
            for a in m:
                v *= a.eval(values)
            total += v
        return total

    def __str__(self) -> str:
        parts: list[str] = []
        for m, c in sorted(self.terms.items(), key=lambda mc: (mc[1] < 0, -len(mc[0]), _mkey(mc[0]))):
            body = "*".join(a.text() for a in m)
            if not body:
                s = str(abs(c))
            elif abs(c) == 1:
                s = body
            else:
                s = f"{abs(c)}*{body}"
            parts.append(("- " if c < 0 else "+ ") + s)
        s = " ".join(parts)
        return s[2:] if s.startswith("+ ") else "-" + s[2:]

    def __repr__(self) -> str:
        return f"<dim {self} (<= {self.hi})>"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def wgsl(self) -> str:
        """A WGSL u32 expression of this size, reading named dimensions from the immediate `dims`
        (every intermediate value is reduced modulo 2**32, so a negative term is fine as long as
        the whole is in range, which its bounds say). While a kernel with dynamic dimensions
        renders (`hoisting`), an expression beyond a bare dimension is a field of the kernel's
        immediate data instead, its value computed by the host at dispatch."""
        h: _Hoisted | None = getattr(_hoist, "table", None)
        if h is not None:
            field = h.field(self)
            if field is not None:
                return field
        elif not getattr(_hoist, "inline", False) and _compound(self):
            # rendered by a lowering into a text its kernel renders later (a condition, a
            # prologue function): marked, so that the kernel's rendering can make it a field
            _hoist.inline = True
            try:
                text = self.wgsl()
            finally:
                _hoist.inline = False
            with _tags_lock:
                if len(_tagged) >= _TAGGED_MAX:
                    _tagged.pop(next(iter(_tagged)))
                _tagged[text] = self
            return f"{TAG_OPEN}{text}{TAG_CLOSE}"
        pos: list[str] = []
        neg: list[str] = []
        for m, c in sorted(self.terms.items(), key=lambda mc: _mkey(mc[0])):
            factors = [a.wgsl() for a in m]
            if abs(c) != 1 or not factors:
                factors.insert(0, f"{abs(c)}u")
            (neg if c < 0 else pos).append(" * ".join(factors))
        s = " + ".join(pos) if pos else "0u"
        for n in neg:
            s += f" - {n}"
        return f"({s})"


# -- derived sizes: expressions computed by the host, read by kernels as immediate data ------------
#
# A kernel of a graph with dynamic dimensions renders its sizes as expressions over the
# dimensions: a convolution four stride-2 layers deep reads its output height as
# ((((h - 1) / 2) / 2) / 2) / 2 + 1, and its flat plane, strides and bounds as products of such,
# at every use. PP-OCRv4 det's 1x1 convolutions were 42K characters of WGSL each (21K with
# static sizes), each pipeline 10x slower to create on lavapipe (150 ms against 13 ms) and its
# invocations repeating the divisions per element. Rendered under `hoisting`, each distinct
# expression becomes one field after the dimensions (`dims.s0`, `dims.s1`, ...; the kernel's
# `derived`), and the host evaluates them once per dispatch (dynamic/kernels.py).

_hoist = threading.local()


def derived_field(slot: int) -> str:
    """The WGSL struct field holding derived size `slot` of a kernel (dimensions' fields start
    with d_, launch parameters' with p)."""
    return f"s{slot}"


class _Hoisted:
    __slots__ = ("room", "syms", "index")

    def __init__(self, room: int) -> None:
        self.room = room
        self.syms: list[Sym] = []
        self.index: dict[tuple[Any, ...], int] = {}

    def field(self, x: Sym) -> str | None:
        """WGSL reading expression x from its field (None: no field), its common factor kept in
        the text (a stride or plane known to be a multiple of 16 lets the compiler keep what the
        inline expression let it know)."""
        g = _factor(x)
        slot = self.slot(x if g == 1 else cast(Sym, exact_div(x, g)))  # x / its factor: a Sym
        if slot is None:
            return None
        return f"dims.{derived_field(slot)}" if g == 1 else f"({g}u * dims.{derived_field(slot)})"

    def slot(self, x: Sym) -> int | None:
        """The field of expression x, a new one while there is room; None: rendered inline (a bare
        dimension, a launch parameter's expression, one that may be negative or overflow)."""
        s = self.index.get(x.key)
        if s is not None:
            return s
        if not _compound(x) or len(self.syms) >= self.room:
            return None
        self.index[x.key] = len(self.syms)
        self.syms.append(x)
        return len(self.syms) - 1


def _factor(x: Sym) -> int:
    """The largest integer dividing every coefficient of x (1 for a bare dimension)."""
    return math.gcd(*x.terms.values())


def _compound(x: Sym) -> bool:
    """A size a kernel may read as a derived field: an expression over dimensions beyond a bare
    dimension (or launch parameter), never negative, within u32."""
    if len(x.terms) == 1:
        ((m, c),) = x.terms.items()
        if c == 1 and len(m) == 1 and m[0].kind in ("dim", "param"):
            return False
    return bool(x.names()) and x.lo >= 0 and x.hi <= U32_MAX


# Sizes a lowering renders outside a kernel's rendering go into its parameters as marked text;
# the kernel's rendering (untag) looks each up here and makes it a derived field where there
# is room, else drops the marks (the text is the inline expression, unique to its value).
TAG_OPEN, TAG_CLOSE = "\x01", "\x02"
_TAG_RE = re.compile("\x01([^\x01\x02]*)\x02")
_tagged: dict[str, Sym] = {}  # inline text -> Sym
_TAGGED_MAX = 1 << 16
_tags_lock = threading.Lock()


def untag(src: str, h: hoisting | None) -> str:
    """WGSL without the marks of sizes rendered by lowerings (see `_tagged`): each a field of
    hoisting context h where it has room, else its inline text."""
    if TAG_OPEN not in src:
        return src

    def one(m: re.Match[str]) -> str:
        text = m.group(1)
        with _tags_lock:
            x = _tagged.get(text)
        field = None if x is None or h is None else h.table.field(x)
        return text if field is None else field

    return _TAG_RE.sub(one, src)


class hoisting:
    """Context of one kernel's rendering: sizes over dynamic dimensions become up to `room`
    derived fields; `.syms` lists them in field order (the same for every rendering of the
    same template and parameters)."""

    _outer: _Hoisted | None

    def __init__(self, room: int) -> None:
        self.table = _Hoisted(room)

    @property
    def syms(self) -> tuple[Sym, ...]:
        return tuple(self.table.syms)

    def reset(self) -> None:
        self.table.__init__(self.table.room)  # type: ignore[misc]  # in place: the table is _Hoisted exactly

    def __enter__(self) -> hoisting:
        self._outer = getattr(_hoist, "table", None)
        _hoist.table = self.table
        return self

    def __exit__(self, *exc: object) -> None:
        _hoist.table = self._outer


class Condition(tuple[tuple["Size", str, int], ...]):
    """A WGSL condition on sizes, ((size, "<=" or ">=", bound), ...) all holding, kept as sizes
    until a kernel renders it (templates render it as `{{ gate }}`: wgsl.template_env's
    finalize), so that its sizes become derived fields like any other (`hoisting`). Empty:
    always true, and false as a Python value (`{{ gate if gate else "true" }}`)."""

    __slots__ = ()

    def wgsl(self) -> str:
        return " && ".join(f"{wgsl(x)} {op} {b}u" for x, op, b in self) or "true"


def wgsl(x: Size) -> str:
    """WGSL u32 expression of a size: a literal for an int, dims reads for a Sym."""
    if isinstance(x, Sym):
        return x.wgsl()
    x = int(x)
    if not 0 <= x <= U32_MAX:
        raise TypeError(f"[dynamic dimensions] size {x} does not fit in u32")
    return f"{x}u"


def exact_div(a: Size, b: Size) -> Size | None:
    """a / b when it divides exactly as polynomials (every term of a divisible by the single term
    b, or a an integer multiple of b), else None."""
    if isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError("division of a dimension by zero")
        if isinstance(a, int):
            return a // b if a % b == 0 else None
        if all(c % b == 0 for c in a.terms.values()):
            return Sym._make({m: c // b for m, c in a.terms.items()})
        return None
    if isinstance(a, int):
        return None
    if a == b:
        return 1
    if len(b.terms) == 1:
        ((bm, bc),) = b.terms.items()
        out: _Terms = {}
        for m, c in a.terms.items():
            rest = list(m)
            for atom in bm:
                if atom not in rest:
                    return None
                rest.remove(atom)
            if c % bc:
                return None
            out[tuple(rest)] = c // bc
        return Sym._make(out)
    for k in range(2, 65):  # a = k * b
        if a == b * k:
            return k
    return None


def cdiv(a: Size, b: int) -> Size:
    """Ceiling division of a non-negative size by a positive int (workgroup counts)."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return (a + (b - 1)) // b


def smax(a: Size, b: Size) -> Size:
    """max() of sizes; a Sym atom when the bounds do not decide it."""
    try:
        return a if a >= b else b
    except TypeError:
        return Sym._atom("max", a, b)


def smin(a: Size, b: Size) -> Size:
    try:
        return a if a <= b else b
    except TypeError:
        return Sym._atom("min", a, b)


def size_at_least(x: Size, t: int) -> Size:
    """A size expression that is 1 where size x >= t, else 0 (x >= 1): the factor of a gated
    variant's workgroup count (0 workgroups: the dispatch skips it)."""
    return 1 if t <= max(1, low(x)) else smin(x // t, 1)


def is_static(shape: Iterable[object]) -> bool:
    return all(isinstance(d, int) for d in shape)


def high(x: Size) -> int:
    """The largest value a size takes (itself for an int)."""
    return x.hi if isinstance(x, Sym) else x


def low(x: Size) -> int:
    return x.lo if isinstance(x, Sym) else x


def names_of(shape: Iterable[object]) -> set[str]:
    """Named dimensions read by a shape's entries."""
    out: set[str] = set()
    for d in shape:
        if isinstance(d, Sym):
            out |= d.names()
    return out


def evaluate(x: Size | tuple[Size, ...] | list[Size], values: Mapping[str, int]) -> int | tuple[Any, ...]:
    """An int for a size (or a tuple for a shape) given {dimension name: size}."""
    if isinstance(x, (tuple, list)):
        return tuple(evaluate(d, values) for d in x)
    return x.eval(values) if isinstance(x, Sym) else x


def parse_shape(shape: Any, where: str, names: dict[str, int], named_only: bool = True) -> Any:
    """A shape given by a user, with MLDynamicDimension entries (or {"name", "max_size"} dicts,
    or a named Sym taken from an operand's shape) turned into Syms. `names` ({name: max_size})
    collects the dimensions seen: one name has one maximum. named_only=False also takes derived
    Syms (past + 1: a resizable tensor shaped like a graph's output)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        return shape
    out = []
    for d in shape:
        if isinstance(d, dict):
            extra = set(d) - {"name", "max_size", "maxSize"}
            if extra:
                raise TypeError(f"[{where}] unexpected dynamic dimension keys {sorted(extra)}")
            # (the constructor checks the entries: TypeError)
            d = MLDynamicDimension(d.get("name"), d.get("max_size", d.get("maxSize")))  # type: ignore[arg-type]
        elif isinstance(d, Sym):
            if len(d.names()) != 1 or d != Sym.dim(d.name, d.max_size):
                if named_only:
                    raise TypeError(f"[{where}] a dynamic dimension here must be a named one, got {d}")
                out.append(d)
                continue
            d = MLDynamicDimension(d.name, d.max_size)
        if isinstance(d, MLDynamicDimension):
            known = names.get(d.name)
            if known is not None and known != d.max_size:
                raise TypeError(
                    f"[{where}] dynamic dimension {d.name!r} has max_size {known} elsewhere, got {d.max_size}"
                )
            names[d.name] = d.max_size
            d = Sym.dim(d.name, d.max_size)
        out.append(d)
    return out


def bind(pattern: Sequence[Size], shape: Sequence[int], values: dict[str, int], what: str) -> None:
    """Match a concrete shape against a pattern (ints and Syms), adding named dimensions' sizes to
    `values`; TypeError naming `what` when it does not fit (rank, a static size, a size above its
    maximum, one name given two sizes). Derived entries (past + 1) are checked once every name
    they read is known (check_derived)."""
    if len(pattern) != len(shape):
        raise TypeError(f"{what} must have rank {len(pattern)} (shape {list(pattern)}), got shape {list(shape)}")
    for p, s in zip(pattern, shape):
        if isinstance(p, int):
            if p != s:
                raise TypeError(f"{what} must have shape {list(pattern)}, got {list(shape)}")
            continue
        if (
            len(p.terms) == 1
            and next(iter(p.terms))
            and len(next(iter(p.terms))) == 1
            and p == Sym.dim(p.name, p.max_size)
        ):  # a named dimension: it takes this size
            if not 1 <= s <= p.max_size:
                raise TypeError(f"{what}: dimension {p.name!r} is {s}, outside [1, {p.max_size}] (shape {list(shape)})")
            old = values.setdefault(p.name, s)
            if old != s:
                raise TypeError(f"{what}: dimension {p.name!r} is {s} here and {old} elsewhere")


def check_derived(pattern: Sequence[Size], shape: Sequence[int], values: dict[str, int], what: str) -> None:
    """The derived entries of a pattern (past + 1) equal their value for `values`."""
    for p, s in zip(pattern, shape):
        if isinstance(p, Sym) and p.names() <= set(values):
            want = p.eval(values)
            if want != s:
                raise TypeError(
                    f"{what}: dimension {p} must be {want} for "
                    f"{', '.join(f'{k}={v}' for k, v in sorted(values.items()))}, got {s}"
                )
        elif isinstance(p, Sym) and s > p.hi:
            raise TypeError(f"{what}: dimension {p} is {s}, above its maximum {p.hi}")
