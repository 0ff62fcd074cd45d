#!/usr/bin/env python3
"""Every relative link of the repository's Markdown files resolves: the file it names exists and its
#anchor is one of that file's headings (GitHub's heading ids)."""

import re
import subprocess
import sys
from pathlib import Path

LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading):
    """GitHub's id of a heading: lower case, markup and punctuation dropped but for - and _, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def without_fences(text):
    """The text with the lines of fenced code blocks (their fences too) emptied, the others in place."""
    out, fenced = [], False
    for line in text.splitlines():
        fence = FENCE.match(line) is not None
        out.append("" if fenced or fence else line)
        fenced ^= fence
    return out


def anchors(path):
    """The ids of a Markdown file's headings, repeats numbered -1, -2, … as GitHub numbers them."""
    seen, ids = {}, set()
    for line in without_fences(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def prose(text):
    """The text outside fenced code blocks with inline code blanked, its lines where they were (a link's
    text may wrap onto the next line)."""
    body = "\n".join(without_fences(text))
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), body)


def broken_links(root, files):
    """(file, line number, target, why) for each relative link that does not resolve."""
    cache, out = {}, []
    for f in files:
        body = prose(f.read_text(encoding="utf-8"))
        for m in LINK.finditer(body):
            target, no = m.group(1), body.count("\n", 0, m.start(1)) + 1
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, …
                continue
            name, _, anchor = target.partition("#")
            dest = (f.parent / name).resolve() if name else f
            if not dest.exists():
                out.append((f.relative_to(root), no, target, "no such file"))
            elif anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    out.append((f.relative_to(root), no, target, "no such heading"))
    return out


def main(argv):
    """Checks the Markdown files git tracks under the repository root (argv[1], default: this checkout)."""
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    names = subprocess.run(["git", "ls-files", "*.md"], cwd=root, capture_output=True, text=True, check=True)
    files = [root / n for n in names.stdout.split()]
    bad = broken_links(root, files)
    for f, no, target, why in bad:
        print(f"{f}:{no}: ({target}): {why}")
    print(f"{len(files)} Markdown files, {len(bad)} broken links")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
