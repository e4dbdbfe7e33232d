"""`lowtide console`: the web console served by uvicorn on `[console] listen` (127.0.0.1:8080).

It binds its socket itself, so a port in use is a one-line ConfigError naming the setting (and
`lowtide up` does not restart it in vain); with auth off it listens on loopback only, as the
services do. TLS to the services comes from LOWTIDE_CA, LOWTIDE_CERT and LOWTIDE_KEY, as for the
CLI; the token of each call is the visitor's own."""

from __future__ import annotations

import logging
import os
import socket

import uvicorn

from lowtide.auth import check_listen
from lowtide.config import Config
from lowtide.console.app import Console, build_app
from lowtide.console.backend import Backend
from lowtide.errors import ConfigError
from lowtide.listen import refused
from lowtide_proto.channel import Security

log = logging.getLogger("lowtide.console")


def _bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as error:
        raise refused("[console] listen", listen, str(error.strerror or error).lower()) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve_console(config: Config) -> None:
    settings = config.console
    if not settings.listen:
        raise ConfigError("[console] listen is empty (no console): give it a host:port, e.g. 127.0.0.1:8080")
    check_listen(config.auth, settings.listen, "console")
    ca, cert, key = (os.environ.get(name) or None for name in ("LOWTIDE_CA", "LOWTIDE_CERT", "LOWTIDE_KEY"))
    backend = Backend(settings.scheduler_target, settings.signal_target, Security(ca=ca, cert=cert, key=key))
    console = Console(
        backend,
        auth=config.auth.enabled,
        refresh_ms=int(settings.refresh.total_seconds() * 1000),
        secure_cookie=False,
    )
    sock = _bind(settings.listen)
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(console),
            log_config=None,
            access_log=False,
            # Bounds on what one visitor can make the console hold.
            limit_concurrency=200,
            h11_max_incomplete_event_size=16 * 1024,
            timeout_keep_alive=5,
            timeout_graceful_shutdown=3,
            server_header=False,
        )
    )
    log.info(
        "console.serving",
        extra={
            "url": f"http://{host}:{port}",
            "scheduler": settings.scheduler_target,
            "signal": settings.signal_target,
        },
    )
    try:
        await server.serve(sockets=[sock])
    finally:
        await backend.close()
