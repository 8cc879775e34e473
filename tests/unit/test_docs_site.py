"""The documentation site (mkdocs.yml over docs/) builds in strict mode: a broken link or anchor, or a
nav entry without its page, fails here. The README stays a short front page whose links resolve, and
no page cites a document the reader does not have."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests_paths import REPO

DOCS = REPO / "docs"


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=120, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    built = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "flow-control" / "index.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("node_modules"))
    index = tmp_path / "docs" / "index.md"
    original = index.read_text()
    for broken in ("[gone](no-such-page.md)", "[gone](flow-control.md#no-such-section)"):
        index.write_text(original + f"\nSee {broken}.\n")
        built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
        assert built.returncode != 0, broken
        assert "no-such" in built.stderr, built.stderr


def test_a_page_not_yet_in_the_nav_builds(tmp_path: Path) -> None:
    """A page on disk that the nav does not list yet (added with its feature, put in the nav later) is
    no failure; a nav entry without its page is."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("node_modules"))
    (tmp_path / "docs" / "not-in-nav.md").write_text("# Not in the nav\n\nSee [flow control](flow-control.md).\n")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "not-in-nav" / "index.html").is_file()
    config = (tmp_path / "mkdocs.yml").read_text()
    (tmp_path / "mkdocs.yml").write_text(config.replace("  - Contributing: contributing.md",
                                                        "  - Contributing: contributing.md\n  - Gone: gone.md"))
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0 and "gone.md" in built.stderr, built.stderr


def test_the_readme_is_a_short_front_page_whose_links_resolve() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert "docs/first-agent.md" in local and "docs/helm.md" in local
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing, missing


def test_every_nav_page_is_linked_from_the_readme() -> None:
    """The README's documentation list is the site's map: each page of the nav is one link away."""
    nav = re.findall(r":\s+(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M)
    readme = (REPO / "README.md").read_text()
    assert len(nav) >= 30
    unlinked = [page for page in nav if page != "index.md" and f"(docs/{page})" not in readme]
    assert not unlinked, unlinked


def test_no_page_cites_a_document_the_reader_does_not_have() -> None:
    # The README's sections moved to these pages: "see the README" sends a reader nowhere.
    outside = re.compile(r"\breference (?:section |sections )?\d|\binvariant \d|\(reference\b|the reference's"
                         r"|(?<![/\w])README(?!\.md)")
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    bad = [f"{page.relative_to(REPO)}:{n}: {line.strip()}"
           for page in pages if "node_modules" not in page.parts
           for n, line in enumerate(page.read_text().splitlines(), 1) if outside.search(line)]
    assert not bad, bad


def test_no_source_comment_cites_a_readme_section() -> None:
    """The README is a front page now: code and chart comments cite the docs page that holds the text.
    Applied migrations are immutable (their checksums are recorded), so their comments stay as written."""
    cites = re.compile(r"\(README[,:]|\bREADME, ")
    roots = ["scheduler", "executor", "relay", "shared", "cli", "devstack", "console", "bench", "helm", "tests"]
    bad = [f"{path.relative_to(REPO)}:{n}"
           for root in roots for path in sorted((REPO / root).rglob("*"))
           if path.suffix in {".py", ".yaml", ".sql", ".tpl"} and "migrations" not in path.parts
           and "gen" not in path.parts
           for n, line in enumerate(path.read_text().splitlines(), 1) if cites.search(line)]
    assert not bad, bad
