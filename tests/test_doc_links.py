"""No dead links in the documentation: every relative link in README.md, ARCHITECTURE.md
and docs/*.md names a file or folder of the repository, and a `#anchor` into a Markdown
file names one of its headings (as GitHub writes a heading's anchor)."""
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```$", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> Iterator[str]:
    """The anchors of a Markdown page's headings (GitHub numbers repeats: -1, -2, ...)."""
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        name = anchor(heading)
        seen[name] = seen.get(name, -1) + 1
        yield name if seen[name] == 0 else f"{name}-{seen[name]}"


def links(page: Path) -> list[str]:
    """The link targets of a page, outside its code blocks."""
    return LINK.findall(FENCE.sub("", page.read_text()))


def dead_links(page: Path) -> list[str]:
    dead = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        inside = file.exists() and ROOT in (file, *file.parents)
        if not inside or (fragment and file.suffix == ".md"
                          and fragment not in set(anchors(file))):
            dead.append(target)
    return dead


def test_the_docs_have_links_to_check():
    assert sum(len(links(page)) for page in PAGES) > 50


def test_no_relative_link_is_dead():
    dead = {str(page.relative_to(ROOT)): dead_links(page) for page in PAGES}
    assert not any(dead.values()), {page: targets for page, targets in dead.items() if targets}


def test_the_anchor_rule_follows_github(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# jgraph's guides\n## A chunked graph directory: graphs larger than "
                    "memory\n## Notes\n## Notes\n```text\n# not a heading\n```\n")
    assert list(anchors(page)) == ["jgraphs-guides",
                                   "a-chunked-graph-directory-graphs-larger-than-memory",
                                   "notes", "notes-1"]
