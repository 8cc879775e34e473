"""Sends the fenced writes a stale holder could send, and prints what the scheduler answered (JSON).

    python -m devstack.acceptance.probe --scheduler HOST:PORT --run ID --worker W --fence N --version V [--step-key K]

Experiment 9 runs it inside the partitioned executor's network namespace, so
the writes travel the path that was cut.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from devstack.acceptance.api import Api


async def probe(args: argparse.Namespace) -> dict[str, str]:
    api = Api(args.scheduler)
    try:
        return await api.stale_write(args.run, args.worker, args.fence, args.version, args.step_key)
    finally:
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.acceptance.probe")
    parser.add_argument("--scheduler", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--fence", type=int, required=True)
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--step-key", default="")
    answers = asyncio.run(probe(parser.parse_args()))
    print(json.dumps(answers, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
