"""The console entries fail politely (issue 46): without their extra, with a missing or unreadable
input, without an adapter, each prints one line on stderr (`<prog>: ...`, naming
`pip install 'mltensor[<extra>]'` for an extra), exits with status 2 and shows no traceback;
stdout stays empty.

The fast tests run each entry's `main()` (the function pyproject's [project.scripts] names) in a
subprocess whose runner sets `sys.modules[name] = None` for the modules of the extra: the imports
fail as they do in a venv without it. The slow one builds such a venv (`pip install` of this tree
with the base dependencies only) and runs the installed commands.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from mltensor.apps import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    PYPROJECT = tomllib.load(f)["project"]
SCRIPTS = PYPROJECT["scripts"]  # mltensor-chat -> mltensor.apps.chat:main
# the extra each entry needs: what its one line names
EXTRA = {"mltensor-chat": "llm", "mltensor-selfie": "examples", "mltensor-batch": "ray", "mltensor": "serve"}
# how an entry's one line starts when it is not its name: `mltensor serve` is a command of `mltensor`
PREFIX = {"mltensor": "mltensor serve"}

RUNNER = """\
import importlib, sys
blocked, entry, prog, *args = sys.argv[1:]
for name in filter(None, blocked.split(",")):
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, as without the package
module, func = entry.split(":")
sys.argv = [prog, *args]
sys.exit(getattr(importlib.import_module(module), func)())
"""


def _requirement_name(req):
    return re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")


def _modules_of(dist):
    """Top-level import names of an installed distribution (its top_level.txt, else its files)."""
    d = importlib.metadata.distribution(dist)
    top = d.read_text("top_level.txt")
    if top:
        names = set(top.split())
    else:
        parts = [f.parts for f in d.files or ()]
        names = {p[0] for p in parts if len(p) > 1 and p[1] == "__init__.py"}
        names |= {p[0][:-3] for p in parts if len(p) == 1 and p[0].endswith(".py")}
    return sorted(n for n in names if not n.startswith("_"))


def extra_modules(extra):
    """The top-level modules the distributions of pyproject's `extra` provide (installed here)."""
    mods = []
    for req in PYPROJECT["optional-dependencies"][extra]:
        mods += _modules_of(_requirement_name(req))
    return mods


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    p = tmp_path_factory.mktemp("apps") / "runner.py"
    p.write_text(RUNNER)
    return str(p)


def run_entry(runner, prog, args, *, blocked=(), env=None, timeout=300):
    return subprocess.run(
        [sys.executable, runner, ",".join(blocked), SCRIPTS[prog], prog, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})),  # this tree's mltensor, as pytest imports it
    )


def assert_polite(r, prog, *needles):
    """Exit status 2, stderr one line `<prog>: ...` holding every needle, no traceback, stdout empty."""
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"{PREFIX.get(prog, prog)}: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert r.stdout == ""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    (d / "notes.txt").write_text("not a model, not an image, not a video\n")
    from PIL import Image

    Image.fromarray(np.full((32, 32, 3), 128, np.uint8)).save(d / "in.png")
    return d


def test_the_extras_match_what_the_entries_import():
    """cli.EXTRAS (what an entry checks) names only modules its pyproject extra provides, and every
    entry checks an extra that exists."""
    for prog, extra in EXTRA.items():
        assert prog in SCRIPTS
        provided = set(extra_modules(extra))
        checked = {m.split(".")[0] for m in cli.EXTRAS[extra]}
        assert checked <= provided, (extra, checked - provided)


ARGS = {
    "mltensor-chat": ["--prompt", "hello"],
    "mltensor-selfie": ["--frames", "1", "--output", "{tmp}/out.mp4"],
    "mltensor-batch": ["{files}/in.png", "-o", "{tmp}/out"],
    "mltensor": ["serve", "--model", "{files}/notes.txt"],
}


@pytest.mark.parametrize("prog", sorted(EXTRA))
def test_an_entry_without_its_extra_names_it(prog, runner, files, tmp_path):
    args = [a.format(tmp=tmp_path, files=files) for a in ARGS[prog]]
    r = run_entry(runner, prog, args, blocked=extra_modules(EXTRA[prog]))
    extra = EXTRA[prog]
    assert_polite(r, prog, f"needs the {extra} extra: pip install 'mltensor[{extra}]'")
    # --help needs no extra; its description is whole (it once ended inside a parenthesis)
    h = run_entry(runner, prog, ["--help"], blocked=extra_modules(EXTRA[prog]))
    assert h.returncode == 0 and h.stdout.startswith("usage: " + prog), h.stderr
    assert h.stdout.count("(") == h.stdout.count(")"), h.stdout


@pytest.mark.parametrize(
    "prog, args, needle",
    [
        ("mltensor-chat", ["--model", "{files}/nope.gguf", "--prompt", "hi"], "--model: no such file"),
        ("mltensor-chat", ["--model", "{files}/notes.txt", "--prompt", "hi"], "not a valid GGUF file"),
        ("mltensor-chat", ["--max-tokens", "0", "--prompt", "hi"], "--max-tokens must be at least 1"),
        ("mltensor-selfie", ["--source", "{files}/nope.mp4"], "--source: no such file"),
        ("mltensor-selfie", ["--source", "{files}/notes.txt", "--output", "{tmp}/o.mp4"], "as a video"),
        ("mltensor-selfie", ["--model", "{files}/nope.tflite", "--output", "{tmp}/o.mp4"], "--model: no such file"),
        ("mltensor-selfie", ["--output", "{files}/no/dir/o.mp4"], "does not exist"),
        (
            "mltensor-selfie",
            ["--effect", "replace", "--background", "{files}/notes.txt", "--output", "{tmp}/o.mp4"],
            "--background: cannot read",
        ),
        ("mltensor-batch", ["{files}/in.png", "-o", "{tmp}/o", "--model", "{files}/nope.onnx"], "--model: no such"),
        ("mltensor-batch", ["{files}/nope/", "{files}/notes.txt", "-o", "{tmp}/o"], "no image or video file"),
        ("mltensor", ["serve", "--model", "{files}/nope.gguf"], "--model: no such file"),
        ("mltensor", ["serve", "--model", "{files}/notes.txt"], "not a valid GGUF file"),
        ("mltensor", ["serve", "--embedding", "{files}/nope.onnx"], "--embedding: no such file"),
        ("mltensor", ["serve", "--model", "a=b=c", "--slots", "0"], "--slots must be at least 1"),
    ],
    ids=lambda v: v if isinstance(v, str) and not v.startswith(("-", "{")) else None,
)
def test_a_missing_or_unreadable_input_is_one_line(prog, args, needle, runner, files, tmp_path):
    r = run_entry(runner, prog, [a.format(tmp=tmp_path, files=files) for a in args])
    assert_polite(r, prog, needle)


# Vulkan's loader finds no driver: wgpu offers at most an OpenGL adapter, which mltensor refuses
NO_VULKAN = {"VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="hides the Vulkan drivers through the loader")
@pytest.mark.parametrize(
    "prog, args",
    [
        ("mltensor-chat", ["--model", "{files}/notes.txt", "--prompt", "hi"]),
        ("mltensor-selfie", ["--frames", "1", "--output", "{tmp}/o.mp4"]),
        ("mltensor-batch", ["{files}/in.png", "-o", "{tmp}/o"]),
        ("mltensor", ["serve", "--model", "{files}/notes.txt"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_no_adapter_is_one_line(prog, args, runner, files, tmp_path):
    r = run_entry(runner, prog, [a.format(tmp=tmp_path, files=files) for a in args], env=NO_VULKAN)
    assert_polite(r, prog, "no Vulkan/Metal/D3D12 adapter found")


# -- a venv with the base dependencies only: the commands as `pip install mltensor` leaves them -----


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory):
    """A venv holding this tree installed with its base dependencies (pyproject's `dependencies`)
    and no extra; pip takes the versions of the test venv (constraints), from its cache."""
    d = tmp_path_factory.mktemp("bare-venv")
    venv = d / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout
    (d / "constraints.txt").write_text(
        "\n".join(line for line in frozen.splitlines() if "==" in line and not line.startswith("-e"))
    )
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(d / "constraints.txt")]
    r = subprocess.run([*pip, *PYPROJECT["dependencies"]], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.skip(f"the base dependencies cannot be installed (no index, no cache): {r.stderr[-500:]}")
    # a copy of the tree (pip builds in place: no build/ or egg-info left in the checkout)
    src = d / "src"
    shutil.copytree(os.path.join(ROOT, "mltensor"), src / "mltensor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    r = subprocess.run([*pip, "--no-deps", str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return venv


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("prog", sorted(EXTRA))
def test_an_installed_entry_without_its_extra_names_it(prog, bare_venv, files, tmp_path):
    py = str(bare_venv / "bin" / "python")
    extra = EXTRA[prog]
    code = f"from mltensor.apps.cli import missing_modules as m; print(m({cli.EXTRAS[extra]!r}))"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() != "[]", r.stdout + r.stderr  # the extra is not there
    args = [a.format(tmp=tmp_path, files=files) for a in ARGS[prog]]
    r = subprocess.run(
        [str(bare_venv / "bin" / prog), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert_polite(r, prog, f"needs the {extra} extra: pip install 'mltensor[{extra}]'")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_editable_install_prints_no_setuptools_notice(tmp_path):
    """setup.sh's `pip install -q -e .` with a current pip shows the build backend's warnings; a
    layout setuptools calls simple (every package at its dotted path from the root, package-dir
    {"": "."}) installs with a .pth file and no "Editable installation" notice (issue 46)."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "mltensor"), src / "mltensor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=120)
    py = str(tmp_path / "venv" / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"pip cannot be upgraded (no index, no cache): {r.stderr[-300:]}")
    r = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "-e", str(src)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    for notice in ("Editable install", "BuildBackendWarning", "SetuptoolsDeprecationWarning", "!!"):
        assert notice not in out, out[-3000:]
