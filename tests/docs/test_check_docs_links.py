"""scripts/check_docs_links.py: relative Markdown links resolve to a file and, with an #anchor, to one of
its headings (GitHub's ids). The checker on written fixtures, then on the repository's own docs."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_docs_links", ROOT / "scripts" / "check_docs_links.py")
links = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(links)


def test_heading_ids_are_githubs():
    assert links.slug("The top-k's one-read pass (paths 15 and 16): measured") == (
        "the-top-ks-one-read-pass-paths-15-and-16-measured"
    )
    assert links.slug("`mhc/pre`, 16k × 4 — 28 D bytes/token") == "mhcpre-16k--4--28-d-bytestoken"
    assert links.slug("paths 17–19 and [a link](x.md)") == "paths-1719-and-a-link"
    assert links.slug("dsa_indexer: scores") == "dsa_indexer-scores"


def test_repeated_headings_are_numbered_and_fenced_ones_ignored(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n## Run\n## Run\n```\n## Not a heading\n```\n## Run\n", encoding="utf-8")
    assert links.anchors(page) == {"title", "run", "run-1", "run-2"}


def test_broken_links_are_reported_with_file_line_and_reason(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B page\n## Numbers\n", encoding="utf-8")
    (tmp_path / "a.md").write_text(
        "# A\n"
        "[ok](docs/b.md#numbers) [ok too](docs/b.md) [self](#a) [web](https://example.com/x#y)\n"
        "[gone](docs/c.md) `[code](docs/c.md)`\n"
        "```\n[fenced](docs/c.md)\n```\n"
        "[wrong heading](docs/b.md#totals) [wrong self](#b)\n"
        "a link whose [text\nwraps](docs/b.md#wraps)\n",
        encoding="utf-8",
    )
    found = links.broken_links(tmp_path, [tmp_path / "a.md"])
    assert [(str(f), no, target, why) for f, no, target, why in found] == [
        ("a.md", 3, "docs/c.md", "no such file"),
        ("a.md", 7, "docs/b.md#totals", "no such heading"),
        ("a.md", 7, "#b", "no such heading"),
        ("a.md", 9, "docs/b.md#wraps", "no such heading"),
    ]


def test_the_repositorys_docs_have_no_broken_links():
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_docs_links.py"), str(ROOT)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.endswith(" broken links\n") and ", 0 broken links" in run.stdout
