"""Every relative link in the README and the docs resolves: the file exists, and an anchor names a heading of it
(GitHub's slugs: lower case, punctuation dropped, spaces to hyphens, repeats numbered)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The page without its fenced code blocks (a link-shaped string in code is not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("    "):
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    out |= set(re.findall(r'<a (?:name|id)="([^"]+)"', page.read_text(encoding="utf-8")))
    return out


def broken_links() -> list[str]:
    broken = []
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading with that anchor")
    return broken


def test_slugs_follow_githubs_rule() -> None:
    assert slug("The shipped recipe: a KL to the stage's start in stages 2, 3 and 5") == (
        "the-shipped-recipe-a-kl-to-the-stages-start-in-stages-2-3-and-5"
    )
    assert slug("Curriculum v3: the GenEval stages on GenEval's own verdict") == (
        "curriculum-v3-the-geneval-stages-on-genevals-own-verdict"
    )
    assert slug("`vgrpo train` and `--set`") == "vgrpo-train-and---set"


def test_every_relative_link_in_the_docs_resolves() -> None:
    assert broken_links() == []
