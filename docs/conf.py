"""Sphinx configuration of the mltensor documentation.

Why Sphinx (and not MkDocs + mkdocstrings): the projects our users already know, wgpu-py and
pygfx, document themselves with Sphinx + autodoc + sphinx-gallery, so the layout (API pages from
docstrings, a gallery of examples executed at build time with their output images) is familiar;
sphinx-gallery has no MkDocs equivalent that executes scripts and scrapes their figures; and a
Sphinx extension (docs/_ext/mltensor_docs.py) can import mltensor at build time to generate the
operator, model and benchmark tables from the code, so they cannot go stale. Guides are Markdown
(MyST), moved from README.md / DESIGN.md; the API reference is reStructuredText with autodoc.

Build (from the repository root; see docs/README.md):

    .venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
# Document the tree these docs live in (a fresh clone included), not whatever is installed.
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(DOCS, "_ext"))

import mltensor  # noqa: E402

project = "mltensor"
author = "the mltensor authors"
copyright = "the mltensor authors"
version = release = mltensor.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # numpydoc Parameters / Returns / Raises sections as tables (issue 46)
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
    "mltensor_docs",  # docs/_ext: generated tables, docstring and environment-variable checks
    "mltensor_links",  # docs/_ext: Markdown links to the gallery's and the repository's files, as the site has them
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# _generated/tables: included by the reference pages, not pages of their own.
# README.md: how to build the docs (for the repository, not the site).
exclude_patterns = [
    "_build",
    "_generated/tables",
    "README.md",
    "gallery/README.txt",
    "auto_gallery/*.ipynb",
    "auto_gallery/*.py",
    "auto_gallery/*.zip",
    "auto_gallery/*.md5",
    "auto_gallery/*.json",
]

# The docstrings use `single backticks` for code, as the rest of the project does.
default_role = "literal"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
# The types come from the docstrings' numpydoc sections (each parameter with its type and default,
# checked by _ext/mltensor_params.py), not from the annotations: one place, as written for users.
autodoc_typehints = "none"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_param = True  # a field list: one row per parameter, its type beside it
napoleon_use_rtype = True
napoleon_preprocess_types = False
# undoc-members only where a page asks for it (names still waiting for a docstring, see
# PENDING_DOCSTRINGS in _ext/mltensor_docs.py): the extension itself fails the build on a public
# name without a docstring.
# (no default "members": with it, automethod documents each builder method twice)
autodoc_default_options = {}

html_theme = "furo"
html_title = f"mltensor {release}"
html_static_path = []

# -- sphinx-gallery: docs/gallery/plot_*.py run at build time (on whatever adapter wgpu finds:
# lavapipe in CI), their output and figures captured. The scripts are thin: they call into
# examples/ (whose names the tests use, so they are not renamed).
sphinx_gallery_conf = {
    "examples_dirs": "gallery",
    "gallery_dirs": "auto_gallery",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "image_scrapers": ("matplotlib",),
    "matplotlib_animations": False,
    "show_memory": False,
    "min_reported_time": 0,
    "reset_modules": ("matplotlib",),
    "within_subsection_order": "FileNameSortKey",
    "capture_repr": ("_repr_html_", "__repr__"),
    "plot_gallery": "True",
    "write_computation_times": False,
    # execute every example at every build (not only changed ones): a change to mltensor that breaks
    # an example fails the docs build (tests/test_docs.py)
    "run_stale_examples": True,
}

# autodoc imports mltensor's lazily loaded names (InferenceSession, import_external_buffer_*);
# nothing in the docs build needs a display.
os.environ.setdefault("MPLBACKEND", "Agg")
# The video example's progress bar (stderr) would fill the gallery page: the summary says it all.
os.environ.setdefault("TQDM_DISABLE", "1")
