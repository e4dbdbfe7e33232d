"""Listening ports of both services: one port, one process.

grpc turns SO_REUSEPORT on by default, so a second scheduler (or signal service) started on a
port that one already serves would bind it too and the kernel would split new connections
between the two, possibly on two different databases. Every lowtide gRPC server is built with
`lowtide.grpc_options.server_options` (SO_REUSEPORT off) and binds through `add_listen_port`,
which refuses a port in use with one line naming the setting, the address and what the system
said.
"""

from __future__ import annotations

import socket

import grpc

from lowtide.config import TlsConfig
from lowtide.errors import ConfigError
from lowtide.tls import add_port


def bind_failure(listen: str) -> str:
    """Why `listen` (host:port) cannot be bound, in the system's words: a plain socket tries it
    as grpc does (SO_REUSEADDR, no SO_REUSEPORT)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as error:
        return str(error.strerror or error).lower()
    except ValueError:
        return "not a host:port"
    return "grpc could not bind it"


def refused(key: str, listen: str, reason: str) -> ConfigError:
    """The one-line error for a listen address that cannot be bound; `key` is e.g.
    `[scheduler] listen`, the setting to change."""
    hint = ""
    if "in use" in reason:
        hint = "; another process (another lowtide?) serves it: stop it or choose another port"
    return ConfigError(f"{key}: cannot listen on {listen}: {reason}{hint}")


def add_listen_port(server: grpc.aio.Server, listen: str, tls: TlsConfig, key: str) -> int:
    """Binds `listen` on a server built with lowtide.grpc_options (no SO_REUSEPORT); returns the bound port (the real
    one for port 0). Raises ConfigError naming `key` when the address cannot be bound."""
    port = add_port(server, listen, tls)
    if port == 0:
        raise refused(key, listen, bind_failure(listen))
    return port
