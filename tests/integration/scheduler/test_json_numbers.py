"""Numbers keep their canonical text through jsonb, so hashes keep matching (issue 11).

jsonb stores numbers as numeric and writes them back as numeric_out does: no
exponent (1e16 -> 10000000000000000), no negative zero (-0.0 -> 0.0). The
canonical text (shared/canonical.py) is already in that form, so it is a
fixpoint through a jsonb column: a state_hash or request_hash taken over it at
write time still matches the value read back. Checked here against PostgreSQL
itself, and through every JSON field of the API.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import struct
from pathlib import Path

import grpc
import pytest
from support import claim, eid, lease_ref, rpc_error, scheduler_stack, tool_state

from shared.canonical import canonical_json, request_hash
from shared.gen.agentrt.v1 import common_pb2 as pb
from shared.gen.agentrt.v1 import run_service_pb2 as rs
from shared.gen.agentrt.v1 import work_service_pb2 as ws

pytestmark = pytest.mark.integration

AWKWARD = [1e16, -0.0, 1e-7, 1.5e-07, 1e300, 5e-324, 123456789012345678901234567890, 0.1, 1e22, -1e-5, 2.5e+20, 1.0]
STEP, TOOL = "pay/attempt-1", "payments.charge"


def sample_floats(count: int) -> list[float]:
    """Floats from every binade (random bit patterns) and from a decimal spread, seeded."""
    rng = random.Random(11)
    values: list[float] = []
    while len(values) < count:
        bits = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(bits):
            values.append(bits)
        values.append(round(rng.uniform(-10, 10), rng.randint(0, 17)) * 10.0 ** rng.randint(-30, 30))
    return values


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


async def test_canonical_numbers_are_what_jsonb_writes(db):
    numbers = [*AWKWARD, *sample_floats(4000)]
    canonical = [canonical_json(n) for n in numbers]
    # What jsonb makes of each number as Python writes it (json.dumps: repr) and as we write it.
    from_repr = await db.fetchval(
        "SELECT array_agg(t::jsonb::text ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS u(t, i)",
        [json.dumps(n) for n in numbers])
    from_canonical = await db.fetchval(
        "SELECT array_agg(t::jsonb::text ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS u(t, i)", canonical)
    for number, text, jsonb_of_repr, jsonb_of_canonical in zip(numbers, canonical, from_repr, from_canonical,
                                                               strict=True):
        assert text == jsonb_of_repr == jsonb_of_canonical, (number, text, jsonb_of_repr)
        assert canonical_json(json.loads(text)) == text  # and back through the codec's decoder
        assert (float(text) if isinstance(number, float) else int(text)) == number
    assert "-" not in canonical_json(-0.0) and "e" not in "".join(canonical)


async def test_numbers_survive_a_jsonb_column_inside_objects(db):
    value = {"n": AWKWARD, "deep": {"x": [1e16, {"y": -0.0}]}, "1e+16": "-0.0 stays text"}
    text = canonical_json(value)
    stored = await db.fetchval("SELECT $1::text::jsonb", text)  # decoded by the scheduler's codec (json.loads)
    assert canonical_json(stored) == text
    # jsonb's own text differs only in spacing and key order, never in how a number is written.
    assert canonical_json(json.loads(await db.fetchval("SELECT $1::text::jsonb::text", text))) == text


async def test_numbers_round_trip_through_every_json_field(db_url, db):
    value = {"n": AWKWARD, "neg": -0.0, "big": 1e16}
    request = {"amount": 1e16, "rate": 1.5e-07, "delta": -0.0, "n": AWKWARD}
    response = {"charged": 2.5e+20, "fee": 1e-05, "n": AWKWARD}
    result = {"total": 1e22, "n": AWKWARD}
    async with scheduler_stack(db_url) as stack:
        submitted = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json=json.dumps(value)),
                                               metadata=stack.md())
        got = await stack.runs.GetRun(rs.GetRunRequest(run_id=submitted.run.run_id), metadata=stack.md())
        lease = await claim(stack)
        assert lease is not None
        for text in (submitted.run.input_json, got.input_json, lease.run.input_json):
            assert text == canonical_json(value) and "e+" not in text

        # Tx0: a checkpoint recording the tool decision (its request_hash taken by the caller).
        ref = lease_ref(lease)
        state = tool_state(STEP, TOOL, request, numbers=AWKWARD)
        saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=ref, expected_version=0, state_json=json.dumps(state), schema_version=1, step_key=STEP,
            event_id=eid(), event_payload_json=json.dumps({"n": AWKWARD})))
        # Tx1: the scheduler hashes request_json itself and must find the checkpointed hash.
        begun = await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=ref, expected_version=saved.version, step_key=STEP, tool_name=TOOL, idempotency_key="k-1",
            request_json=json.dumps(request), execution_id=eid(), event_id=eid()))
        assert begun.execution.request_json == canonical_json(request)
        assert begun.execution.request_hash == request_hash(TOOL, request).hex()
        after = {"cursor": "done", "numbers": AWKWARD, "tool_results": {STEP: {"response": response}}}
        completed = await stack.work.CompleteToolCall(ws.CompleteToolCallRequest(
            lease=ref, expected_version=saved.version, step_key=STEP, outcome=ws.TOOL_OUTCOME_SUCCEEDED,
            response_json=json.dumps(response), state_json=json.dumps(after), schema_version=1, event_id=eid()))

        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=lease.run.run_id),
                                                 metadata=stack.md())
        assert [c.state_json for c in history.checkpoints] == [canonical_json(state), canonical_json(after)]
        for checkpoint in history.checkpoints:
            assert checkpoint.state_hash == sha256_hex(checkpoint.state_json)
            assert canonical_json(json.loads(checkpoint.state_json)) == checkpoint.state_json
        [execution] = history.tool_executions
        assert execution.request_json == canonical_json(request)
        assert execution.request_hash == request_hash(TOOL, json.loads(execution.request_json)).hex()
        assert execution.response_json == canonical_json(response)
        [event] = [e for e in history.events if e.event_type == "agent.checkpoint"]
        assert f'"n":{canonical_json(AWKWARD)}' in event.payload_json  # with the scheduler's own keys
        rows = await db.fetch("SELECT state_json, encode(state_hash, 'hex') AS hash FROM agent_checkpoints "
                              "WHERE run_id = $1::uuid ORDER BY version", lease.run.run_id)
        assert [r["hash"] for r in rows] == [sha256_hex(canonical_json(r["state_json"])) for r in rows]

        # The lease lapses; the next holder gets the same text, and its hash still matches.
        await db.execute("UPDATE agent_runs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                         "WHERE id = $1::uuid", lease.run.run_id)
        again = await claim(stack, worker="w2")
        assert again is not None and again.run.fencing_token == 2
        assert again.checkpoint.version == completed.version
        assert again.checkpoint.state_json == canonical_json(after)
        assert again.checkpoint.state_hash == sha256_hex(canonical_json(json.loads(again.checkpoint.state_json)))

        finished = await stack.work.FinishRun(ws.FinishRunRequest(
            lease=lease_ref(again), expected_version=completed.version, outcome=ws.FINISH_OUTCOME_COMPLETED,
            result_json=json.dumps(result), event_id=eid()))
        assert finished.status == pb.RUN_STATUS_COMPLETED
        run = await stack.runs.GetRun(rs.GetRunRequest(run_id=lease.run.run_id), metadata=stack.md())
        assert run.result_json == canonical_json(result)


async def test_a_number_written_out_past_the_payload_limit_is_refused(db_url):
    # 1e300 is 5 bytes as sent and 301 digits as stored: the limit holds for the stored text too.
    async with scheduler_stack(db_url, max_payload_bytes=1024) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.runs.SubmitRun(rs.SubmitRunRequest(
                agent_name="demo", input_json='{"n": [1e300, 1e300, 1e300, 1e300]}'), metadata=stack.md())
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "written out in full" in (refused.value.details() or "")
        accepted = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json='{"n": [1e300]}'),
                                              metadata=stack.md())
        assert accepted.run.input_json == '{"n":[1' + "0" * 300 + "]}"


def _documented_number_table() -> list[tuple[str, str]]:
    """The API reference's table of how JSON numbers come back (sent → read back), as the reader sees it."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "rpcs.md").read_text()
    block = text.split("<!-- json-numbers:begin", 1)[1].split("<!-- json-numbers:end -->", 1)[0]
    rows = []
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        sent, back = cells[0].strip("`"), cells[1]
        spelled = re.fullmatch(r"`(\d+)` followed by (\d+) zeros", back)
        rows.append((sent, spelled[1] + "0" * int(spelled[2]) if spelled else back.strip("`")))
    return rows


async def test_numbers_come_back_as_the_docs_say(db_url):
    rows = _documented_number_table()
    assert len(rows) >= 8, rows
    sent_text = "{" + ",".join(f'"k{i}":{sent}' for i, (sent, _) in enumerate(rows)) + "}"
    # Keys sort as text (k0, k1, k10, ...): build the expected object in that order.
    ordered = sorted(range(len(rows)), key=lambda i: f"k{i}")
    expected = "{" + ",".join(f'"k{i}":{rows[i][1]}' for i in ordered) + "}"
    async with scheduler_stack(db_url) as stack:
        submitted = await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json=sent_text),
                                               metadata=stack.md())
        got = await stack.runs.GetRun(rs.GetRunRequest(run_id=submitted.run.run_id), metadata=stack.md())
        assert got.input_json == expected
        lease = await claim(stack)
        assert lease is not None and lease.run.input_json == expected
        # Checkpoint state takes the same form.
        state_text = json.dumps(tool_state(STEP, TOOL, {"a": 1}, numbers=[]))[:-1] + f',"sent":{sent_text}}}'
        await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=lease_ref(lease), expected_version=0, state_json=state_text, schema_version=1, step_key=STEP,
            event_id=eid()))
        history = await stack.runs.GetRunHistory(rs.GetRunHistoryRequest(run_id=lease.run.run_id),
                                                 metadata=stack.md())
        assert f'"sent":{expected}' in history.checkpoints[-1].state_json

        for bad in ("NaN", "Infinity", "-Infinity"):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.runs.SubmitRun(rs.SubmitRunRequest(agent_name="demo", input_json=f'{{"x":{bad}}}'),
                                           metadata=stack.md())
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "input_json" in (caught.value.details() or "")


async def test_hashes_are_rfc8785_so_80_and_80_point_0_are_one_request_and_older_hashes_still_match(db_url, db):
    from shared.canonical import legacy_request_hash, sha256_of

    async with scheduler_stack(db_url) as stack:
        # A submit as Python writes it (80.0) and its retry as JSON.stringify writes it (80): one run.
        first = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json='{"amount": 80.0}', client_request_id="order-80"), metadata=stack.md())
        again = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json='{"amount":80}', client_request_id="order-80"), metadata=stack.md())
        assert again.run.run_id == first.run.run_id and first.created and not again.created
        other = await rpc_error(stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json='{"amount":80.5}', client_request_id="order-80"), metadata=stack.md()))
        assert other.code() == grpc.StatusCode.ALREADY_EXISTS

        # A submit stored by a release before RFC 8785 (its hash over canonical_json) and retried after.
        old = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json='{"amount": 9.5}', client_request_id="order-old"), metadata=stack.md())
        identity = {"agent_name": "demo", "agent_version": old.run.agent_version, "input": {"amount": 9.5},
                    "max_attempts": old.run.max_attempts, "labels": {}, "budget": [0, 0, 0.0, None]}
        await db.execute("UPDATE agent_runs SET submit_hash = $2 WHERE id = $1::uuid", old.run.run_id,
                         sha256_of(identity))
        retried = await stack.runs.SubmitRun(rs.SubmitRunRequest(
            agent_name="demo", input_json='{"amount": 9.5}', client_request_id="order-old"), metadata=stack.md())
        assert retried.run.run_id == old.run.run_id and not retried.created

        # Tx1 after an upgrade: the checkpoint records the decision with the old hash (an executor of the
        # earlier release decided it); the scheduler hashes request_json by RFC 8785 and still matches.
        lease = await claim(stack)
        assert lease is not None
        request = {"amount": 80.0, "rate": 1.5e-07}
        assert legacy_request_hash(TOOL, request) != request_hash(TOOL, request)
        state = tool_state(STEP, TOOL, request)
        state["pending_tool"]["request_hash"] = legacy_request_hash(TOOL, request).hex()
        saved = await stack.work.SaveCheckpoint(ws.SaveCheckpointRequest(
            lease=lease_ref(lease), expected_version=0, state_json=json.dumps(state), schema_version=1,
            step_key=STEP, event_id=eid()))
        wrong = await rpc_error(stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=lease_ref(lease), expected_version=saved.version, step_key=STEP, tool_name=TOOL,
            idempotency_key="k-80", request_json='{"amount": 81}', execution_id=eid(), event_id=eid())))
        assert wrong.code() == grpc.StatusCode.FAILED_PRECONDITION
        begun = await stack.work.BeginToolCall(ws.BeginToolCallRequest(
            lease=lease_ref(lease), expected_version=saved.version, step_key=STEP, tool_name=TOOL,
            idempotency_key="k-80", request_json=json.dumps(request), execution_id=eid(), event_id=eid()))
        # The ledger keeps the RFC 8785 hash, which any language recomputes from the request.
        assert begun.execution.request_hash == request_hash(TOOL, {"amount": 80, "rate": 1.5e-7}).hex()
        assert begun.execution.request_hash == hashlib.sha256(
            b'{"request":{"amount":80,"rate":1.5e-7},"tool":"payments.charge"}').hexdigest()

        # Tx2 + Tx1 in one call: the next decision recorded with the old hash is accepted as well.
        next_step, next_request = "pay2/attempt-1", {"amount": 2.0}
        after = tool_state(next_step, TOOL, next_request)
        after["pending_tool"]["request_hash"] = legacy_request_hash(TOOL, next_request).hex()
        chained = await stack.work.CompleteAndBeginToolCall(ws.CompleteAndBeginToolCallRequest(
            lease=lease_ref(lease), expected_version=saved.version, step_key=STEP,
            outcome=ws.TOOL_OUTCOME_SUCCEEDED, response_json='{"ok": true}', state_json=json.dumps(after),
            schema_version=1, event_id=eid(),
            next=ws.NextToolCall(step_key=next_step, tool_name=TOOL, idempotency_key="k-2",
                                 request_json=json.dumps(next_request), execution_id=eid(), event_id=eid())))
        assert chained.execution.request_hash == request_hash(TOOL, {"amount": 2}).hex()
