"""Types for the IDE and the type checker (issue 46): the package ships py.typed; the builder's
operator methods, attached at import, are declared for checkers in mltensor/front/_builder_ops.pyi
(generated from the annotated operator functions: it must match them); mypy --strict accepts a
user's program over the public API (tests/typing/public_api.py, [tool.mypy] in pyproject.toml);
the public callables and properties carry annotations (any still without would be listed, as a
debt, in docs/_ext/mltensor_docs.py PENDING_PARAMS with their docs: it is empty); and mypy finds
a wrong call (the check is not fooled by Any)."""

import importlib.util
import inspect
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

import mltensor_docs  # noqa: E402
import mltensor_params  # noqa: E402


def test_py_typed_is_shipped():
    assert os.path.isfile(os.path.join(ROOT, "mltensor", "py.typed"))
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        text = fh.read()
    assert '"mltensor" = ["py.typed"]' in text and '"mltensor.front" = ["*.pyi"]' in text


def test_builder_stub_matches_the_operators():
    import mltensor  # noqa: F401 (attaches the operator methods)
    from mltensor.ir import opdocs
    from mltensor.ir.registry import BUILDER_METHODS

    with open(os.path.join(ROOT, "mltensor", "front", "_builder_ops.pyi"), encoding="utf-8") as fh:
        have = fh.read()
    assert have == opdocs.stub_text(BUILDER_METHODS), (
        "mltensor/front/_builder_ops.pyi is stale: python -c 'import mltensor; from mltensor.ir import opdocs, registry; "
        'print(opdocs.stub_text(registry.BUILDER_METHODS), end="")\' > mltensor/front/_builder_ops.pyi'
    )


def test_public_callables_are_annotated():
    """Every public function and method annotates its parameters and return, every public property
    its type (the constructors users call are their classes' __init__, annotated too)."""
    missing = []
    for full, obj in mltensor_params.public_callables():
        if full in mltensor_docs.PENDING_PARAMS:
            continue
        if isinstance(obj, property):
            if inspect.signature(obj.fget).return_annotation is inspect.Signature.empty:
                missing.append(full)
            continue
        if inspect.isclass(obj):
            if issubclass(obj, BaseException) or full in mltensor_docs.NO_CONSTRUCTOR:
                continue
            obj = obj.__init__
            if obj is object.__init__:
                continue
        obj = getattr(obj, "__func__", obj)
        if not callable(obj):
            continue
        sig = inspect.signature(obj)
        params = [p for i, p in enumerate(sig.parameters.values()) if i > 0 or p.name not in ("self", "cls")]
        if sig.return_annotation is inspect.Signature.empty or any(
            p.annotation is inspect.Parameter.empty for p in params if p.name not in ("self", "ctx")
        ):
            missing.append(full)
    assert not missing, missing


@pytest.mark.timeout(300)
def test_mypy_strict_on_a_program_using_the_public_api():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (the test extra: pip install -e '.[test]')")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", os.path.join(ROOT, "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(300)
def test_mypy_finds_a_wrong_call(tmp_path):
    """The check has teeth: a misspelt name of mltensor (a lazy one is declared for checkers, the
    module's __getattr__ is not), a wrong argument type, an unknown sampling option and a wrong
    result type are errors, not Any."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (the test extra: pip install -e '.[test]')")
    prog = tmp_path / "wrong.py"
    prog.write_text(
        "import mltensor\n"
        "from mltensor.llm import LLM\n"
        "mltensor.InferenceSesion\n"
        "mltensor.models.fetch(3)\n"
        "LLM('m').generate('a', temperture=0)\n"
        "x: str = LLM('m').generate('a', return_ids=True)\n"
        "y: str = mltensor.InferenceSession('m').run(None, {})\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--config-file",
            os.path.join(ROOT, "pyproject.toml"),
            str(prog),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    lines = {
        int(line.split(":")[1]) for line in r.stdout.splitlines() if line.startswith(str(prog)) and ": error:" in line
    }
    assert lines == {3, 4, 5, 6, 7}, r.stdout + r.stderr
