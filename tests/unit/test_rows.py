"""Row.of: the compiled constructor builds what the dataclass's own __init__ would."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

import scheduler.store  # noqa: F401 - every row class of the store is defined by now
from scheduler.states import RunStatus, run_status
from scheduler.store.rows import DbTableHealth, Row, RunRow


class Record(dict[str, Any]):
    """Reads like an asyncpg Record: by name, by position, keys in column order."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            return list(self.values())[key]
        return super().__getitem__(key)


@dataclasses.dataclass(frozen=True, slots=True)
class Sample(Row):
    a: int
    b: str
    c: int = 7
    d: list[int] = dataclasses.field(default_factory=list)


def test_fields_by_name_whatever_the_column_order_and_extra_columns_left_out() -> None:
    row = Sample.of(Record(extra=1, b="x", a=3))
    assert row == Sample(a=3, b="x")
    assert (row.c, row.d, row["b"]) == (7, [], "x")
    other = Sample.of(Record(a=1, b="y", c=9, d=[1]))  # another shape: its own constructor
    assert other == Sample(1, "y", 9, [1])
    assert len(Sample._builders) == 2


def test_default_factories_give_each_row_its_own_value_and_rows_stay_frozen() -> None:
    first, second = Sample.of(Record(a=1, b="p")), Sample.of(Record(a=2, b="q"))
    assert first.d is not second.d
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.a = 5  # type: ignore[misc]


def test_a_missing_required_field_is_the_dataclass_type_error() -> None:
    with pytest.raises(TypeError, match="b"):
        Sample.of(Record(a=1))


def test_overrides_win_over_columns() -> None:
    assert Sample.of(Record(a=1, b="x"), b="z", c=2) == Sample(1, "z", 2)


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


# slots=True makes a new class: the one its module names is the one the store uses.
ROW_CLASSES = sorted({c for c in _subclasses(Row) if c.__module__.startswith("scheduler.")
                      and getattr(sys.modules[c.__module__], c.__name__, None) is c}, key=lambda c: c.__name__)


@pytest.mark.parametrize("row_class", ROW_CLASSES, ids=lambda c: c.__name__)
def test_every_row_class_builds_as_its_init_would(row_class: type) -> None:
    """Every row class the store hands out, from a record of its required fields in reverse order plus a
    column it does not have: the compiled constructor gives what the dataclass's own __init__ gives, with
    a coerced column (a run's status) given a real database value and coerced the same way."""
    fields = dataclasses.fields(row_class)
    required = [f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    coerce = row_class._coerce
    record = Record({name: DB_VALUES[name] if name in coerce else (i, name)
                     for i, name in enumerate(reversed(required))}, not_a_field="x")
    expected = row_class(**{name: coerce[name](record[name]) if name in coerce else record[name]
                            for name in required})
    assert row_class.of(record) == expected


# A database value for each coerced column of the row classes.
DB_VALUES = {"status": "WAITING_TOOL"}


def test_a_run_status_column_becomes_the_enum_and_an_unknown_one_is_refused() -> None:
    assert {c.__name__ for c in ROW_CLASSES if "status" in c._coerce} >= {"RunRow", "ChildRow"}
    assert all(set(c._coerce) <= set(DB_VALUES) for c in ROW_CLASSES)
    with pytest.raises(KeyError):
        run_status("SLEEPING")
    assert run_status("QUEUED") is RunStatus.QUEUED


def test_real_row_classes_match_their_init() -> None:
    names = [f.name for f in dataclasses.fields(RunRow)]
    required = [f.name for f in dataclasses.fields(RunRow)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    record = Record({name: DB_VALUES.get(name, i) for i, name in enumerate(reversed(required))}, db_now=None,
                    surplus="s")
    row = RunRow.of(record)
    assert row == RunRow(**{n: run_status(record[n]) if n == "status" else record[n] for n in names if n in record})
    assert row.status is RunStatus.WAITING_TOOL
    health = [f.name for f in dataclasses.fields(DbTableHealth)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    record = Record({name: 1 for name in health})
    assert DbTableHealth.of(record) == DbTableHealth(**record)
