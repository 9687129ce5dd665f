"""Plain Markdown links that work on GitHub and on the site alike.

The Markdown pages link with `[text](path)`, never with MyST roles such as {doc}, which GitHub
shows as raw text. A path to another page of docs/ (`guides/sessions.md`) works in both places as
it is. A few targets are not pages of the site's source tree but have a page on the site: the
gallery's sources (docs/gallery/, which sphinx-gallery renders into auto_gallery/) and the
repository's DESIGN.md and CONTRIBUTING.md (included by the internals pages). A page links to what
GitHub shows (`../gallery/`, `../../DESIGN.md`); before Sphinx parses a Markdown page, this
extension points those links at the pages the site renders from them.
"""

import posixpath
import re

# what a Markdown page links to (a path relative to docs/) -> the site's page for it (relative to docs/)
SITE_PAGES = {
    "gallery": "auto_gallery/index.rst",
    "../DESIGN.md": "internals/design.md",
    "../CONTRIBUTING.md": "internals/contributing.md",
}
LINK_RE = re.compile(r"\]\(([^()\s#]+)(#[^()\s]*)?\)")
FENCE_RE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def site_link(docname, target):
    """The link to write instead of `target` in page `docname` (no suffix), or None to keep it."""
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("/"):
        return None  # a URL, or a path the site resolves itself
    here = posixpath.dirname(docname)
    path = posixpath.normpath(posixpath.join(here, target)).rstrip("/")
    site = SITE_PAGES.get(path)
    if site is None and path.startswith("gallery/plot_") and path.endswith(".py"):
        site = "auto_gallery/" + path[len("gallery/") : -3] + ".rst"  # one example's rendered page
    if site is None:
        return None
    return posixpath.relpath(site, here or ".")


def rewrite_links(docname, text):
    """`text` (a Markdown page) with its links to SITE_PAGES' keys rewritten; code blocks untouched."""

    def link(m):
        new = site_link(docname, m.group(1))
        return m.group(0) if new is None else f"]({new}{m.group(2) or ''})"

    out, pos = [], 0
    for fence in FENCE_RE.finditer(text):
        out += [LINK_RE.sub(link, text[pos : fence.start()]), fence.group(0)]
        pos = fence.end()
    out.append(LINK_RE.sub(link, text[pos:]))
    return "".join(out)


def _source_read(app, docname, source):
    if str(app.env.doc2path(docname)).endswith(".md"):
        source[0] = rewrite_links(docname, source[0])


def setup(app):
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
