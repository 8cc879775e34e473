"""TLS for every gRPC hop: server credentials that follow their files on disk, and client
channels (plaintext only when chosen) for executors, the CLI and the client library.

The server reads its certificate and key again whenever either file changes
(mtime and size), so a rotated Secret or a renewed cert-manager certificate
takes effect on the next connection without a restart; a half-written pair
that does not load keeps the previous one (logged). With a client CA, mutual
TLS is required: a caller without a certificate from that CA never reaches
a handler.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerTls:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None  # set = mutual TLS, a client certificate is required


def _stamp(*paths: str | None) -> tuple[tuple[int, ...], ...]:
    stamps = []
    for path in paths:
        if path:
            info = os.stat(path)  # a copy that keeps its mtime (cp -p, rsync -t) still changes inode or ctime
            stamps.append((info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size))
    return tuple(stamps)


class _Reloading:
    """The certificate configuration, read again when a file changed (gRPC asks per handshake)."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._stamp = _stamp(tls.cert_file, tls.key_file, tls.client_ca_file)
        self.initial = self._load()
        self.reloads = 0

    def _load(self) -> Any:
        tls = self.tls
        pair = (Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())
        ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)

    def __call__(self) -> Any:
        try:
            stamp = _stamp(self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file)
            if stamp == self._stamp:
                return None  # unchanged: gRPC keeps the current configuration
            config = self._load()
        except (OSError, ValueError) as error:  # mid-rotation: keep serving the old pair
            log.warning("TLS files changed but could not be read (%s); keeping the previous certificate", error)
            return None
        self._stamp = stamp
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.tls.cert_file)
        return config


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials for `add_secure_port` that pick up a rotated certificate (module docstring)."""
    for name, path in (("tls_cert_file", tls.cert_file), ("tls_key_file", tls.key_file),
                       ("tls_client_ca_file", tls.client_ca_file)):
        if path and not Path(path).is_file():
            raise ValueError(f"{name}: no such file: {path}")
    fetcher = _Reloading(tls)
    return grpc.dynamic_ssl_server_credentials(fetcher.initial, fetcher,
                                               require_client_authentication=tls.client_ca_file is not None)


@dataclass(frozen=True)
class ClientTls:
    """How a client reaches a TLS port: the CA that signed the server's certificate, and for
    mutual TLS this client's certificate and key. `server_name` overrides the name checked
    against the server's certificate (default: the host of the address)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        for name, path in (("ca", self.ca_file), ("cert", self.cert_file), ("key", self.key_file)):
            if path and not Path(path).is_file():
                raise ValueError(f"TLS {name} file not found: {path}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a TLS client certificate needs both its cert and its key file")
        return grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca_file).read_bytes() if self.ca_file else None,
            private_key=Path(self.key_file).read_bytes() if self.key_file else None,
            certificate_chain=Path(self.cert_file).read_bytes() if self.cert_file else None)


def open_channel(addr: str, tls: ClientTls | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """A TLS channel when `tls` is given, else plaintext (the caller chose it: see `require_tls`)."""
    if tls is None:
        return grpc.aio.insecure_channel(addr, options=list(options))
    extra = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.aio.secure_channel(addr, tls.credentials(), options=[*options, *extra])


def require_tls(*, credential: bool, tls: ClientTls | None, insecure: bool, what: str) -> None:
    """Refuses to send a credential in clear unless plaintext was chosen explicitly."""
    if credential and tls is None and not insecure:
        raise ValueError(f"{what}: a credential would travel in clear; give the scheduler's CA "
                         "(TLS) or choose plaintext explicitly (insecure)")
