"""Great Expectations Data Docs that render offline.

GE 1.x's pages load Bootstrap, jQuery, Font Awesome, bootstrap-table and Vega from public
CDNs and its logo from its own bucket, with no setting to point them elsewhere (its
templates are found before any of ours). The plugin therefore rewrites each page as it
serves it: every such URL becomes the same file, vendored from its npm package
(`vendor/`, with MANIFEST.json: package, version, sha256), under the plugin's prefix.
Rewriting at serve time, not on disk, keeps working when the next audit rewrites the pages.
"""

from __future__ import annotations

import re
from pathlib import Path

VENDOR = Path(__file__).parent / "vendor"

# Each CDN URL of GE 1.x's templates (render/view/templates/page.j2, index_page.j2,
# js_script_imports.j2) -> the vendored file, relative to vendor/.
CDN: dict[str, str] = {
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        "bootstrap-table@1.19.1/dist/bootstrap-table.min.css"
    ),
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": (
        "bootstrap@4.3.1/dist/css/bootstrap.min.css"
    ),
    (
        "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.css"
    ): ("bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.css"),
    (
        "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.min.css"
    ): (
        "bootstrap-table@1.19.1/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.min.css"
    ),
    (
        "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/"
        "bootstrap-datepicker.min.css"
    ): ("bootstrap-datepicker@1.9.0/dist/css/bootstrap-datepicker.min.css"),
    (
        "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/"
        "bootstrap-prefers-dark.css"
    ): ("@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css"),
    "https://cdn.jsdelivr.net/npm/vega@5": "vega@5.33.0/build/vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite@5.23.0/build/vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed@6.29.0/build/vega-embed.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        "@fortawesome/fontawesome-free@6.6.0/css/all.min.css"
    ),
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery@3.7.1/dist/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": (
        "popper.js@1.12.9/dist/umd/popper.min.js"
    ),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": (
        "bootstrap@4.3.1/dist/js/bootstrap.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        "bootstrap-table@1.19.1/dist/bootstrap-table.min.js"
    ),
    (
        "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.min.js"
    ): (
        "bootstrap-table@1.19.1/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.min.js"
    ),
    (
        "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/"
        "bootstrap-datepicker.min.js"
    ): ("bootstrap-datepicker@1.9.0/dist/js/bootstrap-datepicker.min.js"),
}

# GE's logo from its bucket (with a query string naming the data context): its own copy,
# which GE writes into every site's static/images/.
_LOGO = re.compile(
    r"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/logo-long\.png[^\"')\s]*"
)
# The dark-mode background logo has no local copy: dropped (the <img> logo shows instead).
_DARK_LOGO = re.compile(
    r"url\(\s*['\"]?https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/[^)]*\)"
)
# Subresource-integrity and CORS attributes of the CDN tags: same-origin files need neither.
_SRI = re.compile(r"\s+(?:integrity|crossorigin)=\"[^\"]*\"")
# What must never be left in a served page: a resource loaded from elsewhere.
# (Plain links, <a href>, load nothing until clicked.)
EXTERNAL = re.compile(
    r"""<(?:link|script|img|iframe|source|embed)\b[^>]*?\s(?:src|href)\s*=\s*["']https?://[^"']*"""
    r"""|url\(\s*['"]?https?://[^)]*"""
)


def offline(html: str, vendor_url: str, site_url: str) -> str:
    """A Data Docs page whose every stylesheet, script, font and image comes from this
    server: `vendor_url` serves vendor/, `site_url` the site's own root."""
    for cdn, local in CDN.items():
        html = html.replace(f'"{cdn}"', f'"{vendor_url}/{local}"')
    html = _LOGO.sub(f"{site_url}/static/images/logo-long.png", html)
    html = _DARK_LOGO.sub("none", html)
    return _SRI.sub("", html)


def external_resources(html: str) -> list[str]:
    """The attributes of `html` that would still load from another host (for tests and for
    a warning when a GE upgrade brings a URL the table lacks)."""
    return [m.group(0) for m in EXTERNAL.finditer(html)]


def safe_file(root: Path, relative: str) -> Path | None:
    """`relative` inside `root`, an existing file, never outside it (no `..`, no absolute
    path, no symlink out); None otherwise."""
    try:
        candidate = (root / relative).resolve()
        base = root.resolve()
    except (OSError, ValueError):
        return None
    if not candidate.is_relative_to(base) or not candidate.is_file():
        return None
    return candidate
