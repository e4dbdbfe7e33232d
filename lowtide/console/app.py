"""The console's web application: Starlette routes rendering Jinja2 templates, each page a
client of the services' gRPC APIs with the visitor's token.

- With auth on, a visitor gives a token once (`/login`); the scheduler is asked with it at once,
  so a bad token gets a clear page there and then. The console then acts with that token's role:
  what the role may not do is refused by the service, and the page shows the service's message.
- Actions are POSTs carrying the session's CSRF token, each confirmed on a page of its own first.
- Errors never show a traceback: bad input is a 400 page naming the field, a service's refusal
  its gRPC code and message, an unreachable service a 503 page saying which.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from lowtide.console import forms, pages, regions
from lowtide.console.backend import Backend
from lowtide.console.sessions import Session, Sessions, csrf_ok, same_origin

log = logging.getLogger("lowtide.console")
HERE = Path(__file__).parent
# The security headers of every page: no framing, no sniffing, scripts and styles from here only.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
ACTIONS = ("pause", "resume", "cancel", "retry", "signal")


class Console:
    """The application's state: the backend, the sessions, the templates."""

    def __init__(self, backend: Backend, *, auth: bool, refresh_ms: int = 3000, secure_cookie: bool = False) -> None:
        self.backend = backend
        self.auth = auth
        self.refresh_ms = refresh_ms
        self.sessions = Sessions(secure_cookie=secure_cookie)
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(), auto_reload=False
        )
        self.templates.globals.update(when=pages.when, state_name=pages.state_name, states=list(forms.STATES))

    def session(self, request: Request) -> tuple[Session, bool]:
        """The visitor's session, and whether it is new (its cookie still to be set)."""
        session = self.sessions.get(request)
        if session is not None:
            return session, False
        return self.sessions.new(), True

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        session, new = self.session(request)
        html = self.templates.get_template(name).render(
            request=request,
            csrf=session.csrf,
            auth=self.auth,
            signed_in=session.token is not None,
            refresh_ms=self.refresh_ms,
            path=request.url.path,
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=HEADERS)
        if new:
            self.sessions.set_cookie(response, session)
        return response

    def problem(self, request: Request, status: int, title: str, message: str) -> HTMLResponse:
        name = "problem_live.html" if request.url.path.startswith("/live/") else "problem.html"
        return self.render(request, name, status, title=title, message=message)


Handler = Callable[[Console, Request, str | None], Awaitable[Response]]


def _page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A page: its visitor's token found (or the login page when auth is on and there is none),
    and the errors of the call turned into pages."""

    async def endpoint(request: Request) -> Response:
        console: Console = request.app.state.console
        session, _ = console.session(request)
        if console.auth and session.token is None:
            if request.url.path.startswith("/live/"):
                return Response(status_code=401)
            return RedirectResponse("/login", status_code=303)
        try:
            return await handler(console, request, session.token)
        except forms.BadInput as error:
            return console.problem(request, 400, "That input is not accepted", str(error))
        except grpc.aio.AioRpcError as error:
            return _rpc_problem(console, request, error)

    return endpoint


def _rpc_problem(console: Console, request: Request, error: grpc.aio.AioRpcError) -> Response:
    code, details = error.code(), error.details() or ""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return console.problem(
            request,
            503,
            "A service cannot be reached",
            f"{code.name}: {details} (scheduler {console.backend.scheduler_target}, "
            f"signal {console.backend.signal_target})",
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return console.render(request, "login.html", 401, message=f"The service did not accept the token: {details}")
    status = {grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404}.get(code, 400)
    return console.problem(request, status, "The service refused", f"{code.name}: {details}")


async def overview(console: Console, request: Request, token: str | None) -> Response:
    view = await console.backend.overview(token)
    return console.render(request, "overview.html", **_overview_context(view))


async def overview_live(console: Console, request: Request, token: str | None) -> Response:
    view = await console.backend.overview(token)
    return console.render(request, "overview_live.html", **_overview_context(view))


def _overview_context(view: Any) -> dict[str, Any]:
    places = regions.of_overview(view)
    return {
        "view": view,
        "regions": places,
        "region_lines": {
            r.pool: (regions.signal_line(r), regions.workers_line(r), regions.releases_line(r)) for r in places
        },
        "region_listed": {r.pool: regions.listed(r) for r in places},
        # A signal a region draws is not drawn again among the other signals.
        "region_signals": {r.signal for r in places if r.svg},
        "story": pages.story(view),
        "signal_svg": pages.signal_svg(view),
        "forecast_note": pages.forecast_note(view),
        "other_signal_svgs": pages.other_signal_svgs(view),
        "queue_svgs": pages.queue_svgs(view),
        "carbon": pages.carbon(view.status),
        "releases": sorted(pages.releases(pages.on_default_signal(view)), key=lambda r: r.at)[:20],
        "when_seconds": pages.when_seconds,
    }


async def pools(console: Console, request: Request, token: str | None) -> Response:
    return console.render(request, "pools.html", **await _pools_context(console, token))


async def pools_live(console: Console, request: Request, token: str | None) -> Response:
    return console.render(request, "pools_live.html", **await _pools_context(console, token))


async def _pools_context(console: Console, token: str | None) -> dict[str, Any]:
    status = await console.backend.status(token)
    pending = await console.backend.pending(token)
    from lowtide.console import charts

    return {
        "pools": [(p, charts.slots_bar(p.busy_slots, p.held_slots, p.slots)) for p in status.pools],
        "adaptive": [(a, charts.slots_bar(min(a.running, a.limit), 0, a.limit)) for a in status.adaptive_limits],
        "timeline": charts.timeline(pages.reservation_bars(pending), time.time()),
    }


async def tasks(console: Console, request: Request, token: str | None) -> Response:
    query = request.query_params
    filters = {
        "queue": forms.text(query, "queue"),
        "state": forms.text(query, "state", limit=20),
        "type": forms.text(query, "type"),
    }
    page = forms.text(query, "page", limit=forms.MAX_PAGE_TOKEN)
    listed = await console.backend.list_tasks(
        token,
        queue=filters["queue"],
        state=forms.state(query),
        activity_type=filters["type"],
        page_size=50,
        page_token=page,
    )
    return console.render(request, "tasks.html", tasks=listed.tasks, next_page=listed.next_page_token, filters=filters)


async def task(console: Console, request: Request, token: str | None) -> Response:
    return console.render(request, "task.html", **await _task_context(console, request, token))


async def task_live(console: Console, request: Request, token: str | None) -> Response:
    return console.render(request, "task_live.html", **await _task_context(console, request, token))


async def _task_context(console: Console, request: Request, token: str | None) -> dict[str, Any]:
    task_id = forms.task_id(request.path_params["task_id"])
    story = await console.backend.task(token, task_id)
    return {"story": story, "t": story.task, "plan_svg": pages.task_svg(story, time.time())}


async def _form(request: Request) -> dict[str, str]:
    length = request.headers.get("content-length", "")
    if not length.isdigit() or int(length) > forms.MAX_BODY:
        raise forms.BadInput(f"the form: at most {forms.MAX_BODY} bytes, with a Content-Length")
    async with request.form(max_files=0, max_fields=20, max_part_size=forms.MAX_BODY) as form:
        return {k: v for k, v in form.items() if isinstance(v, str)}


async def action(request: Request) -> Response:
    """pause / resume a queue, cancel or retry a task, set the signal: confirmed first, then done with the
    visitor's token; a refusal shows the service's own message."""
    console: Console = request.app.state.console
    name = request.path_params["name"]
    session = console.sessions.get(request)
    if name not in ACTIONS:
        return console.problem(request, 404, "No such action", f"{name[:40]!r}: the actions are {', '.join(ACTIONS)}")
    try:
        values = await _form(request)
    except forms.BadInput as error:
        return console.problem(request, 400, "That input is not accepted", str(error))
    if not same_origin(request) or not csrf_ok(session, values.get("csrf", "")):
        return console.problem(
            request, 403, "Not sent from this console", "The form's CSRF token is missing or stale: reload the page."
        )
    assert session is not None
    if console.auth and session.token is None:
        return RedirectResponse("/login", status_code=303)
    try:
        what, run = _action(console, name, values, session.token)
        if values.get("confirm") != "yes":
            fields = {k: v for k, v in values.items() if k not in ("csrf", "confirm")}
            return console.render(request, "confirm.html", action=name, what=what, fields=fields)
        done = await run()
    except forms.BadInput as error:
        return console.problem(request, 400, "That input is not accepted", str(error))
    except grpc.aio.AioRpcError as error:
        return _rpc_problem(console, request, error)
    log.info("console.action", extra={"action": name})
    return console.render(request, "done.html", message=done)


def _action(
    console: Console, name: str, values: dict[str, str], token: str | None
) -> tuple[str, Callable[[], Awaitable[str]]]:
    """What the action will do (for its confirmation) and the call that does it."""
    backend = console.backend
    if name in ("pause", "resume"):
        queue = forms.text(values, "queue", required=True)

        async def queue_action() -> str:
            state = await (backend.pause(token, queue) if name == "pause" else backend.resume(token, queue))
            return f"Queue {state.name} is {'paused' if state.paused else 'running'}."

        return f"{name.capitalize()} queue {queue!r}", queue_action
    if name in ("cancel", "retry"):
        task_id = forms.task_id(values.get("task", ""), "task")
        # The attempt the page showed: a retry sent again (the page reloaded) changes nothing.
        seen = forms.attempt(values)

        async def task_action() -> str:
            if name == "cancel":
                task = await backend.cancel(token, task_id)
            else:
                task = await backend.retry(token, task_id, seen)
            return f"Task {task.id} is {pages.state_name(task.state)}."

        return (f"Cancel task {task_id}" if name == "cancel" else f"Run task {task_id} again"), task_action
    signal = forms.text(values, "signal")
    value = forms.signal_value(values)

    async def set_signal() -> str:
        state = await backend.set_signal(token, signal, value)
        return f"Signal {state.name} is {state.value:g} {state.unit} ({'high' if state.high else 'low'})."

    return f"Set signal {signal or '(default)'} to {value:g}", set_signal


async def login(request: Request) -> Response:
    console: Console = request.app.state.console
    if request.method == "GET":
        return console.render(request, "login.html")
    try:
        values = await _form(request)
        token = forms.text(values, "token", limit=forms.MAX_TOKEN, required=True)
    except forms.BadInput as error:
        return console.render(request, "login.html", 400, message=str(error))
    session = console.sessions.get(request)
    if not same_origin(request) or not csrf_ok(session, values.get("csrf", "")):
        return console.render(request, "login.html", 403, message="The form was stale: give the token again.")
    try:
        await console.backend.status(token)
    except grpc.aio.AioRpcError as error:
        if error.code() != grpc.StatusCode.PERMISSION_DENIED:  # a valid token whose role reads less
            return _rpc_problem(console, request, error)
    assert session is not None
    console.sessions.drop(session)
    response = RedirectResponse("/", status_code=303)
    console.sessions.set_cookie(response, console.sessions.new(token))
    return response


async def logout(request: Request) -> Response:
    console: Console = request.app.state.console
    session = console.sessions.get(request)
    values = await _form(request) if request.headers.get("content-length", "0") != "0" else {}
    if session is not None and csrf_ok(session, values.get("csrf", "")):
        console.sessions.drop(session)
    return RedirectResponse("/login" if console.auth else "/", status_code=303)


async def _not_found(request: Request, exc: Exception) -> Response:
    console: Console = request.app.state.console
    code = exc.status_code if isinstance(exc, HTTPException) else 500
    return console.problem(request, code, "Not here", f"{request.url.path[:100]} is not a page of this console.")


async def _failed(request: Request, exc: Exception) -> Response:
    log.exception("console.failed", extra={"path": request.url.path[:200]})
    return HTMLResponse("<h1>The console failed</h1><p>Its log says why.</p>", status_code=500, headers=HEADERS)


def build_app(console: Console) -> Starlette:
    routes = [
        Route("/", _page(overview)),
        Route("/live/overview", _page(overview_live)),
        Route("/pools", _page(pools)),
        Route("/live/pools", _page(pools_live)),
        Route("/tasks", _page(tasks)),
        Route("/tasks/{task_id}", _page(task)),
        Route("/live/tasks/{task_id}", _page(task_live)),
        Route("/actions/{name}", action, methods=["POST"]),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found, Exception: _failed})
    app.state.console = console
    return app
