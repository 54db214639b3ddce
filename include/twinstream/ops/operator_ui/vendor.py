"""Refreshes vendor/: the files Data Docs load from CDNs, and those the operator page loads
(PAGE), taken from their npm packages.

    .venv/bin/python -m twinstream.ops.operator_ui.vendor     # needs npm; run after a GE upgrade

They are committed (a few MB), so that an install, a Docker build and the served pages need
no network. Each file's package, version and sha256 go into vendor/MANIFEST.json, which a
unit test checks the files against.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from twinstream.ops.operator_ui.datadocs import CDN, VENDOR

# Besides what the pages name: Font Awesome's CSS loads its fonts from ../webfonts/.
EXTRA = [
    f"@fortawesome/fontawesome-free@6.6.0/webfonts/fa-{name}.woff2"
    for name in ("solid-900", "regular-400", "brands-400", "v4compatibility")
]
# What the operator page (static/index.html) loads: uPlot draws its charts. Chosen over the
# vega-lite already here for Data Docs: ~50 KB against ~800 KB with vega and vega-embed,
# canvas drawing that redraws a 15-minute window every second without rebuilding a scene
# graph, and `setData` to move a chart in place; MIT, one maintainer active for years.
PAGE = ["uplot@1.6.32/dist/uPlot.iife.min.js", "uplot@1.6.32/dist/uPlot.min.css"]
# The packages' licences, kept beside their files.
LICENCES = ("LICENSE", "LICENSE.txt", "LICENSE.md")


def split(path: str) -> tuple[str, str, str]:
    """`@scope/name@1.2.3/dist/x.js` -> (`@scope/name`, `1.2.3`, `dist/x.js`)."""
    if path.startswith("@"):
        scope, name_version, rest = path.split("/", 2)
        name, version = name_version.rsplit("@", 1)
        return f"{scope}/{name}", version, rest
    head, _, rest = path.partition("/")
    name, version = head.rsplit("@", 1)
    return name, version, rest


def main() -> int:
    wanted: dict[tuple[str, str], set[str]] = {}
    for path in [*CDN.values(), *EXTRA, *PAGE]:
        name, version, inner = split(path)
        wanted.setdefault((name, version), set()).add(inner)
    manifest: dict[str, dict[str, str]] = {}
    shutil.rmtree(VENDOR, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        for (name, version), files in sorted(wanted.items()):
            print(f"npm pack {name}@{version}: {len(files)} file(s)", flush=True)
            out = subprocess.run(
                ["npm", "pack", f"{name}@{version}", "--json", "--pack-destination", tmp],
                check=True,
                capture_output=True,
                text=True,
            )
            tarball = Path(tmp) / json.loads(out.stdout)[0]["filename"]
            with tarfile.open(tarball) as tar:
                members = {m.name.removeprefix("package/"): m for m in tar.getmembers()}
                for inner in sorted(files | {f for f in LICENCES if f in members}):
                    if inner not in members:
                        raise SystemExit(f"{name}@{version} has no {inner}")
                    data = tar.extractfile(members[inner])
                    assert data is not None
                    content = data.read()
                    target = VENDOR / f"{name}@{version}" / inner
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                    manifest[f"{name}@{version}/{inner}"] = {
                        "package": name,
                        "version": version,
                        "sha256": hashlib.sha256(content).hexdigest(),
                    }
    (VENDOR / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    size = sum(p.stat().st_size for p in VENDOR.rglob("*") if p.is_file())
    print(f"wrote {len(manifest)} files ({size / 1e6:.1f} MB) into {VENDOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
