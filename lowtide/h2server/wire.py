"""gRPC's rules on top of HTTP/2, as pure functions: the 5-byte message prefix, `grpc-timeout`,
`grpc-message` escaping and metadata in headers (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md)."""

from __future__ import annotations

import base64
import gzip
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import grpc

PREFIX = struct.Struct(">?I")
MAX_RECEIVE = 4 * 1024 * 1024
# Request headers that are the transport's, not the caller's metadata.
_TRANSPORT_HEADERS = frozenset({"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {"gzip": gzip.decompress, "deflate": zlib.decompress}
ACCEPT_ENCODING = "identity,gzip,deflate"

Metadata = tuple[tuple[str, str | bytes], ...]


class WireError(Exception):
    """A request that breaks the protocol; the call ends with `code`."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(message: bytes) -> bytes:
    """A message as it goes on the wire: uncompressed flag, length, bytes."""
    return PREFIX.pack(False, len(message)) + message


class MessageReader:
    """Cuts a stream's DATA into messages, whatever the frame boundaries."""

    def __init__(self, encoding: str | None, limit: int = MAX_RECEIVE) -> None:
        self._buffer = bytearray()
        self._encoding = encoding
        self._limit = limit

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._buffer += data
        while len(self._buffer) >= PREFIX.size:
            compressed, length = PREFIX.unpack_from(self._buffer)
            if length > self._limit:
                raise WireError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({length} vs. {self._limit})",
                )
            end = PREFIX.size + length
            if len(self._buffer) < end:
                return
            message = bytes(self._buffer[PREFIX.size : end])
            del self._buffer[:end]
            yield self._decompress(message) if compressed else message

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished message are waiting (the stream must not end here)."""
        return bool(self._buffer)

    def _decompress(self, message: bytes) -> bytes:
        decompress = _DECOMPRESS.get(self._encoding or "")
        if decompress is None:
            raise WireError(
                grpc.StatusCode.UNIMPLEMENTED,
                f"a compressed message in grpc-encoding {self._encoding or 'identity'!r}; accepted: {ACCEPT_ENCODING}",
            )
        try:
            message = decompress(message)
        except (OSError, EOFError, zlib.error) as error:
            raise WireError(grpc.StatusCode.INTERNAL, f"cannot decompress the message: {error}") from None
        if len(message) > self._limit:
            raise WireError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({len(message)} vs. {self._limit})",
            )
        return message


def timeout(value: str) -> float:
    """`grpc-timeout` in seconds: up to 8 digits and a unit."""
    digits, unit = value[:-1], value[-1:]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        raise WireError(grpc.StatusCode.INTERNAL, f"malformed grpc-timeout {value!r}")
    return int(digits) * _TIMEOUT_UNITS[unit]


def escape(message: str) -> str:
    """`grpc-message` percent-encoding: UTF-8, with '%' and anything outside printable ASCII escaped."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode())


def _unpad(value: bytes) -> bytes:
    return value + b"=" * (-len(value) % 4)


def metadata(headers: Iterable[tuple[bytes, bytes]]) -> Metadata:
    """A request's metadata from its headers: `-bin` values decoded to bytes, the rest text."""
    result: list[tuple[str, str | bytes]] = []
    for raw_name, raw_value in headers:
        name = raw_name.decode("ascii", "replace")
        if name.startswith(":") or name in _TRANSPORT_HEADERS:
            continue
        if name.endswith("-bin"):
            # Several values of one key may come comma-joined.
            result += [(name, base64.b64decode(_unpad(part.strip()))) for part in raw_value.split(b",")]
        else:
            result.append((name, raw_value.decode("latin-1")))
    return tuple(result)


def metadata_headers(items: Sequence[tuple[str, str | bytes]] | None) -> list[tuple[bytes, bytes]]:
    """Metadata as headers; a `-bin` key's value travels base64."""
    headers: list[tuple[bytes, bytes]] = []
    for key, value in items or ():
        name = key.lower()
        if name.endswith("-bin"):
            data = value if isinstance(value, bytes) else value.encode()
            headers.append((name.encode(), base64.b64encode(data).rstrip(b"=")))
        else:
            text = value.decode() if isinstance(value, bytes) else value
            headers.append((name.encode(), text.encode("latin-1")))
    return headers
