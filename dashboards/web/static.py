"""The static assets: plotly.js from the installed `plotly` package (nothing loads from a CDN), and
the dashboards' own script and style sheet."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, PlainTextResponse, Response

STATIC = Path(__file__).resolve().parents[1] / "static"

router = APIRouter(include_in_schema=False)


def plotly_js_path() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(plotly_js_path(), media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/static/{name}")
def static_file(name: str) -> Response:
    if name not in ("dashboards.js", "dashboards.css"):
        return PlainTextResponse("not found", status_code=404)
    media = "text/javascript" if name.endswith(".js") else "text/css"
    return FileResponse(STATIC / name, media_type=media, headers={"Cache-Control": "no-cache"})
