"""The web console (`lowtide console`): a small Starlette service that is a client of the
scheduler's and the signal service's public gRPC APIs, drawing its charts on the server as SVG.

- `backend`: the gRPC calls, made with the visitor's token.
- `pages`: what the pages show, from the services' answers; `charts`: the SVG.
- `app`: the routes, sessions (`sessions`), bounded inputs (`forms`) and actions.
- `server`: `serve_console(config)`, uvicorn on `[console] listen`.
"""
