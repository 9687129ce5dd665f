"""The package's layering (CONTRIBUTING.md, "Floors"), read from the source with `ast`: no GPU,
no import of mltensor.

- Every module sits on a floor and imports only the floors its own may import (FLOORS).
- No import circle, counting the family loaders of ops/ and onnx/ops/ (they import every module
  of their package at import time), except inside the importer/session floor, and none there of
  more than MAX_CIRCLE modules.
- No deferred import between mltensor modules (inside a function, or after the module's code)
  but the few in DEFERRED, each kept for start-up laziness, never to break a cycle.
- No private name (`_x`) imported from another file: a name another file needs is public.
- No Python file longer than MAX_LINES.
"""

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "mltensor"

# (floor, module prefixes); the longest matching prefix decides. A prefix names a module or a
# package (all of its modules).
FLOORS = [
    (0, ["dtypes", "errors", "_xdg", "switches", "dynamic.dims"]),
    (1, ["runtime", "dynamic", "dynamic.kernels", "dynamic.plan"]),
    (2, ["ir"]),
    (3, ["ops", "llm.kernels", "llm.sampling"]),
    (4, ["compiler"]),
    (5, ["graphcache", "graphcache.recipe", "graphcache.store"]),
    (6, ["front"]),
    (7, ["onnx", "tflite", "stages", "onnxio", "dynamic.capacity", "session"]),
    (8, ["", "llm", "apps", "serve", "models", "models_synthetic", "onnx.backend"]),
]
# What each floor may import (besides itself): the build path runs one way, ir -> ops -> compiler
# -> (Program) -> front; the graph cache knows the runtime's Program only; runtime/ knows nothing
# of the graph it runs.
MAY_IMPORT = {
    0: {0},
    1: {0, 1},
    2: {0, 2},
    3: {0, 1, 2, 3},
    4: {0, 1, 2, 3, 4},
    5: {0, 1, 5},
    6: {0, 1, 2, 3, 4, 5, 6},
    7: {0, 1, 2, 3, 4, 5, 6, 7},
    8: {0, 1, 2, 3, 4, 5, 6, 7, 8},
}
LOADERS = ["ops", "onnx.ops"]  # packages whose __init__ imports every non-underscore module in them
CIRCLE_FLOOR = 7  # the importer/session knot, left for a later step (may hold circles, small ones)
MAX_CIRCLE = 5
MAX_LINES = 800

# Deferred imports kept on purpose: (importing module, imported module) -> why.
DEFERRED = {
    (
        "front.builder",
        "compiler.build",
    ): "a process whose graphs all come from the graph cache never imports the compiler",
    ("front.context", "front.interop"): "a process that never lends a tensor does not load the interop machinery",
    ("front.saved", "graphcache.store"): "`import mltensor` alone never loads the graph cache (pickle, OpenSSL)",
    ("session.lazy", "onnx.importer"): "a session served by the graph cache never imports onnx",
    ("session.lazy", "stages.plan"): "staged runs import onnx (their loops build ONNX bodies)",
    ("session.lazy", "tflite"): "a TFLite session served by the graph cache never reads the file",
}
MAX_DEFERRED = 15


def _modules():
    mods = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_pkg)
    return mods


MODULES = _modules()


def floor_of(mod):
    best = None
    for floor, prefixes in FLOORS:
        for p in prefixes:
            if mod == p or p == "" or mod.startswith(p + "."):
                if best is None or len(p) > len(best[1]):
                    best = (floor, p)
    return best[0]


def _resolve(mod, is_pkg, node):
    """[(target module, imported name or None, lineno)] for one import statement, internal only."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == "mltensor" or a.name.startswith("mltensor."):
                out.append((a.name.removeprefix("mltensor").lstrip("."), None))
    else:
        if node.level:
            base = mod.split(".") if mod else []
            if not is_pkg:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            full = ".".join(base + ([node.module] if node.module else []))
        elif node.module == "mltensor" or (node.module or "").startswith("mltensor."):
            full = node.module.removeprefix("mltensor").lstrip(".")
        else:
            return []
        for a in node.names:
            sub = f"{full}.{a.name}" if full else a.name
            out.append((sub, None) if sub in MODULES else (full, a.name))
    res = []
    for target, name in out:
        while target not in MODULES and "." in target:
            target = target.rsplit(".", 1)[0]
        if target not in MODULES:
            target = ""
        res.append((target, name))
    return res


def _scan():
    """edges {module: set of modules}, deferred [(module, target, line)], private [(module, target,
    name, line)]."""
    edges, deferred, private = {m: set() for m in MODULES}, [], []
    for mod, (path, is_pkg) in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        # the module's own code ends at its last statement that is not an import: imports after
        # it are bottom-of-module imports
        last_code = max(
            (i for i, s in enumerate(tree.body) if not isinstance(s, (ast.Import, ast.ImportFrom, ast.Expr))),
            default=-1,
        )
        top = {id(s): i for i, s in enumerate(tree.body)}

        def visit(node, in_fn):
            for child in ast.iter_child_nodes(node):
                fn = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    late = in_fn or (id(child) in top and top[id(child)] > last_code)
                    for target, name in _resolve(mod, is_pkg, child):
                        if target == mod:
                            continue
                        edges[mod].add(target)
                        if late:
                            deferred.append((mod, target, child.lineno))
                        if name and name.startswith("_") and not name.startswith("__"):
                            private.append((mod, target, name, child.lineno))
                visit(child, fn)

        visit(tree, False)
    for loader in LOADERS:
        for m in MODULES:
            if (
                m.startswith(loader + ".")
                and m.count(".") == loader.count(".") + 1
                and not m.rsplit(".", 1)[1].startswith("_")
            ):
                edges[loader].add(m)
    return edges, deferred, private


EDGES, DEFERRED_FOUND, PRIVATE_FOUND = _scan()


def _circles(edges):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _name(m):
    return f"mltensor.{m}" if m else "mltensor"


def test_floors():
    bad = []
    for mod, targets in EDGES.items():
        f = floor_of(mod)
        for t in sorted(targets):
            g = floor_of(t)
            if g not in MAY_IMPORT[f]:
                bad.append(f"{_name(mod)} (floor {f}) imports {_name(t)} (floor {g})")
    assert not bad, "imports against the floors (CONTRIBUTING.md):\n" + "\n".join(bad)


def test_no_import_circles():
    bad = []
    for comp in _circles(EDGES):
        floors = {floor_of(m) for m in comp}
        if floors != {CIRCLE_FLOOR} or len(comp) > MAX_CIRCLE:
            bad.append(f"{len(comp)} modules: {', '.join(_name(m) for m in comp)}")
    assert not bad, "import circles:\n" + "\n".join(bad)


def test_deferred_imports_are_whitelisted():
    bad = [f"{_name(m)}:{line} imports {_name(t)}" for m, t, line in DEFERRED_FOUND if (m, t) not in DEFERRED]
    assert not bad, (
        "deferred imports (inside a function or after the module's code) between mltensor "
        "modules; import at the top, or add a start-up reason to DEFERRED:\n" + "\n".join(bad)
    )
    assert len(DEFERRED_FOUND) <= MAX_DEFERRED, DEFERRED_FOUND
    stale = set(DEFERRED) - {(m, t) for m, t, _ in DEFERRED_FOUND}
    assert not stale, f"DEFERRED entries no import uses any more: {sorted(stale)}"


def test_no_private_names_across_files():
    bad = [f"{_name(m)}:{line} imports {name} from {_name(t)}" for m, t, name, line in PRIVATE_FOUND]
    assert not bad, "private names imported from another file (make them public):\n" + "\n".join(bad)


def test_files_are_small():
    big = [
        (n, str(p.relative_to(PKG.parent)))
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not big, f"files over {MAX_LINES} lines (one concept a module): {sorted(big, reverse=True)}"


def test_the_checks_can_fail():
    """The scanner sees what the rules are about, on a planted example of each."""
    assert floor_of("ops.conv") == 3 and floor_of("compiler.fusion.gate") == 4
    assert floor_of("session.cache") == 7 and floor_of("graphcache.store") == 5
    assert floor_of("llm.kernels") == 3 and floor_of("llm.model") == 8 and floor_of("") == 8
    tree = ast.parse("from ..front.context import _hidden\n")
    assert _resolve("ops.conv", False, tree.body[0]) == [("front.context", "_hidden")]
    tree = ast.parse("from . import elementwise\n")
    assert _resolve("ops.conv", False, tree.body[0]) == [("ops.elementwise", None)]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "ops.conv" in EDGES["ops"]  # the loader arrows
