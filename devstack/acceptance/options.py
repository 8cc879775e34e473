"""The arguments of `agentrt acceptance` and `agentrt chaos` and the suite's defaults; imports none of the suite."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_ARTIFACTS = Path("artifacts/acceptance")
LEASE_MS = 3_000  # the suite's scheduler lease: short, so takeovers come quickly


def acceptance_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=1, help="repetitions of each experiment (default 1)")
    parser.add_argument("--only", default="", help="comma-separated experiment ids (default: 1-9)")
    parser.add_argument("--artifacts", type=Path, help=f"output directory (default {DEFAULT_ARTIFACTS}/<time>)")
    parser.add_argument("--lease-ms", type=int, default=LEASE_MS, help=f"scheduler lease (default {LEASE_MS})")
    parser.add_argument("--keep-databases", action="store_true", help="do not drop the experiments' databases")
    parser.add_argument("--partition", choices=["auto", "sigstop"], default="auto",
                        help="experiment 9: a network namespace when possible (auto), or pause the executor")
    parser.add_argument("--ha-strict", action="store_true",
                        help="experiment 10: Patroni's synchronous_mode_strict (default off; docs/ha.md)")
    parser.add_argument("--hub", default="", help=argparse.SUPPRESS)  # set by the parent for experiment 9


def chaos_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=500, help="runs to submit (default 500)")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the fault phase (default 10)")
    parser.add_argument("--executors", type=int, default=3, help="executor processes (default 3)")
    parser.add_argument("--kill-every-s", type=float, default=4.0, help="mean seconds between SIGKILLs (default 4)")
    parser.add_argument("--fault-probability", type=float, default=0.01,
                        help="probability of each armed fault point per hit (default 0.01)")
    parser.add_argument("--settle-minutes", type=float, default=5.0, help="bound on the settle phase (default 5)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--lease-ms", type=int, default=4000, help="scheduler lease (default 4000)")
    parser.add_argument("--long-share", type=float, default=0.03,
                        help="share of runs that are long (default 0.03; at least one when > 0)")
    parser.add_argument("--long-steps", type=int, default=500, help="tool steps of a long run (default 500)")
    parser.add_argument("--artifacts", type=Path, help="output directory (default artifacts/chaos/<time>)")
    ha = parser.add_argument_group("the long soak on a Patroni cluster (--ha; docs/benchmarks.md, HA soak)")
    ha.add_argument("--ha", action="store_true",
                    help="run on etcd + two PostgreSQL 15 nodes under Patroni with a failover every "
                         "--failover-every-min minutes, sampling resources and latencies every minute")
    ha.add_argument("--failover-every-min", type=int, default=15, help="minutes between failovers (default 15)")
    ha.add_argument("--rate", type=float, default=0.0,
                    help="runs submitted per second (default 0: half of what a first burst measures)")
    ha.add_argument("--calibration-runs", type=int, default=300, help="runs of the measuring burst (default 300)")
    ha.add_argument("--keep-finished-s", type=float, default=300.0,
                    help="seconds a terminal run is kept before the soak ages it for retention (default 300)")
    ha.add_argument("--maintain-every-min", type=float, default=10.0,
                    help="minutes between the soak's `agentrt maintain indexes` passes (default 10; 0: none)")
    ha.add_argument("--retention-interval-s", type=float, default=30.0,
                    help="the scheduler's run_retention_interval_s during the soak (default 30)")


def quiet() -> None:
    import logging
    import os
    import warnings

    # The suite's own topic reader retries while a broker is down on purpose (experiment 8): its
    # connection errors are expected and would bury the report; the services' logs keep theirs.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

    # The suite forks processes while its gRPC channels are open; it needs no fork handlers.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    # The embedded PostgreSQL wheel asks platformdirs for a runtime dir that containers often lack.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"platformdirs(\..*)?$")
