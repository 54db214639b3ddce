"""Which code a pipeline runs: the version its owner declares, and a digest of its code.

Guarantee: two engines report the same version only if they loaded the same declared
version from byte-identical code, every ``.py`` file of the folder that holds the pipeline's
module (its package: ``pipelines/<name>/``) but its tests; a change the owner did not declare
still changes the digest. Its tests (pytest's ``test_*.py``, ``*_test.py`` and
``conftest.py``) are not what an engine runs: a test added beside the code is no new version
to deploy. Reading the code on disk never changes what an engine runs: an engine's version
is fixed when it loads its pipeline, and a later digest of the disk only says whether the
two still match.

A module alone in a folder shared with other code (``my_code/pipeline.py`` beside other
modules) has that folder's every file in its digest: a change there is seen as a change of
the pipeline, never the other way round.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

# A digest's length in hex digits: 48 bits, enough to tell a pipeline's versions apart.
DIGEST_HEX = 12


@dataclass(frozen=True)
class CodeVersion:
    """What an engine runs: `declared` (the contract's `version`, "" if none) and `digest`
    (of its code); shown as ``declared+digest``, or the digest alone."""

    declared: str
    digest: str

    def __str__(self) -> str:
        return f"{self.declared}+{self.digest}" if self.declared else self.digest

    @classmethod
    def parse(cls, text: str) -> CodeVersion:
        declared, sep, digest = text.rpartition("+")
        return cls(declared, digest) if sep else cls("", text)


# An engine built without its code's version (a unit test's fakes).
UNVERSIONED = CodeVersion("", "")


def is_test(path: Path) -> bool:
    """A file pytest collects or configures from, which no engine imports."""
    return (
        path.name == "conftest.py" or path.name.startswith("test_") or path.stem.endswith("_test")
    )


def digest(folder: Path) -> str:
    """The digest of every .py file under `folder` but its tests (their paths relative to
    it and their bytes, in path order; caches left out)."""
    sha = hashlib.sha256()
    files = sorted(
        p
        for p in folder.rglob("*.py")
        if "__pycache__" not in p.parts and p.is_file() and not is_test(p)
    )
    for path in files:
        sha.update(path.relative_to(folder).as_posix().encode())
        sha.update(b"\0")
        sha.update(path.read_bytes())
        sha.update(b"\0")
    return sha.hexdigest()[:DIGEST_HEX]
