"""TLS for both services, from `[tls]`: cert and key make a service listen with TLS; client_ca
makes it demand a client certificate signed by that CA (mutual TLS)."""

from __future__ import annotations

from pathlib import Path

import grpc

from lowtide.config import TlsConfig
from lowtide.errors import ConfigError


def _read(key: str, path: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as error:
        raise ConfigError(f"[tls] {key}: cannot read {path}: {error.strerror}") from None


def server_credentials(config: TlsConfig) -> grpc.ServerCredentials | None:
    """The credentials to listen with, or None for plaintext."""
    if not config.cert and not config.key:
        if config.client_ca:
            raise ConfigError("[tls] client_ca: needs cert and key too (mutual TLS is TLS first)")
        return None
    if not (config.cert and config.key):
        raise ConfigError("[tls]: cert and key go together; set both or neither")
    pair = [(_read("key", config.key), _read("cert", config.cert))]
    if config.client_ca:
        return grpc.ssl_server_credentials(
            pair, root_certificates=_read("client_ca", config.client_ca), require_client_auth=True
        )
    return grpc.ssl_server_credentials(pair)


def add_port(server: grpc.aio.Server, listen: str, config: TlsConfig) -> int:
    """Binds `listen`, with TLS when configured; 0 when the address cannot be bound."""
    credentials = server_credentials(config)
    try:
        if credentials is None:
            return int(server.add_insecure_port(listen))
        return int(server.add_secure_port(listen, credentials))
    except RuntimeError:
        return 0
