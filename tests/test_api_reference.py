"""The API reference documents every parameter (issue 46), checked without Sphinx in the default
run (the docs build runs the same check, docs/_ext/mltensor_params.py, as a warning under -W):
each public callable's docstring has a numpydoc Parameters section naming every parameter with
its type, and a Returns section when it returns something; every public callable carries a
return annotation. The builder's operator methods get theirs from mltensor/ir/opdocs.py."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

import mltensor_docs  # noqa: E402
import mltensor_params  # noqa: E402


def test_every_public_parameter_is_documented():
    bad = mltensor_params.undocumented_params(mltensor_docs.PENDING_PARAMS)
    assert not bad, "\n".join(f"{k}: {'; '.join(v)}" for k, v in sorted(bad.items()))


def test_the_check_covers_the_public_api():
    names = {full for full, _ in mltensor_params.public_callables()}
    for must in (
        "mltensor.MLContext.create_tensor_sync",
        "mltensor.MLContext.dispatch",
        "mltensor.MLGraphBuilder.conv2d",
        "mltensor.MLGraphBuilder.gemm",
        "mltensor.InferenceSession.run",
        "mltensor.models.fetch_onnx",
    ):
        assert must in names, must
    assert len(names) >= 200


def test_the_check_finds_a_missing_parameter():
    def f(a: int, b: str = "x") -> int:
        """Summary.

        Parameters
        ----------
        a : int
            The first.
        """
        return a

    assert mltensor_params.problems("f", f) == ["parameter 'b' is not documented", "no Returns section"]


@pytest.mark.parametrize("name", ["gemm", "matmul", "conv2d", "lstm"])
def test_builder_docstrings_are_complete_numpydoc(name):
    import mltensor

    doc = getattr(mltensor.MLGraphBuilder, name).__doc__
    sec = mltensor_params.sections(doc)
    assert {"Parameters", "Returns", "Raises"} <= set(sec)
    params = mltensor_params.documented(doc)
    assert params["label"] == "str | None, default None"
