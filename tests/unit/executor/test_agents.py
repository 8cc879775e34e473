import os
import subprocess
import sys

import pytest
import yaml

from executor.agents import AgentCatalog, DefinitionError, load_file, parse_definition

GOOD = {
    "name": "returns", "version": "2",
    "decider": {"kind": "scripted", "plan": [{"id": "a", "tool": "t.get", "args": {"x": 1}},
                                             {"id": "b", "finish": "done"}]},
    "tools": [{"name": "t.get", "kind": "http", "url": "http://127.0.0.1:1/t", "lookup_url": "http://127.0.0.1:1/l",
               "contract": {"lookup": True, "fenced": True},
               "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}],
    "budgets": {"max_steps": 10}, "policy": {"version": "p7"}, "model": {"name": "m", "version": "3"},
}


def bad(**changes):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    for path, value in changes.items():
        target = data
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if value is None:
            del target[last]
        else:
            target[last] = value
    return data


def test_a_good_definition_loads_from_yaml_and_toml(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(GOOD))
    (tmp_path / "b.toml").write_text('name = "other"\nversion = "1"\n[decider]\nkind = "scripted"\n'
                                     '[[decider.plan]]\nid = "x"\nfinish = "ok"\n')
    catalog = AgentCatalog.load(str(tmp_path))
    assert catalog.names() == ["other", "returns"]
    agent = catalog.get("returns")
    assert agent is not None and agent.tool("t.get").contract.retry_after_not_found
    assert catalog.get("returns", "9") is None


@pytest.mark.parametrize(("changes", "field", "problem"), [
    ({"decider.kind": "magic"}, "decider", "magic"),
    ({"tools.0.kind": "grpc"}, "tools.0", "grpc"),
    ({"tools.0.input_schema": {"type": "object", "properties": {"x": {"type": "nonsense"}}}},
     "tools.0", "not a valid JSON Schema"),
    ({"version": None}, "version", "Field required"),
    ({"decider.plan.0.tool": "missing.tool"}, "decider.plan.0.tool", "unknown tool"),
    ({"tools.0.lookup_url": None}, "tools.0", "contract.lookup and lookup_url go together"),
    ({"decider.plan.1.next": "nowhere"}, "decider.plan.1.next", "unknown node"),
    ({"decider.plan.0.when": {"value": 1, "gt": 0, "lt": 2}}, "decider.plan.0.when", "exactly one of"),
    ({"budgets.max_steps": -1}, "budgets.max_steps", "greater than or equal"),
])
def test_an_invalid_definition_names_the_file_and_the_field(tmp_path, changes, field, problem):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(bad(**changes)))
    with pytest.raises(DefinitionError) as info:
        load_file(path)
    assert info.value.field.startswith(field), str(info.value)
    assert problem in info.value.problem
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_unreadable_syntax_and_duplicates(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed")
    with pytest.raises(DefinitionError, match="not valid YAML"):
        load_file(path)
    with pytest.raises(DefinitionError, match="defined twice"):
        AgentCatalog([parse_definition(GOOD), parse_definition(GOOD)])


def test_the_executor_command_stops_at_start_with_one_line(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(bad(**{"decider.plan.0.tool": "missing.tool"})))
    result = subprocess.run([sys.executable, "-m", "cli", "executor", "--agents", str(path),
                             "--scheduler", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and "decider.plan.0.tool" in lines[0] and "unknown tool" in lines[0]


def test_a_python_tool_that_cannot_be_imported_stops_the_executor_naming_file_and_field(tmp_path):
    data = {"name": "py", "version": "1", "decider": {"kind": "scripted", "plan": [{"id": "a", "finish": 1}]},
            "tools": [{"name": "ok", "kind": "python", "callable": "executor_support:noop_tool"},
                      {"name": "gone", "kind": "python", "callable": "no_such_module_here:run"}]}
    path = tmp_path / "py.yaml"
    path.write_text(yaml.safe_dump(data))
    result = subprocess.run([sys.executable, "-m", "cli", "executor", "--agents", str(path),
                             "--scheduler", "127.0.0.1:1"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": "tests", "AGENTRT_HEALTH_ADDR": ""})
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert f"{path}: tools.1.callable: cannot import: ModuleNotFoundError" in line
