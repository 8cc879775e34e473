import pytest

from executor import migrations
from executor.agents import parse_definition
from executor.checkpoint import SCHEMA_VERSION, UnsupportedCheckpoint
from executor.migrations import load_state
from executor.steps import initial_state

AGENT = parse_definition({"name": "a", "version": "1",
                          "decider": {"kind": "scripted", "plan": [{"id": "x", "finish": 1}]}})


def test_round_trip_of_the_current_version():
    state = initial_state(AGENT)
    data = state.to_json_dict()
    assert "pending_tool" not in data  # absent, not null: the scheduler's Tx1 check reads it
    assert load_state(data, SCHEMA_VERSION) == state


@pytest.mark.parametrize("version", [0, SCHEMA_VERSION + 1, 99])
def test_an_unknown_schema_version_is_refused(version):
    with pytest.raises(UnsupportedCheckpoint, match=f"schema version {version} is not supported"):
        load_state(initial_state(AGENT).to_json_dict(), version)


def test_a_state_missing_fields_is_refused_not_zero_filled():
    data = initial_state(AGENT).to_json_dict()
    del data["versions"]
    with pytest.raises(UnsupportedCheckpoint, match="versions"):
        load_state(data, SCHEMA_VERSION)
    with pytest.raises(UnsupportedCheckpoint, match="surprise"):
        load_state({**initial_state(AGENT).to_json_dict(), "surprise": 1}, SCHEMA_VERSION)


def test_registered_migrations_run_in_order(monkeypatch):
    old = initial_state(AGENT).to_json_dict()
    old["versions"]["agent"] = "renamed-later"
    legacy = {"cursor_v0": "c", **{k: v for k, v in old.items() if k != "cursor"}}

    def v0_to_v1(data):
        data = dict(data)
        data["cursor"] = data.pop("cursor_v0")
        return data

    monkeypatch.setitem(migrations.MIGRATIONS, 0, v0_to_v1)
    state = load_state(legacy, 0)
    assert state.cursor == "c" and state.versions.agent == "renamed-later"
