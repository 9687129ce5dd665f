"""Give wgpu's Vulkan stack a valid XDG_RUNTIME_DIR before it loads.

On Linux, libwayland (pulled in by Mesa's and the NVIDIA driver's window-system code) prints
"error: XDG_RUNTIME_DIR is invalid or not set in the environment." on every start when the
variable is unset, as in containers, CI and ssh sessions without a login manager. mltensor never
opens a Wayland display, so the message is noise. When the variable is unset we point it at a
private directory (mode 0700, owned by us: what the XDG spec asks for); a value the user set is
left alone, and nothing is redirected, so real errors still reach stderr.

Also `cache_dir()`, the XDG cache directory every on-disk cache of mltensor lives under (models,
graphs, compiled kernels, autotune results, cffi tables, the replay library): a floor-0 home, so
runtime/ and graphcache/ find it without importing models.py.
"""

import os
import sys
import tempfile


def ensure_runtime_dir() -> None:
    if not sys.platform.startswith("linux") or os.environ.get("XDG_RUNTIME_DIR"):
        return
    path = os.path.join(tempfile.gettempdir(), f"mltensor-runtime-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return
    # someone else's directory (or a link planted in /tmp) is not ours to use
    if st.st_uid == os.getuid() and (st.st_mode & 0o777) == 0o700 and os.path.isdir(path) and not os.path.islink(path):
        os.environ["XDG_RUNTIME_DIR"] = path


def cache_dir() -> str:
    """The directory mltensor's caches live in: models, graphs, compiled kernels... (not created
    here).

    Returns
    -------
    str
        ``$MLTENSOR_CACHE`` when set, else ``$XDG_CACHE_HOME/mltensor``, else
        ``~/.cache/mltensor``.
    """
    d = os.environ.get("MLTENSOR_CACHE")
    if d:
        return os.path.abspath(os.path.expanduser(d))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mltensor")
