"""What the console entries (mltensor-selfie, mltensor-batch, mltensor-chat, mltensor serve) share: failures a
user can mend end in one line on stderr and exit code 2, never in a traceback.

An entry's `main` checks its extra first (`require_extra`: every module the run will import, so a
plain `pip install mltensor` gets `mltensor-chat: needs the llm extra: pip install 'mltensor[llm]'`
instead of an ImportError deep inside), then its files (`existing_file`, `readable_image`,
`writable_output`), then the adapter (`create_context`, `check_adapter`), and raises `AppError`
for what it finds; `run_entry` prints the error as `<prog>: <message>` and returns 2. stdout stays
the program's: only results go there.
"""

import importlib
import os
import sys

from ..errors import NotSupportedError
from ..front.context import ml
from ..models import FetchError

#: The exit status of a failure the user can mend (argparse's usage errors exit with it too).
EXIT_USAGE = 2

#: The modules an extra of pyproject.toml provides that the entries import (top-level names).
EXTRAS = {
    "llm": ("gguf", "tokenizers"),
    "examples": ("PIL", "av", "matplotlib", "rendercanvas", "glfw"),
    "ray": ("ray", "ray.data", "PIL", "av"),
    "serve": ("fastapi", "uvicorn", "sse_starlette", "prometheus_client", "gguf", "tokenizers"),
}

NO_ADAPTER = "no Vulkan/Metal/D3D12 adapter found"
ADAPTER_HINT = "on Linux without a GPU install Mesa's software Vulkan driver: apt-get install mesa-vulkan-drivers"


class AppError(Exception):
    """A failure the user can mend: a missing extra, a missing or unreadable file, no adapter, a
    model that cannot be fetched. The entry prints its message as one line and exits with 2."""


def one_line(text):
    """`text` with its line breaks folded: an error stays one line on stderr."""
    return " ".join(str(text).split())


def missing_modules(modules):
    """The names of `modules` that do not import (a submodule of a missing package is not repeated)."""
    missing = []
    for name in modules:
        if any(name.startswith(m + ".") for m in missing):
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def require_extra(extra, modules=None):
    """Raise AppError naming `pip install 'mltensor[<extra>]'` unless every module of `modules`
    (default: all of EXTRAS[extra]) imports."""
    missing = missing_modules(EXTRAS[extra] if modules is None else modules)
    if missing:
        raise AppError(
            f"needs the {extra} extra: pip install 'mltensor[{extra}]' (missing: {', '.join(sorted(missing))})"
        )


def existing_file(path, option):
    """`path` when it is a readable file, else AppError naming the `option` it came from."""
    if not os.path.isfile(path):
        raise AppError(f"{option}: no such file: {path}")
    if not os.access(path, os.R_OK):
        raise AppError(f"{option}: cannot read {path} (permission denied)")
    return path


def readable_image(path, option):
    """`path` when Pillow can decode it (the extra is checked before), else AppError."""
    from PIL import Image  # the examples / ray extra, checked by require_extra first

    existing_file(path, option)
    try:
        with Image.open(path) as im:
            im.convert("RGB")
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError... for what it cannot decode
        raise AppError(f"{option}: cannot read {path} as an image ({one_line(e)})") from None
    return path


def writable_output(path, option):
    """`path` when its folder exists (the file is created later), else AppError."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise AppError(f"{option}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise AppError(f"{option}: cannot write in {folder} (permission denied)")
    return path


def check_adapter(adapter):
    """AppError unless `adapter` (a wgpu adapter or None) runs on Vulkan, Metal or D3D12."""
    if adapter is None:
        raise AppError(f"{NO_ADAPTER} ({ADAPTER_HINT})")
    if adapter.info.get("backend_type") == "OpenGL":
        device = adapter.info.get("device", "?")
        raise AppError(f"{NO_ADAPTER}: the only adapter is {device} through OpenGL ({ADAPTER_HINT})")
    return adapter


def create_context(device=None, **options):
    """ml.create_context_sync(device, **options), with no usable adapter as AppError."""
    try:
        return ml.create_context_sync(device, **options) if device is not None else ml.create_context_sync(**options)
    except NotSupportedError as e:
        raise AppError(f"{NO_ADAPTER}: {one_line(e).removeprefix('[create_context] ')}") from None


def fetched(fetch, name):
    """fetch(name) (a models.fetch* function), with a failed download as AppError."""
    try:
        return fetch(name)
    except FetchError as e:
        raise AppError(one_line(e)) from None


def run_entry(prog, body, *args, stderr=None):
    """body(*args), an entry's work; an AppError becomes one line `<prog>: <message>` on stderr
    and the exit status 2, Ctrl-C the status 130, both without a traceback."""
    stderr = stderr or sys.stderr
    try:
        return body(*args)
    except AppError as e:
        stderr.write(f"{prog}: {one_line(e)}\n")
        stderr.flush()
        return EXIT_USAGE
    except KeyboardInterrupt:
        stderr.write("\n")
        return 130
