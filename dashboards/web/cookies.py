"""The dashboards' cookies: the session signer (HMAC under the app's session secret, built once per
app), the record of live sessions (dashboards.sessions.SessionStore on the app's pool, built once per
app), setting a cookie (HttpOnly, SameSite=Lax, Secure when the request came over https) and the
browser's CSRF nonce."""

from __future__ import annotations

from fastapi import Request, Response

from dashboards.sessions import CSRF_COOKIE, SessionStore, Signer, new_nonce


def signer(request: Request) -> Signer:
    state = request.app.state
    found = getattr(state, "dashboards_signer", None)
    if found is None:
        found = state.dashboards_signer = Signer(state.settings.session_secret)
    return found


def session_store(request: Request) -> SessionStore:
    """The app's record of live sessions (its cache lives as long as the app)."""
    state = request.app.state
    found = getattr(state, "dashboards_sessions", None)
    if found is None:
        found = state.dashboards_sessions = SessionStore(state.pool, cache_ttl_s=state.settings.session_cache_ttl_s)
    return found


def secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="lax", secure=secure(request))


def csrf_nonce(request: Request) -> tuple[str, bool]:
    """The browser's CSRF nonce, or a new one (True: set it in the response)."""
    nonce = request.cookies.get(CSRF_COOKIE)
    if nonce and 16 <= len(nonce) <= 64:
        return nonce, False
    return new_nonce(), True
