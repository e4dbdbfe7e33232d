"""The console's visitors: a random session id in a cookie (HttpOnly, SameSite=Strict), the
visitor's token and CSRF secret kept here, in memory, never in the cookie. Every form carries
the session's CSRF token; a POST without it, or from another origin, is refused."""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "lowtide_console"
# Sessions kept at most: the oldest is forgotten first (its visitor is asked for the token again).
MAX_SESSIONS = 1000
# A session id is 32 random bytes, URL-safe: anything else in the cookie is ignored.
_ID_LENGTH = 43


@dataclass
class Session:
    id: str
    csrf: str
    token: str | None = None


class Sessions:
    def __init__(self, *, secure_cookie: bool = False) -> None:
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._secure = secure_cookie

    def get(self, request: Request) -> Session | None:
        sid = request.cookies.get(COOKIE, "")
        if len(sid) != _ID_LENGTH:
            return None
        session = self._sessions.get(sid)
        if session is not None:
            self._sessions.move_to_end(sid)
        return session

    def new(self, token: str | None = None) -> Session:
        session = Session(id=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32), token=token)
        self._sessions[session.id] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def drop(self, session: Session) -> None:
        self._sessions.pop(session.id, None)

    def set_cookie(self, response: Response, session: Session) -> None:
        response.set_cookie(
            COOKIE, session.id, httponly=True, samesite="strict", secure=self._secure, path="/", max_age=7 * 86400
        )


def csrf_ok(session: Session | None, given: str) -> bool:
    return session is not None and hmac.compare_digest(session.csrf.encode(), given.encode())


def same_origin(request: Request) -> bool:
    """A POST must come from a page of this console: its Origin (sent by every current browser
    on a POST), when present, names this host."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host
