"""Every recursive walk is known and tested at and past its bound (issue 24, defect 2: the tree walks
stopped silently at depth 32). A new `WITH RECURSIVE` in a named query or a migration fails here
until it is listed below with the tests that walk it past any limit it might hide."""

from __future__ import annotations

import re
from pathlib import Path

from scheduler.store.migrate import available_migrations
from scheduler.store.queries import Q

ROOT = Path(__file__).resolve().parents[2]
TREES = "tests/integration/scheduler/test_run_trees.py"
# Query name (or migration file) → the tests that walk it: a chain of 45 (past the old 32), a wide
# tree read in pages, detached branches, and at the spawn limits.
TESTED_WALKS: dict[str, tuple[str, ...]] = {
    "run_tree": (f"{TREES}::test_the_tree_of_a_deep_chain_answers_every_run",
                 f"{TREES}::test_a_wide_tree_is_read_page_by_page_in_breadth_first_order"),
    "cancellable_descendants": (f"{TREES}::test_cancelling_the_root_of_a_deep_chain_cancels_every_descendant",
                                f"{TREES}::test_cancelling_a_run_in_the_middle_cancels_its_subtree_only"),
    "0019_bounded_trees_and_settings_rls": (
        f"{TREES}::test_migration_0019_finds_the_root_and_depth_of_every_run_made_before_it",),
}
_RECURSIVE = re.compile(r"\bWITH\s+RECURSIVE\b", re.IGNORECASE)


def recursive_queries() -> set[str]:
    return {name for name, sql in Q.items() if _RECURSIVE.search(sql)}


def recursive_migrations() -> set[str]:
    return {f"{m.version:04d}_{m.name}" for m in available_migrations() if _RECURSIVE.search(m.sql)}


def test_every_recursive_walk_is_listed_with_its_tests() -> None:
    found = recursive_queries() | recursive_migrations()
    assert {"run_tree", "cancellable_descendants"} <= found  # the scan sees the walks it should
    assert found == set(TESTED_WALKS), "a recursive walk without tests at and past its bound (TESTED_WALKS)"
    # Counted in the raw file too: a block the query loader missed cannot hide.
    raw = (ROOT / "scheduler" / "sql" / "queries.sql").read_text()
    assert len(_RECURSIVE.findall(raw)) == len(recursive_queries())


def test_the_listed_tests_exist() -> None:
    for tests in TESTED_WALKS.values():
        for test in tests:
            path, name = test.split("::")
            assert re.search(rf"^async def {name}\(", (ROOT / path).read_text(), re.MULTILINE), test


def test_no_walk_of_a_tree_stops_at_a_depth_of_its_own() -> None:
    """A depth bound in a recursive step is a silent limit: the trees are bounded at SpawnChildren
    (max_spawn_depth, max_descendants_per_root), never by a walk that stops early."""
    for name in recursive_queries():
        sql = Q[name]
        assert not re.search(r"depth\s*<", sql), name
