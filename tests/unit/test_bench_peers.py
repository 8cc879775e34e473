"""The peer bench's bookkeeping (bench._peer_measure, bench.bench_peers): process trees and their CPU,
a peer's result, and the figures against agentrt. The peers themselves run only in `python -m bench peers`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from bench._peer_measure import CpuBook, process_tree, result
from bench.bench_peers import figures_of

SPIN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)\n"


def test_a_process_tree_holds_the_children_and_their_cpu_is_counted() -> None:
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        book = CpuBook()
        book.begin({"tree": [os.getpid()]})  # the child is not yet known: it counts from zero
        deadline = time.monotonic() + 20
        while True:
            spent = book.spent({"tree": process_tree(os.getpid())})["tree"]
            if spent >= 0.25 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert child.pid in process_tree(os.getpid())
        assert os.getpid() in process_tree(os.getpid())
        assert spent >= 0.25  # the child's busy 0.3 s of CPU, read from /proc
    finally:
        child.kill()
        child.wait()
    assert child.pid not in process_tree(os.getpid())


def test_a_result_is_the_median_round_and_cpu_per_step_leaves_the_client_out_of_the_total() -> None:
    found = result([100.0, 300.0, 200.0], 2000, {"server": 1.0, "service": 3.0, "client": 0.5}, fsyncs=500,
                   fsync_scope="test", outside_total=("client",))
    assert found["steps_per_s"] == 200.0
    assert found["cpu_ms_per_step"] == {"server": 0.5, "service": 1.5, "client": 0.25, "total": 2.0}
    assert found["fsyncs_per_step"] == 0.25
    assert len(found["loadavg"]) == 3


def test_figures_compare_each_peer_with_agentrt_and_name_what_was_not_measured() -> None:
    measured: dict[str, dict[str, Any] | str] = {
        "agentrt": {"steps_per_s": 400.0},
        "dbos": {"steps_per_s": 100.0},
        "restate_intent_then_tool": {"steps_per_s": 500.0},
        "restate_one_call_per_step": "Restate: not measured: npm is not installed",
    }
    figures, met = figures_of(measured)
    by_name = {f["figure"]: f for f in figures}
    assert by_name["agentrt_steps_per_s"]["value"] == 400.0
    dbos = by_name["dbos_steps_per_s"]
    assert (dbos["baseline"], dbos["ratio"], dbos["agentrt_over_peer"], dbos["goal_met"]) == (400.0, 0.25, 4.0, True)
    restate = by_name["restate_intent_then_tool_steps_per_s"]
    assert (restate["agentrt_over_peer"], restate["goal_met"]) == (0.8, False)
    missing = by_name["restate_one_call_per_step_steps_per_s"]
    assert missing["value"] is None and missing["not_measured"].startswith("Restate: not measured")
    assert met is False  # one goal missed; the peer that could not run fails nothing
    assert figures_of({"agentrt": {"steps_per_s": 400.0}, "dbos": {"steps_per_s": 99.0}})[1] is True
