"""``GET /ui``: the dashboard and playground, a static page shipped inside the package (no build step, no CDN).

The files (``api/static/``: HTML, CSS, plain JavaScript) are open to anyone who can reach the server, like the
package they come from; everything they show comes from ``GET /v1/status`` and the API, which need a key when keys
are on. The page asks for the key once and keeps it in the tab's ``sessionStorage`` (never in a URL). Only the
files present when the server starts are served, by their exact names; the headers forbid framing the page and
running any script not served from it.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from llamafleet.api.errors import ApiError

routes = APIRouter()

TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".js": "text/javascript; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}
HEADERS = {
    "Cache-Control": "no-cache",  # revalidated each load: an upgraded server serves its own page
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'none'",
}


def _load() -> dict[str, tuple[bytes, str]]:
    """Every file of ``static/`` by name, with its content type (read once: they are small and never change)."""
    folder = resources.files("llamafleet.api").joinpath("static")
    files = {}
    for item in folder.iterdir():
        suffix = item.name[item.name.rfind("."):]
        if item.is_file() and suffix in TYPES:
            files[item.name] = (item.read_bytes(), TYPES[suffix])
    return files


FILES = _load()


def _file(name: str) -> Response:
    if name not in FILES:
        raise ApiError(404, f"no file '{name[:80]}' in the dashboard; open /ui")
    body, media_type = FILES[name]
    return Response(body, media_type=media_type, headers=HEADERS)


@routes.get("/ui", include_in_schema=False)
async def page() -> Response:
    return _file("index.html")


@routes.get("/ui/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    return _file(name)
