"""Which `MLTENSOR_*` environment variables the code reads, and which docs/guides/environment.md
documents. Plain Python (no Sphinx), so tests/test_docs.py can check the same thing without the
docs extra; the docs extension (mltensor_docs.py) turns a gap into a build warning.

"Read by the code" is deliberately wide: any `MLTENSOR_*` name in the package, the benchmarks, the
examples, setup.sh or tests/conftest.py (a name in a comment counts too: it names a switch a user
can set). "Documented" is narrow: a row of one of the page's tables whose first cell is the
name, so a name mentioned in passing does not count as documented.
"""

import collections
import os
import re

ENV_RE = re.compile(r"\bMLTENSOR_[A-Z0-9_]*[A-Z0-9]\b")
# a table row whose first cell is the variable: | `MLTENSOR_CACHE` | what it does | default |
ROW_RE = re.compile(r"^\|\s*`(MLTENSOR_[A-Z0-9_]*[A-Z0-9])`\s*\|", re.MULTILINE)
SOURCES = ("mltensor", "bench", "examples", "setup.sh", os.path.join("tests", "conftest.py"))
SUFFIXES = (".py", ".c", ".sh", ".wgsl")
PAGE = os.path.join("docs", "guides", "environment.md")


def env_vars_in_code(root):
    """{variable name: set of files (relative to root) that name it}."""
    found = collections.defaultdict(set)
    for top in SOURCES:
        base = os.path.join(root, top)
        if os.path.isfile(base):
            paths = [base]
        else:
            paths = [os.path.join(d, f) for d, _, fs in os.walk(base) for f in fs if f.endswith(SUFFIXES)]
        for p in paths:
            with open(p, encoding="utf-8", errors="replace") as fh:
                for name in ENV_RE.findall(fh.read()):
                    found[name].add(os.path.relpath(p, root))
    return found


def documented_env_vars(root):
    """The variables docs/guides/environment.md gives a table row of their own."""
    with open(os.path.join(root, PAGE), encoding="utf-8") as fh:
        return set(ROW_RE.findall(fh.read()))


def undocumented_env_vars(root):
    """{variable: files that read it} for every variable the code reads and the page lacks."""
    documented = documented_env_vars(root)
    return {k: v for k, v in env_vars_in_code(root).items() if k not in documented}
