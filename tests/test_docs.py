"""The README is a front door and the rest is the docs site (mkdocs.yml, docs/; `make docs` builds
it with `--strict`, which fails on a broken link or anchor between pages). Here: every relative
link of the README and of the docs pages names a file that exists, and an anchor names a heading of
that file as GitHub spells it, so the links work on GitHub as well as in the site; the README
stays short; every page is in the site's nav.
"""
import re

import pytest

from conftest import REPO

LINK = re.compile(r"(?<!!)\[(?:[^\]]*)\]\(([^)\s]+)\)")
PAGES = sorted((REPO / "docs").glob("*.md"))


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def github_anchors(path) -> set[str]:
    """The ids GitHub gives a Markdown file's headings: lowercase, punctuation dropped, each space a
    hyphen, a repeated slug numbered -1, -2, ..."""
    seen, anchors = {}, set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M).splitlines():
        m = re.match(r"#{1,6} +(.*?) *#*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))          # a link: its text
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_links(path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and (dest.is_dir() or anchor not in github_anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("path", [REPO / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "make demo" in readme and "make test" in readme
    linked = {m.split("#")[0] for m in LINK.findall(prose(readme))}
    assert {"docs/install.md", "docs/results.md", "docs/adding-a-trick.md", "docs/calibration.md"} <= linked


def test_every_page_is_in_the_nav():
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    assert [p.name for p in PAGES if not re.search(rf":\s+{re.escape(p.name)}\s*$", nav, re.M)] == []


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Two words: `code`\n\n[ok](#two-words-code) [gone](b.md) "
                                   "[bad](#nope)\n\n```\n[in code](c.md)\n```\n")
    assert broken_links(tmp_path / "a.md") == [f"b.md: no file {tmp_path / 'b.md'}", "#nope: no heading #nope in a.md"]
