"""The web dashboard and the JSON API, served by `rackflow serve --http-listen` (docs/HTTP.md).

Design:
- One process, one event loop: uvicorn serves the Starlette app (`app.py`) as a worker of `RackflowServer`
  beside the gRPC server, the executor and the dispatcher (`server.py`).
- The JSON API (`api.py`) runs the very same servicer methods as gRPC (`calls.py`): a request is parsed
  into the RPC's request message and the RPC's response is returned in proto3 JSON, so validation,
  conversion, errors (one table, `rackflow.api.errors`), roles and the audit trail are gRPC's own.
- Pages (`pages/`, one module per page group, Jinja2 templates in `templates/`) read the domain services
  and render HTML; they never act. Every action a page offers is a `fetch` to the JSON API.
- Security is the gRPC listener's (`auth.py`): the same TLS certificate, bearer tokens, roles and exposure
  rule. Tokens travel in an `Authorization` header that the page's script adds, never in a cookie. Without
  tokens the listener itself is the credential, so the request guard (`security.py`) refuses what another
  site could make a browser send: a foreign `Host`, a cross-origin write, a body that is not JSON, and a
  body over the limit; it also logs every refusal.
- No build step and no CDN: `static/` holds the only stylesheet and script, served from the package.
"""
