"""A scheduler call whose answer is lost is sent again with the same event id, never a new one."""

import grpc
import pytest
from executor_support import (
    executor,
    history,
    http_tool,
    mock_tool,
    scripted_agent,
    tap_writes,
    wait_for,
    wait_status,
    write_agent,
)
from support import scheduler_stack, submit

from shared.gen.agentrt.v1 import common_pb2 as pb

pytestmark = pytest.mark.integration
def _retries_reached(client, n):
    async def probe():
        return client.retries >= n
    return probe


# Step one: SaveCheckpoint + BeginToolCall; one → two: CompleteAndBeginToolCall; two: CompleteToolCall,
# which carries the run's end.
METHODS = ("SaveCheckpoint", "BeginToolCall", "CompleteAndBeginToolCall", "CompleteToolCall")


@pytest.mark.parametrize("batch_writes", [True, False], ids=["batched", "single-calls"])
async def test_lost_answers_are_retried_with_the_same_event_id_and_replayed(db_url, db, tmp_path, batch_writes):
    plan = [{"id": "one", "tool": "t.one", "args": {}}, {"id": "two", "tool": "t.two", "args": {}},
            {"id": "done", "finish": "ok"}]
    async with mock_tool(tmp_path) as mock, scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", scripted_agent("flaky-net", plan, [http_tool(mock.url, "t.one"),
                                                                            http_tool(mock.url, "t.two")]))
        run = await submit(stack, agent="flaky-net")
        requests: dict[str, list] = {}
        async with executor(stack, tmp_path / "agents", batch_writes=batch_writes) as worker:
            # Each first write of these kinds reaches the scheduler and commits; its answer is lost
            # (as if the deadline passed).
            tap_writes(worker.services.client, requests, METHODS,
                       lose=lambda name, n: grpc.StatusCode.DEADLINE_EXCEEDED if n == 1 else None)
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                      pb.RUN_STATUS_PAUSED_INDOUBT)
            # The run's last write commits before its lost answer is retried: wait for the retry.
            client = worker.services.client
            await wait_for(_retries_reached(client, 4), within=30, what="4 retries")
            assert client.retries == 4
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        seen = {name: [r.event_id for r in sent] for name, sent in requests.items()}
        for name in METHODS:
            assert seen[name][0] == seen[name][1], name  # the retry reused the event id
        hist = await history(stack, run.run_id)
        assert [e.status for e in hist.tool_executions] == [pb.TOOL_EXECUTION_STATUS_SUCCEEDED] * 2
        assert len({e.event_id for e in hist.events}) == len(hist.events)  # no write happened twice
        assert [c.version for c in hist.checkpoints] == list(range(1, len(hist.checkpoints) + 1))
        # Tx1's answer was lost, yet its intent was ours and unsent: it was sent exactly once.
        assert sorted(mock.calls_by_key().values()) == [1, 1]
        assert requests["CompleteToolCall"][0].end.event_id == requests["CompleteToolCall"][1].end.event_id


@pytest.mark.parametrize("batch_writes", [True, False], ids=["batched", "single-calls"])
async def test_a_lost_finish_answer_is_retried_with_the_same_event_id(db_url, db, tmp_path, batch_writes):
    async with scheduler_stack(db_url) as stack:
        write_agent(tmp_path / "agents", scripted_agent("just-finish", [{"id": "done", "finish": {"n": 1}}], []))
        run = await submit(stack, agent="just-finish")
        requests: dict[str, list] = {}
        async with executor(stack, tmp_path / "agents", batch_writes=batch_writes) as worker:
            tap_writes(worker.services.client, requests, ("SaveCheckpoint", "FinishRun"),
                       lose=lambda name, n: grpc.StatusCode.UNAVAILABLE if n == 1 else None)
            final = await wait_status(stack, run.run_id, pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_FAILED,
                                      pb.RUN_STATUS_PAUSED_INDOUBT)
            # The run's last write commits before its lost answer is retried: wait for the retry.
            client = worker.services.client
            await wait_for(_retries_reached(client, 2), within=30, what="2 retries")
            assert client.retries == 2
        assert final.status == pb.RUN_STATUS_COMPLETED, final.terminal_reason or final.pause_reason
        for name in ("SaveCheckpoint", "FinishRun"):
            first, second = requests[name]
            assert first.event_id == second.event_id, name
        hist = await history(stack, run.run_id)
        assert len({e.event_id for e in hist.events}) == len(hist.events)
        assert [e.event_type for e in hist.events].count("agent.run_completed") == 1
