"""The credentials of one INFERMETER_HOME when none are configured: the admin token, the producer
token and the session secret, generated once into INFERMETER_HOME/credentials.json (mode 0600) and
shared by every process on that home; and which addresses count as loopback, the only ones a
process with development credentials serves on (`Settings.check_listen_address`)."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
from pathlib import Path

CREDENTIALS_FILE = "credentials.json"
CREDENTIAL_NAMES = ("admin_token", "producer_token", "session_secret")
# The defaults of earlier versions: whoever sets them explicitly is still using development credentials.
WELL_KNOWN_DEV_TOKENS = frozenset({"dev-admin-token", "dev-producer-token"})


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_or_create_credentials(path: Path) -> dict[str, str]:
    """The generated credentials of one INFERMETER_HOME: read them, or create the file (mode 0600,
    random tokens) on first use. Every process on the same home reads the same tokens; concurrent
    first starts agree because the file is created with O_EXCL semantics (link of a finished file)."""
    for _ in range(3):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            data = None
        if isinstance(data, dict) and all(isinstance(data.get(n), str) and data[n] for n in CREDENTIAL_NAMES):
            return {n: data[n] for n in CREDENTIAL_NAMES}
        fresh = {n: (data or {}).get(n) or secrets.token_urlsafe(32) for n in CREDENTIAL_NAMES}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(fresh, fh, indent=2)
            fh.write("\n")
        try:
            if data is None:
                os.link(tmp, path)  # fails if another process created it first: then read theirs
            else:
                os.replace(tmp, path)  # an incomplete file from an older version: complete it
            return fresh
        except FileExistsError:
            continue
        finally:
            tmp.unlink(missing_ok=True)
    raise RuntimeError(f"cannot read or create {path}")
