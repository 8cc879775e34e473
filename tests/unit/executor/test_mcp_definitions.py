"""`kind: mcp` tool entries: parsed, checked field by field, and mapped onto the ledger's contracts."""

import pytest
from mcp.types import CallToolResult, TextContent

from executor.agents import DefinitionError, McpServerTools, McpTool, parse_definition
from executor.errors import ErrorClass, classify
from executor.tools.mcp import McpToolAdapter, _contract

BASE = {"name": "shop", "version": "1", "decider": {"kind": "scripted", "plan": [{"id": "x", "tool": "create_order"}]}}


def entry(**fields):
    return {"kind": "mcp", "server": {"url": "http://127.0.0.1:9/mcp"}, **fields}


def test_mcp_entries_leave_tools_and_defer_the_plans_tool_names_until_listed():
    agent = parse_definition({**BASE, "tools": [entry(prefix="shop.")]})
    assert agent.tools == [] and agent.mcp_servers[0].prefix == "shop."
    with pytest.raises(DefinitionError, match=r"decider\.plan\.0\.tool: unknown tool 'create_order'"):
        agent.check_plan_tools()
    with pytest.raises(DefinitionError, match=r"decider\.plan\.0\.tool: unknown tool"):
        parse_definition(BASE)  # without an MCP server the name is checked at once


@pytest.mark.parametrize(("fields", "where"), [
    ({"server": {"url": "http://x/mcp", "command": ["srv"]}}, "tools.mcp.0.server: an MCP server needs exactly one"),
    ({"server": {}}, "tools.mcp.0.server: an MCP server needs exactly one"),
    ({"server": {"url": "ftp://x"}}, "tools.mcp.0.server.url"),
    ({"server": {"command": []}}, "tools.mcp.0.server.command"),
    ({"tools": {"t": {"lookup_tool": "no spaces"}}}, "tools.mcp.0.tools.t.lookup_tool"),
    ({"timeout_s": 0}, "tools.mcp.0.timeout_s"),
    ({"surprise": 1}, "tools.mcp.0.surprise"),
])
def test_a_bad_mcp_entry_names_its_field(fields, where):
    with pytest.raises(DefinitionError) as caught:
        parse_definition({**BASE, "tools": [entry(**fields)]})
    assert where in str(caught.value)


@pytest.mark.parametrize(("annotations", "override", "idempotent"), [
    ({"readOnlyHint": True}, {}, True),
    ({"idempotentHint": True}, {}, True),
    ({"destructiveHint": True}, {}, False),
    ({}, {}, False),
    ({"readOnlyHint": True}, {"idempotent": False}, False),  # the agent's word wins
    ({}, {"idempotent": True}, True),
])
def test_annotations_and_overrides_give_the_contract(annotations, override, idempotent):
    server = McpServerTools.model_validate(entry(tools={"t": override}))
    contract, _ = _contract(server, "t", annotations)
    assert contract.idempotent is idempotent and not contract.lookup and not contract.fenced


def test_a_lookup_tool_and_a_fence_make_not_found_a_proof():
    server = McpServerTools.model_validate(entry(tools={"t": {"lookup_tool": "find", "fenced": True}}))
    contract, override = _contract(server, "t", {})
    assert contract.lookup and contract.fenced and contract.retry_after_not_found and override.lookup_tool == "find"


def adapter(idempotent=False):
    server = McpServerTools.model_validate(entry()).server
    contract = {"idempotent": idempotent}
    return McpToolAdapter(McpTool(kind="mcp", name="t", server=server, remote_name="t", contract=contract))


def text(value):
    return [TextContent(type="text", text=value)]


def test_results_map_onto_the_error_table():
    ok = adapter()._classify(CallToolResult(content=text("{}"), structured_content={"id": 7, "x": 1}))
    assert ok.ok and ok.response == {"id": 7, "x": 1} and ok.remote_resource_id == "7"
    plain = adapter()._classify(CallToolResult(content=text("hello")))
    assert plain.ok and plain.response == {"content": [{"type": "text", "text": "hello"}]}
    failed = adapter()._classify(CallToolResult(content=text("out of stock"), is_error=True))
    assert (failed.error_code, failed.detail) == ("tool_error", "out of stock")
    assert classify("tool_error") is ErrorClass.DEFINITE_NO_EFFECT
    for named, code in (("stale_fence", "stale_fence"), ("retry_later", "tool_busy"),
                        ("unknown_outcome", "server_error"), ("something else", "tool_error")):
        result = CallToolResult(content=text("no"), is_error=True, _meta={"agentrt/error": named})
        assert adapter()._classify(result).error_code == code
    # An idempotent tool's unknown outcome is retried, not frozen.
    result = CallToolResult(content=text("?"), is_error=True, _meta={"agentrt/error": "unknown_outcome"})
    assert adapter(idempotent=True)._classify(result).error_code == "retried_unknown"
    assert classify("retried_unknown") is ErrorClass.RETRYABLE_TRANSIENT


def test_the_json_rpc_codes_read_are_the_sdks_own():
    import mcp_types

    from executor.tools import mcp as adapter_module

    assert adapter_module._CONNECTION_CLOSED == mcp_types.CONNECTION_CLOSED
    assert adapter_module._REQUEST_TIMEOUT == mcp_types.REQUEST_TIMEOUT
    assert adapter_module._NOT_RUN == {mcp_types.PARSE_ERROR, mcp_types.INVALID_REQUEST, mcp_types.METHOD_NOT_FOUND,
                                       mcp_types.INVALID_PARAMS}
