"""The event contract against the code that writes events (docs/events/asyncapi.yaml).

Every outbox write site is read: the SQL blocks that INSERT INTO outbox (their 'agent.*'
literals), the Python calls of the one event helper (`insert_event` of scheduler/store/core.py, its type argument
followed back to its string constants), the audit writer (`write_audit`: `agent.audit.<action>`
for every action any caller can pass), and SaveCheckpoint's default type. Their union must be
exactly the document's message names: a type the code can write is documented, and a documented
type is written somewhere. An emission site the test cannot follow fails it, so a new kind of
site is noticed rather than skipped.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from event_contract import contract
from jsonschema import Draft7Validator
from tests_paths import REPO

SCHEDULER = REPO / "scheduler"
SOURCES = ("scheduler", "executor", "relay", "shared")
FuncNode = ast.FunctionDef | ast.AsyncFunctionDef


class Unfollowable(AssertionError):
    pass


def _python_files() -> list[Path]:
    return sorted(p for root in SOURCES for p in (REPO / root).rglob("*.py") if "gen" not in p.parts)


def _functions(tree: ast.AST) -> Iterator[FuncNode]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


class Emitters:
    """Follows an expression back to the string constants it can hold, across the scheduler's functions."""

    def __init__(self) -> None:
        self.funcs: list[tuple[Path, FuncNode]] = []
        self.module_level: dict[FuncNode, Path] = {}  # functions called by name within their module
        for path in sorted(SCHEDULER.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for func in _functions(tree):
                self.funcs.append((path, func))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.module_level[node] = path

    def calls(self, name: str, *, within: Path | None = None,
              method: bool | None = None) -> Iterator[tuple[FuncNode, ast.Call]]:
        for path, func in self.funcs:
            if within is not None and path != within:
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and _called_name(node) == name and (
                        method is None or isinstance(node.func, ast.Attribute) == method):
                    yield func, node

    def values(self, expr: ast.expr, where: FuncNode, *, worker_chosen_ok: bool = False) -> set[str]:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.IfExp):
            return (self.values(expr.body, where, worker_chosen_ok=worker_chosen_ok)
                    | self.values(expr.orelse, where, worker_chosen_ok=worker_chosen_ok))
        if isinstance(expr, ast.Call) and worker_chosen_ok:
            return set()  # a worker-chosen name (SaveCheckpoint.event_type): documented as such
        if isinstance(expr, ast.Name):
            assigned = self._assigned(expr.id, where)
            if assigned:
                return set().union(*(self.values(v, where, worker_chosen_ok=worker_chosen_ok) for v in assigned))
            params = [a.arg for a in where.args.args + where.args.kwonlyargs]
            if expr.id in params:
                return self._from_callers(where, expr.id)
        raise Unfollowable(f"cannot follow {ast.unparse(expr)!r} in {where.name}()")

    @staticmethod
    def _assigned(name: str, where: FuncNode) -> list[ast.expr]:
        found: list[ast.expr] = []
        for node in ast.walk(where):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    found.append(node.value)
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for item, value in zip(target.elts, node.value.elts, strict=True):
                        if isinstance(item, ast.Name) and item.id == name:
                            found.append(value)
        return found

    def _from_callers(self, callee: FuncNode, param: str) -> set[str]:
        positional = [a.arg for a in callee.args.args]
        index = positional.index(param) if param in positional else None
        if index is not None and positional and positional[0] in {"self", "cls"}:
            index -= 1
        values: set[str] = set()
        module = self.module_level.get(callee)
        callers = list(self.calls(callee.name, within=module, method=False) if module is not None
                       else self.calls(callee.name, method=True))
        if not callers:
            raise Unfollowable(f"{callee.name}() has no callers to follow {param!r} into")
        for caller, call in callers:
            keyword = next((k.value for k in call.keywords if k.arg == param), None)
            if keyword is not None:
                values |= self.values(keyword, caller)
            elif index is not None and index < len(call.args):
                values |= self.values(call.args[index], caller)
            else:
                raise Unfollowable(f"a call of {callee.name}() in {caller.name}() without {param!r}")
        return values


def sql_event_types() -> set[str]:
    """'agent.*' literals of the named SQL blocks that insert outbox rows."""
    text = (SCHEDULER / "sql" / "queries.sql").read_text()
    blocks = re.split(r"^-- name: ", text, flags=re.MULTILINE)
    found: set[str] = set()
    for block in blocks:
        if re.search(r"INSERT INTO outbox\b", block):
            found |= set(re.findall(r"'(agent\.[a-z_.]+)'", block))
    return found


def python_event_types() -> set[str]:
    emitters = Emitters()
    found: set[str] = set()
    for func, call in emitters.calls("insert_event"):
        if len(call.args) < 3:
            raise Unfollowable(f"insert_event() call in {func.name}() without its type argument")
        found |= emitters.values(call.args[2], func)
    actions: set[str] = set()
    for func, call in emitters.calls("write_audit"):
        action = next((k.value for k in call.keywords if k.arg == "action"), None)
        assert action is not None, f"write_audit() in {func.name}() without action="
        actions |= emitters.values(action, func)
    found |= {f"agent.audit.{action}" for action in actions}
    [handler] = [f for _, f in emitters.funcs if f.name == "SaveCheckpoint"]
    [default] = emitters._assigned("event_type", handler)
    found |= emitters.values(default, handler, worker_chosen_ok=True)
    return found


def code_event_types() -> set[str]:
    return sql_event_types() | python_event_types()


def test_outbox_rows_are_written_only_where_this_test_looks():
    """SQL inserts live in scheduler/sql/queries.sql; Python reaches insert_event only through the two helpers."""
    for path in _python_files():
        text = path.read_text()
        assert not re.search(r"INSERT INTO outbox\b", text), f"{path}: an outbox insert outside queries.sql"
        if "Q.insert_event" in text:
            assert path.relative_to(REPO).as_posix() in {"scheduler/store/core.py", "scheduler/store/auth.py"}, path
    for sql in (REPO / "scheduler" / "sql" / "migrations").glob("*.sql"):
        assert not re.search(r"INSERT INTO outbox\b", sql.read_text()), sql


def test_every_type_the_code_writes_is_documented_and_every_documented_type_is_written():
    documented = set(contract().messages())
    written = code_event_types()
    assert {"agent.run_submitted", "agent.checkpoint", "agent.audit.key.create"} <= written  # the scan works
    assert written - documented == set(), "written but not in docs/events/asyncapi.yaml"
    assert documented - written == set(), "documented but written nowhere"


def test_the_scan_fails_on_a_site_it_cannot_follow():
    tree = ast.parse("def f(conn, run):\n    await insert_event(conn, run, pick(), {})\n")
    emitters = Emitters()
    [func] = list(_functions(tree))
    call = next(n for n in ast.walk(func) if isinstance(n, ast.Call) and _called_name(n) == "insert_event")
    with pytest.raises(Unfollowable):
        emitters.values(call.args[2], func)


def test_the_document_is_well_formed():
    c = contract()
    doc = c.document
    assert doc["asyncapi"].startswith("3.0")
    messages = doc["components"]["messages"]
    names = [m["name"] for m in messages.values()]
    assert len(names) == len(set(names))
    channel = doc["channels"]["agentEvents"]
    assert {ref["$ref"] for ref in channel["messages"].values()} == {
        f"#/components/messages/{key}" for key in messages}
    for operation in doc["operations"].values():
        assert operation["channel"] == {"$ref": "#/channels/agentEvents"}
    for key, message in messages.items():
        assert re.fullmatch(r"agent\.[a-z_]+(\.[a-z_]+)*", message["name"]), key
        assert message["traits"] == [{"$ref": "#/components/messageTraits/cloudEvent"}], key
        assert message.get("summary"), key
        assert message["payload"]["$ref"].startswith("#/components/schemas/"), key
        c.payload_validator(message["name"])  # resolves
    for name, schema in doc["components"]["schemas"].items():
        Draft7Validator.check_schema(schema)
        # Adding a payload field is not breaking: no schema closes its object.
        assert "additionalProperties: false" not in str(schema) and schema.get("additionalProperties", True), name
    headers = c.header_schema()
    assert set(headers["required"]) <= set(headers["properties"])


def test_the_schemas_refuse_what_the_contract_rules_out():
    c = contract()
    requested = {"step_key": "s", "tool_name": "t", "idempotency_key": "k",
                 "execution_id": "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "added_later": [1]}
    assert c.payload_validator("agent.tool_requested").is_valid(requested)
    assert not c.payload_validator("agent.tool_requested").is_valid({**requested, "execution_id": None})
    ended = {"status": "FAILED", "reason": "r", "error_class": None, "next_attempt_at": None, "attempt_count": 1}
    assert c.payload_validator("agent.run_failed").is_valid(ended)
    assert not c.payload_validator("agent.run_completed").is_valid(ended)
    headers = {"ce_specversion": "1.0", "ce_id": requested["execution_id"], "ce_source": "/agentrt",
               "ce_type": "agent.checkpoint", "ce_subject": requested["execution_id"],
               "ce_time": "2026-01-02T03:04:05.123456Z", "content-type": "application/json", "ce_tenantid": "t",
               "ce_fencingtoken": "1", "ce_runversion": "0", "ce_sequence": "00000000000000000042"}
    validator = c.validator("#/components/schemas/CloudEventHeaders")
    assert validator.is_valid(headers)
    for name, bad in (("ce_sequence", "42"), ("ce_time", "2026-01-02 03:04:05"), ("ce_specversion", "0.3")):
        assert not validator.is_valid({**headers, name: bad}), name
    assert not validator.is_valid({k: v for k, v in headers.items() if k != "ce_id"})
