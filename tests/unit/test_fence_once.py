"""The fence is judged once, in SQL: by the predicate every fenced write matches (the `live_lease`
fragment of scheduler/sql/queries.sql) and, to explain a write that matched nothing, by the
diagnosis reads that select that same fragment as `holds_lease`. No Python copy of the predicate:
this sweep reads every module of the scheduler and fails on code that looks at a run's lease owner,
lease expiry or liveness to decide for itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from scheduler.store.queries import Q

SCHEDULER = Path(__file__).resolve().parents[2] / "scheduler"
LEASE_COLUMNS = {"lease_owner", "lease_expires_at", "lease_live"}


def _is_lease_read(node: ast.AST) -> bool:
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and node.slice.value in LEASE_COLUMNS)


def lease_reads(source: str) -> list[int]:
    """Lines where code decides on a lease column of a row (`run["lease_owner"] == ...`, `and
    run["lease_live"]`, `if not run["lease_live"]`): the makings of a second fence check. Reading
    one to answer with it (the new expiry a heartbeat returns) is no judgement and is left alone."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.BoolOp):
            operands = node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            operands = [node.operand]
        elif isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            operands = [node.test]
        else:
            continue
        lines += [operand.lineno for operand in operands if _is_lease_read(operand)]
    return sorted(lines)


def test_no_module_of_the_scheduler_judges_a_lease_in_python():
    found = {str(path.relative_to(SCHEDULER)): lines for path in sorted(SCHEDULER.rglob("*.py"))
             if (lines := lease_reads(path.read_text()))}
    assert found == {}, f"lease columns read in code (judge the fence in SQL, `holds_lease`): {found}"


def test_the_sweep_would_notice_a_planted_copy():
    planted = ('holder = run["lease_owner"] == lease.worker_id and run["fencing_token"] == lease.fencing_token '
               'and run["lease_live"]\n')
    assert lease_reads(planted) == [1, 1]


def test_the_diagnosis_reads_use_the_fenced_writes_own_predicate():
    raw = _bodies()
    for name in ("read_run_for_lease", "lock_run_for_lease"):
        assert "({live_lease}) AS holds_lease" in raw[name], name
        assert set(Q.query(name).params) == {"run_id", "worker_id", "fencing_token"}, name
    assert "{live_lease}" in raw["fenced_guard"]  # the guard every fenced write matches starts from it
    fenced = [name for name, body in raw.items() if re.search(r"\{fenced_(guard|cas)(@\w+)?\}", body)]
    assert len(fenced) >= 8, fenced


def _bodies() -> dict[str, str]:
    """Every `-- name:` and `-- fragment:` block of queries.sql, as written (fragments not expanded)."""
    text = (SCHEDULER / "sql" / "queries.sql").read_text()
    parts = re.split(r"^-- (?:name|fragment): (\w+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))
