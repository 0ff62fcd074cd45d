#!/usr/bin/env python3
"""Unpack upstream Transformers releases from their PyPI wheels into .upstream/<name>-<version>/.

    scripts/fetch-upstream.py            # the pinned release (first line of requirements/upstream.txt)
    scripts/fetch-upstream.py --all      # every release listed there (the version matrix)
    scripts/fetch-upstream.py 5.23.0     # the named versions (must be listed)

Each wheel is downloaded with pip (no dependencies) into .deps/, its sha256 checked against
requirements/upstream.txt, and unpacked; a tree that is already there (with its .sha256 stamp) is
left alone, so the second run needs no network. Prints the unpacked folders. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "requirements" / "upstream.txt"
DEPS = ROOT / ".deps"
UPSTREAM = ROOT / ".upstream"


def pins() -> list[tuple[str, str, str]]:
    out = []
    for line in PINS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req, sha = line.split()
        name, version = req.split("==")
        out.append((name, version, sha))
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, version: str, sha: str) -> Path:
    dest = UPSTREAM / f"{name}-{version}"
    stamp = dest / ".sha256"
    if stamp.is_file() and stamp.read_text().strip() == sha:
        return dest
    wheel = DEPS / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    if not wheel.is_file() or sha256(wheel) != sha:
        DEPS.mkdir(exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
                str(DEPS),
                f"{name}=={version}",
            ],
            check=True,
        )
    have = sha256(wheel)
    if have != sha:
        raise SystemExit(f"fetch-upstream: {wheel}: sha256 {have} is not the pinned {sha} ({PINS})")
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp)
    (tmp / ".sha256").write_text(sha + "\n")
    tmp.rename(dest)
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", help="versions to fetch (default: the pinned one)")
    parser.add_argument("--all", action="store_true", help="every listed version")
    args = parser.parse_args()
    listed = pins()
    if args.all:
        wanted = listed
    elif args.versions:
        by_version = {v: (n, v, s) for n, v, s in listed}
        missing = [v for v in args.versions if v not in by_version]
        if missing:
            parser.error(f"not listed in {PINS.relative_to(ROOT)}: {', '.join(missing)}")
        wanted = [by_version[v] for v in args.versions]
    else:
        wanted = listed[:1]
    for name, version, sha in wanted:
        print(fetch(name, version, sha).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
