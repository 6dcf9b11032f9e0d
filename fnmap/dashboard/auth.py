"""The dashboard's token: who may read the page at all.

Loopback is no boundary (another user of the machine, a web page in the user's own browser), and
the page shows what jobs print, their tracebacks and where they ran; so every route, ``/metrics``
and the scripts included, answers 401 without the token (Jupyter's model).  The token lives in a
file only its owner can read (0600, in this user's 0700 runtime folder beside the shared
emulators' state), kept across restarts so a bookmark or a Prometheus ``credentials_file`` stays
good.  A request carries it one of three ways:

* ``?token=...`` in the URL ``fnmap dashboard`` prints: the page is then answered with a redirect
  to the same address without it, setting a cookie (``HttpOnly``, ``SameSite=Strict``), so the
  token leaves the address bar and the browser's history;
* that cookie, on every later request of the page;
* ``Authorization: Bearer <token>``, as Prometheus sends it from ``credentials_file``.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat

from ..errors import ConfigError

#: Name of the token file in this user's runtime folder.
TOKEN_FILE = "dashboard.token"
#: The cookie that carries the token once a page was opened with it.
COOKIE = "fnmap_dashboard"


def default_token_path() -> str:
    """``$XDG_RUNTIME_DIR/fnmap/dashboard.token`` (else under ``~/.cache/fnmap/run``)."""
    from ..emulator.shared import state_path

    return os.path.join(state_path(), TOKEN_FILE)


def load_or_create_token(path: str) -> str:
    """The token in ``path``, made (0600, its folder 0700) with a fresh random one if absent.

    ConfigError when the file can be read by others or is not the owner's: a token others can read
    guards nothing."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_token(path)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return _read_token(path)


def _read_token(path: str) -> str:
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"the dashboard token file {path} can be read or written by others (mode "
                          f"{oct(info.st_mode & 0o777)}): fix it with `chmod 600 {path}`, or delete it "
                          "for a new token")
    with open(path) as f:
        token = f.read().strip()
    if len(token) < 16:
        raise ConfigError(f"the dashboard token in {path} is {len(token)} characters: a token needs 16 "
                          "at least; delete the file for a new one")
    return token


def presented(cookies, headers, args) -> tuple[str | None, bool]:
    """``(token, from_url)``: the token a request carries (cookie, bearer header, ``?token=``)."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip(), False
    if args.get("token"):
        return args["token"], True
    return cookies.get(COOKIE), False


def matches(given: str | None, token: str) -> bool:
    """Whether ``given`` is the token (in constant time)."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())
