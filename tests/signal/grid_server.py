"""A real HTTP server on 127.0.0.1:0 that plays a grid-data API: each path answers what the test
put there (a status, a body, headers, an optional delay), and every request is recorded with
when it came."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Answer:
    body: Any
    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    # A body given as str is sent as is (malformed JSON); a callable is called with the request's
    # path for the body (an API whose answer depends on the times in its path); anything else is
    # JSON-encoded.


@dataclass
class Request:
    path: str
    query: str
    headers: dict[str, str]
    # time.monotonic() when the request arrived.
    at: float = 0.0


@dataclass
class GridApi:
    url: str = ""
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def on(self, path: str, *answers: Answer) -> None:
        """Answers for a path, in turn; the last one repeats. A path ending in `*` is a prefix,
        for paths that carry the current time."""
        self.answers[path] = list(answers)

    def take(self, path: str) -> Answer:
        queue = self.answers.get(path)
        if queue is None:
            prefixes = [p for p in self.answers if p.endswith("*") and path.startswith(p[:-1])]
            queue = self.answers[max(prefixes, key=len)] if prefixes else None
        if not queue:
            return Answer({"error": f"no answer for {path}"}, status=404)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def to(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]


def _handler(api: GridApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            headers = {k.lower(): v for k, v in self.headers.items()}
            api.requests.append(Request(parts.path, parts.query, headers, time.monotonic()))
            answer = api.take(parts.path)
            if answer.delay:
                time.sleep(answer.delay)
            given = answer.body(parts.path) if callable(answer.body) else answer.body
            body = given if isinstance(given, str) else json.dumps(given)
            data = body.encode()
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up (a timeout test); nothing to answer.
                pass

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def grid_api() -> Iterator[GridApi]:
    api = GridApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    server.block_on_close = False
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll interval: shutdown() waits for the next poll, once per test.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), name="grid-api", daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
