"""Who may use ``durably serve``: bearer tokens, login sessions and CSRF tokens.

Every API call carries ``Authorization: Bearer <token>``; a browser logs in
once with the token and gets a session cookie (HttpOnly, SameSite=Strict)
instead. A session is signed with a key derived from the token it was made
with, so every server process given the same tokens accepts it, and changing
a token ends its sessions. A state-changing request made with the cookie must
also carry the session's CSRF token (a form field or the ``X-CSRF-Token``
header): SameSite already stops most cross-site requests, the CSRF token stops
the rest. The login form has no session yet: the login page sets a pre-session
cookie (SameSite=Strict, for ``/login`` only) and puts the same value in the
form, and a login post without the pair is refused (:func:`check_login_form`), so
another site cannot log a browser in under its own token (login CSRF). Every
comparison of secrets goes through :func:`hmac.compare_digest`.

Tokens come from ``DURABLY_API_TOKEN`` or a token file, one per line, each
``NAME:TOKEN`` or a bare ``TOKEN``. A named token decides as that name; with a
bare token the person types a name when logging in (API calls name themselves
with ``by``, else they are recorded as ``api``).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from durably import errors

TOKEN_ENV = "DURABLY_API_TOKEN"
COOKIE = "durably_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SESSION_SECONDS = 12 * 3600
LOGIN_COOKIE = "durably_login"
LOGIN_SECONDS = 3600  # how long a login page's form may wait to be posted
MIN_TOKEN_LENGTH = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    """One accepted secret, and the name decisions made with it are recorded under."""

    secret: str
    name: str | None = None

    @property
    def key(self) -> bytes:
        """The key sessions made with this token are signed with."""
        return hashlib.sha256(b"durably-session:" + self.secret.encode()).digest()

    @property
    def fingerprint(self) -> str:
        """A public id of the token (a session names its token by this)."""
        return hashlib.sha256(b"durably-token-id:" + self.secret.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Who made a request: the token's name, or the name given at login."""

    name: str
    via_cookie: bool
    csrf: str = ""  # the session's CSRF token (cookie requests only)


def parse_tokens(text: str, where: str) -> list[Token]:
    """Tokens from ``NAME:TOKEN`` or ``TOKEN`` lines; ``#`` starts a comment line."""
    tokens: list[Token] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, secret = line.rpartition(":")
        token = Token(secret.strip(), name.strip() or None) if sep else Token(line)
        if len(token.secret) < MIN_TOKEN_LENGTH:
            raise errors.ServerConfigError(
                f"{where} line {number}: a token must be at least {MIN_TOKEN_LENGTH} characters"
            )
        tokens.append(token)
    return tokens


def load_tokens(token_file: str | None, environ: dict[str, str] | None = None) -> list[Token]:
    """The tokens of ``token_file`` if given, else of ``DURABLY_API_TOKEN`` (maybe none)."""
    env = os.environ if environ is None else environ
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise errors.ServerConfigError(f"cannot read token file {token_file}: {exc}") from exc
        tokens = parse_tokens(text, token_file)
        if not tokens:
            raise errors.ServerConfigError(f"token file {token_file} holds no token")
        return tokens
    value = env.get(TOKEN_ENV, "")
    return parse_tokens(value, TOKEN_ENV) if value.strip() else []


def is_loopback(host: str) -> bool:
    """True when ``host`` only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Auth:
    """Checks bearer tokens, makes and checks login sessions and their CSRF tokens."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        if not tokens:
            raise errors.ServerConfigError("the server needs at least one API token")
        self.tokens = list(tokens)

    def check_token(self, presented: str) -> Token | None:
        """The token equal to ``presented``, compared in constant time; None if none is."""
        found: Token | None = None
        for token in self.tokens:
            if hmac.compare_digest(token.secret.encode(), presented.encode()):
                found = token
        return found

    def bearer(self, header: str | None) -> Token | None:
        """The token of an ``Authorization: Bearer`` header, if it is one of ours."""
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.check_token(value.strip())

    # --- sessions ---------------------------------------------------------------------

    def make_session(self, token: Token, name: str, now: float) -> str:
        """A cookie value for a person logged in with ``token`` as ``name``."""
        body = json.dumps(
            {
                "t": token.fingerprint,
                "n": name,
                "e": int(now + SESSION_SECONDS),
                "c": secrets.token_urlsafe(16),
            },
            separators=(",", ":"),
        ).encode()
        data = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return f"{data}.{_sign(token.key, data)}"

    def session(self, cookie: str | None, now: float) -> Identity | None:
        """The person a session cookie names, if it is valid and unexpired."""
        if not cookie or "." not in cookie:
            return None
        data, _, signature = cookie.rpartition(".")
        try:
            body = json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
        except (ValueError, TypeError, RecursionError):  # not a session: JSON nested too deep
            return None
        if not isinstance(body, dict):
            return None
        token = next((t for t in self.tokens if t.fingerprint == body.get("t")), None)
        # bytes: compare_digest refuses a str of non-ASCII characters (TypeError, a 500)
        if token is None or not hmac.compare_digest(
            _sign(token.key, data).encode(), signature.encode()
        ):
            return None
        if not isinstance(body.get("e"), int) or body["e"] < now:
            return None
        return Identity(str(body.get("n") or "unknown"), True, _sign(token.key, "csrf:" + data))

    def check_csrf(self, identity: Identity, presented: str | None) -> bool:
        """True when a cookie request carries its session's CSRF token."""
        return bool(presented) and hmac.compare_digest(
            identity.csrf.encode(), (presented or "").encode()
        )


def login_nonce(cookie: str | None) -> str:
    """The login form's pre-session value: the cookie's, when it is one we made (another
    tab's login form stays valid), else a new random one."""
    if cookie and _NONCE.fullmatch(cookie):
        return cookie
    return secrets.token_urlsafe(32)


def check_login_form(cookie: str | None, presented: str | None) -> bool:
    """True when a login post carries the pre-session cookie its login page set and the
    same value in its form: a post from another site has no such cookie."""
    if not cookie or not presented or not _NONCE.fullmatch(cookie):
        return False
    return hmac.compare_digest(cookie.encode(), presented.encode())


_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")  # what secrets.token_urlsafe(32) makes


def _sign(key: bytes, data: str) -> str:
    return hmac.new(key, data.encode(), hashlib.sha256).hexdigest()
