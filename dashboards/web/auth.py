"""Who is asking, and signing in and out: the viewer of a request (a bearer token, else the session
cookie), the refusals that send others away (sign in, 403, another customer's data: 404), the CSRF
check of every form, and the sign-in and sign-out pages.

    GET  /signin, POST /signin                customer sign-in with an API key
    GET  /admin/signin, POST /admin/signin    admin sign-in with INFERMETER_ADMIN_TOKEN
    POST /signout
"""

from __future__ import annotations

import hmac
import time
import urllib.parse
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from dashboards.sessions import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    Session,
    new_nonce,
    new_session_id,
    read_session,
)
from dashboards.web.cookies import secure, session_store, set_cookie, signer
from dashboards.web.responses import error_json, forbidden, render
from infermeter.auth import AuthError, Principal, bearer_token

MAX_FORM_BYTES = 1_000_000

router = APIRouter(include_in_schema=False)


# --- who is asking -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    principal: Principal
    session: Session | None

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin

    @property
    def customer_id(self) -> str | None:
        return self.principal.customer_id


class SignInNeeded(Exception):
    def __init__(self, reason: str, admin: bool):
        self.reason, self.admin = reason, admin


async def authenticate(request: Request, *, admin: bool) -> Viewer:
    """Who is asking: a bearer token (data endpoints), else the session cookie. SignInNeeded when
    neither holds a live sign-in; a customer on an admin page gets Viewer and the caller answers 403."""
    keys = request.app.state.keys
    settings = request.app.state.settings
    if request.headers.get("authorization"):
        try:
            return Viewer(await keys.authenticate(bearer_token(request.headers["authorization"])), None)
        except AuthError as exc:
            raise SignInNeeded(str(exc) or "invalid credentials", admin) from None
    state, session = read_session(signer(request), request.cookies.get(SESSION_COOKIE))
    if state == "none":
        raise SignInNeeded("", admin)
    if state == "invalid":
        raise SignInNeeded("Your session is not valid any more; sign in again.", admin)
    if state == "expired":
        raise SignInNeeded("Your session expired; sign in again.", admin or session.kind == "admin")
    # the session's record (shared by every process): ended by signing out, in any of them
    if not await session_store(request).is_live(session.session_id):
        raise SignInNeeded("You signed out of this session; sign in again.", admin or session.kind == "admin")
    if session.kind == "admin":
        if not hmac.compare_digest(session.admin_fingerprint or "", signer(request).admin_fingerprint(settings.admin_token)):
            raise SignInNeeded("The admin token changed; sign in again.", True)
        return Viewer(Principal(kind="admin"), session)
    # the session's key, from the key store's verified-key cache as a bearer call's (revocation: the same)
    principal = await keys.session_principal(session.key_id) if session.key_id else None
    if principal is None or principal.customer_id != session.customer_id:
        raise SignInNeeded("The API key of this session has been revoked; sign in with a valid key.", admin)
    return Viewer(principal, session)


def sign_in_response(request: Request, exc: SignInNeeded, data: bool) -> Response:
    if data:
        return error_json(401, exc.reason or "sign in first", "unauthenticated")
    target = "/admin/signin" if exc.admin else "/signin"
    query = {"next": request.url.path + (f"?{request.url.query}" if request.url.query else "")}
    if exc.reason:
        query["reason"] = exc.reason
    return RedirectResponse(f"{target}?{urllib.parse.urlencode(query)}", status_code=303)


async def admin_viewer(request: Request, *, data: bool) -> Viewer | Response:
    """The signed-in admin, or the response that sends anyone else away (to sign in, or 403)."""
    try:
        viewer = await authenticate(request, admin=True)
    except SignInNeeded as exc:
        return sign_in_response(request, exc, data=data)
    return viewer if viewer.is_admin else forbidden(request, viewer, data)


def customer_scope(viewer: Viewer, requested: str | None) -> bool:
    """False when a customer asks for another customer's data (answered 404, existence not disclosed)."""
    return viewer.is_admin or requested in (None, viewer.customer_id)


# --- forms -----------------------------------------------------------------------------------------


async def form(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (the only kind the pages post)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in parsed.items()}


def csrf_refused(request: Request, fields: dict[str, str]) -> Response | None:
    if signer(request).csrf_ok(request.cookies.get(CSRF_COOKIE), fields.get(CSRF_FIELD)):
        return None
    return render(request, "message.html", 403, title="Form refused",
                  message="This form's CSRF token is missing or does not match this browser. "
                  "Reload the page and submit the form again.")


def _safe_next(target: str | None, default: str) -> str:
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return default


# --- sign-in and sign-out ------------------------------------------------------------------------


@router.get("/signin")
def signin_page(request: Request, next: str | None = None, reason: str | None = None,
                signed_out: int = 0) -> Response:
    return render(request, "signin.html", admin=False, error=None, next=_safe_next(next, "/dashboard"),
                  reason=reason, signed_out=bool(signed_out))


@router.get("/admin/signin")
def admin_signin_page(request: Request, next: str | None = None, reason: str | None = None,
                      signed_out: int = 0) -> Response:
    return render(request, "signin.html", admin=True, error=None, next=_safe_next(next, "/admin/ops"),
                  reason=reason, signed_out=bool(signed_out))


async def _start_session(request: Request, session: Session, target: str) -> Response:
    await run_in_threadpool(session_store(request).start, session)
    response = RedirectResponse(target, status_code=303)
    ttl = request.app.state.settings.session_ttl_s
    set_cookie(response, request, SESSION_COOKIE, signer(request).sign(session.to_payload()), ttl)
    set_cookie(response, request, CSRF_COOKIE, new_nonce(), None)  # a new CSRF nonce with every sign-in
    return response


@router.post("/signin")
async def signin(request: Request) -> Response:
    fields = await form(request)
    if (refused := csrf_refused(request, fields)) is not None:
        return refused
    target = _safe_next(fields.get("next"), "/dashboard")
    token = fields.get("api_key", "").strip()
    error = None
    principal = None
    if not token:
        error = "Enter your API key."
    else:
        try:
            principal = await request.app.state.keys.authenticate(token)
        except AuthError as exc:
            error = f"Sign-in failed: {exc or 'invalid API key'}. Check the key (`infermeter keys create` makes one)."
    if principal is not None and principal.kind == "admin":
        error, principal = "That is the admin token: sign in on the admin sign-in page (/admin/signin).", None
    elif principal is not None and principal.kind != "customer":
        error, principal = "Producer tokens cannot sign in to the dashboards.", None
    if principal is None:
        return render(request, "signin.html", 401, admin=False, error=error, next=target, reason=None,
                      signed_out=False)
    ttl = request.app.state.settings.session_ttl_s
    session = Session("customer", time.time() + ttl, principal.customer_id, principal.api_key_id,
                      session_id=new_session_id())
    return await _start_session(request, session, target if target.startswith("/dashboard") else "/dashboard")


@router.post("/admin/signin")
async def admin_signin(request: Request) -> Response:
    fields = await form(request)
    if (refused := csrf_refused(request, fields)) is not None:
        return refused
    target = _safe_next(fields.get("next"), "/admin/ops")
    token = fields.get("admin_token", "").strip()
    settings = request.app.state.settings
    if not token or not hmac.compare_digest(token.encode(), settings.admin_token.encode()):
        return render(request, "signin.html", 401, admin=True, next=target, reason=None, signed_out=False,
                      error="Sign-in failed: that is not the admin token (INFERMETER_ADMIN_TOKEN).")
    session = Session("admin", time.time() + settings.session_ttl_s,
                      admin_fingerprint=signer(request).admin_fingerprint(settings.admin_token),
                      session_id=new_session_id())
    return await _start_session(request, session, target)


@router.post("/signout")
async def signout(request: Request) -> Response:
    fields = await form(request)
    if (refused := csrf_refused(request, fields)) is not None:
        return refused
    _, session = read_session(signer(request), request.cookies.get(SESSION_COOKIE))
    if session is not None and session.session_id:  # ended for every process, not only this browser
        await run_in_threadpool(session_store(request).end, session.session_id)
    target = "/admin/signin?signed_out=1" if session and session.kind == "admin" else "/signin?signed_out=1"
    response = RedirectResponse(target, status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=secure(request))
    set_cookie(response, request, CSRF_COOKIE, new_nonce(), None)
    return response
