"""Every example runs (briefly) as part of the tests; the video example has its own module."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_hello_example_runs():
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "hello.py")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    # y = relu(x * [0.5, -1, 2] + 1) for x = [[0, 1, 2], [3, 4, 5]], computed here independently
    assert "[[ 1.   0.   5. ]" in r.stdout and "[ 2.5  0.  11. ]]" in r.stdout


def test_generate_example_runs():
    """examples/generate.py: a decode loop on the GPU, its tokens checked against onnxruntime's
    (--check exits 1 when they differ), two builds, nothing moved but the token per step."""
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "generate.py"), "--tokens", "12", "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "builds: 2 (dynamic dimensions:" in r.stdout
    assert "per decode step: 0 bytes uploaded, 8 bytes downloaded, 0 tensors created" in r.stdout
    assert "onnxruntime CPU: same tokens" in r.stdout
