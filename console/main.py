"""`agentrt console`: serves the console over HTTP (uvicorn) until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging

import uvicorn

from console.app import build_app
from console.config import ConsoleSettings

log = logging.getLogger("agentrt.console")


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {addr!r}: give host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def server(settings: ConsoleSettings) -> uvicorn.Server:
    """A uvicorn server for the console (not started): `await server.serve()`."""
    host, port = split_addr(settings.listen_addr)
    app = build_app(settings)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="off",
                            proxy_headers=False, server_header=False, timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


async def serve(settings: ConsoleSettings) -> None:
    srv = server(settings)
    log.info("console on http://%s for the scheduler at %s", settings.listen_addr, settings.scheduler_addr)
    await srv.serve()
