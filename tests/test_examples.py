"""Every example runs (briefly) as part of the tests; the video example has its own module."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_hello_example_runs():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "hello.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # y = relu(x * [0.5, -1, 2] + 1) for x = [[0, 1, 2], [3, 4, 5]], computed here independently
    assert "[[ 1.   0.   5. ]" in r.stdout and "[ 2.5  0.  11. ]]" in r.stdout
