"""A gRPC server on asyncio and the `h2` HTTP/2 library, for the signal service's fan-out.

It serves grpc.aio servicers and interceptors unchanged; what differs is how messages reach the
socket: each connection writes once per event-loop turn whatever its calls sent in that turn, so
one change streamed to many subscribers costs a few writes instead of one per subscriber."""

from lowtide.h2server.server import Server

__all__ = ["Server"]
