"""What ``python -m services.team up`` checks before it starts anything: every setting a server would fail on
minutes later (its log tail, or a traceback) is named here by the flag or environment variable it came from, all in
one :class:`vgrpo.errors.UserError`, one line each.

* ``--tls-cert``, ``--tls-key``, ``--tls-ca``: readable files; the certificate and key a pair (a key with a
  passphrase is refused: the servers are given none); the certificate verified against the CA for the ``--host``
  name, in a TLS handshake in memory, as the clients will verify it;
* the database URL (``VGRPO_DATABASE_URL`` or ``--database-url``): ``postgresql://`` with a host and no database
  name or query (the services add their own databases); its password is never echoed (:func:`mask_url`);
* ``--pg-port`` (for the services' own PostgreSQL), ``--prefect-port``, ``--mlflow-port``: in range, distinct, and
  free on ``--host`` (a bind tried and released), an address of this machine;
* ``--root``: a folder this user can create or write, and, for the own PostgreSQL as root, one the ``postgres``
  system user reaches; PostgreSQL's programs installed; ``secrets.json`` there private and whole;
* ``--store``, when a local path: a folder this user can create or write (MLflow's server writes the artifacts).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import socket
import ssl
import stat
import urllib.parse
from pathlib import Path

from services.local import ServiceError
from services.team_config import TeamServices
from services.team_postgres import pg_bin
from vgrpo.errors import UserError

__all__ = ["DATABASE_SCHEMES", "SECRET_KEYS", "check_team_settings", "mask_url", "team_problems"]

DATABASE_SCHEMES = ("postgresql",)
"""The schemes a database URL may have: the services add their drivers to it (``postgresql+asyncpg`` for Prefect,
``postgresql+psycopg2`` for MLflow)."""
SECRET_KEYS = {"prefect_auth", "mlflow_username", "mlflow_password", "pg_password", "flask_secret"}
"""The fields of ``root/secrets.json`` (:class:`services.team.TeamSecrets`, whose test checks they agree)."""


def mask_url(url: str) -> str:
    """``url`` with any password in it replaced by ``***``: from the user's ``:`` to the last ``@``, so that a
    password holding ``@``, ``/`` or ``://`` is masked whole, in a malformed URL too (no scheme, one slash)."""
    return re.sub(r"^(?>([A-Za-z][A-Za-z0-9+.-]*://)?)([^:@]*):.*@", r"\1\2:***@", url, count=1, flags=re.DOTALL)


def check_team_settings(services: TeamServices, database_from: str = "VGRPO_DATABASE_URL") -> None:
    """Raise a :class:`UserError` listing every :func:`team_problems`, one per line; return when there are none."""
    problems = team_problems(services, database_from)
    if len(problems) == 1:
        raise UserError(f"{problems[0]} (nothing was started)")
    if problems:
        listed = "".join(f"\n  - {p}" for p in problems)
        raise UserError(f"{len(problems)} problems with the team services' settings, nothing was started:{listed}")


def team_problems(services: TeamServices, database_from: str = "VGRPO_DATABASE_URL") -> list[str]:
    """Every setting of ``services`` that would fail a server's start, each naming its flag or variable
    (``database_from``: where the database URL came from)."""
    problems = _tls_problems(services) + _port_problems(services) + _folder_problems(services)
    if services.database_url is not None:
        problems += _database_url_problems(services.database_url, database_from)
    return problems


def _readable_problem(flag: str, path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            f.read(1)
    except FileNotFoundError:
        return f"{flag} {path}: no such file"
    except IsADirectoryError:
        return f"{flag} {path}: a folder, not a PEM file"
    except OSError as exc:
        return f"{flag} {path}: cannot be read ({exc.strerror})"
    return None


def _tls_problems(services: TeamServices) -> list[str]:
    tls = services.tls
    if tls is None:
        return []
    files = {"--tls-cert": tls.cert, "--tls-key": tls.key, "--tls-ca": tls.ca}
    missing = [p for flag, path in files.items() if (p := _readable_problem(flag, path))]
    if missing:
        return missing
    asked: list[bool] = []

    def no_passphrase() -> bytes:
        asked.append(True)
        return b""

    try:  # the certificate alone first: load_cert_chain's error does not say which file it could not use
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(tls.cert))
    except ssl.SSLError:
        return [f"--tls-cert {tls.cert}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)"]
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        server.load_cert_chain(tls.cert, tls.key, password=no_passphrase)
    except ssl.SSLError as exc:
        if asked:
            return [f"--tls-key {tls.key}: protected by a passphrase, which the servers are not given (decrypt it)"]
        if exc.reason == "KEY_VALUES_MISMATCH":
            return [f"--tls-key {tls.key}: not the private key of --tls-cert {tls.cert}"]
        return [f"--tls-key {tls.key}: no PEM private key in it (-----BEGIN PRIVATE KEY-----)"]
    try:
        client = ssl.create_default_context(cafile=str(tls.ca))
    except ssl.SSLError as exc:
        return [f"--tls-ca {tls.ca}: not a PEM CA certificate ({exc.reason or exc})"]
    failed = _handshake(server, client, services.host.strip("[]"))
    if failed:
        return [f"--tls-cert {tls.cert}: the clients would refuse it ({failed}; checked against --tls-ca {tls.ca})"]
    return []


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> str | None:
    """Why a client with ``client`` (the team's CA, the host name checked) refuses the server's certificate for
    ``host``, from a handshake through memory buffers (no socket); None when it accepts it."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(to_client, to_server, server_hostname=host)
    s = server.wrap_bio(to_server, to_client, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(8):  # TLS 1.3 completes in two round trips
        for name, side in (("client", c), ("server", s)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLCertVerificationError as exc:
                return str(exc.verify_message or exc.reason).rstrip(".")
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                return str(exc.reason or exc)
        if all(done.values()):
            return None
    return "the TLS handshake did not complete"


def _port_problems(services: TeamServices) -> list[str]:
    ports = {"--prefect-port": services.prefect_port, "--mlflow-port": services.mlflow_port}
    if services.database_url is None:
        ports = {"--pg-port": services.pg_port, **ports}
    out = [f"{flag} {port}: not a port (1-65535)" for flag, port in ports.items() if not 0 < port < 65536]
    if out:
        return out
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port in seen:
            out.append(f"{flag} {port}: the same port as {seen[port]}")
        seen.setdefault(port, flag)
    for flag, port in ports.items():
        problem = _bind_problem(services.host, port)
        if problem == "host":
            return [*out, f"--host {services.host}: not an address of this machine, so no server can listen on it"]
        if problem:
            out.append(f"{flag} {port}: {problem}")
    return out


def _bind_problem(host: str, port: int) -> str | None:
    """Why a server cannot listen on ``host:port`` now (a bind tried and released at once, with SO_REUSEADDR as the
    servers set it, so that a port in TIME_WAIT counts as free): ``"host"`` when the address is not this
    machine's."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror:
        return "host"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"busy on {host} (a process listens there: stop it, `down` an earlier `up`, or pick another)"
            if exc.errno == errno.EADDRNOTAVAIL:
                return "host"
            if exc.errno == errno.EACCES:
                return "a privileged port (below 1024): pick a higher one"
            return f"cannot be listened on at {host} ({exc.strerror})"
    return None


def _folder_problems(services: TeamServices) -> list[str]:
    out = []
    made = services.root / "secrets.json"
    problem = _writable_problem(services.root) or (_secrets_problem(made) if made.exists() else None)
    if problem:
        out.append(f"--root {services.root}: {problem}")
    if "://" not in services.store and (problem := _writable_problem(Path(services.store))):
        out.append(f"--store {services.store}: {problem}")
    if services.database_url is None:
        out += _own_postgres_problems(services.root, reach=not out)
    return out


def _nearest(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable_problem(path: Path) -> str | None:
    """Why this user cannot write in the folder ``path`` (or create it)."""
    existing = _nearest(path)
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (
            f"{existing} is not writable by this user"
            if existing == path.absolute()
            else (f"cannot be created: {existing} is not writable by this user")
        )
    return None


def _secrets_problem(path: Path) -> str | None:
    """Why ``up`` would refuse the credentials file an earlier ``up`` wrote (or fail reading it)."""
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return f"{path.name} must be a file of this user that no one else can read (chmod 600 {path})"
    try:
        made = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        return f"{path.name} cannot be read as JSON ({type(exc).__name__}): move it aside to make new credentials"
    if not isinstance(made, dict) or set(made) != SECRET_KEYS or not all(isinstance(v, str) for v in made.values()):
        return f"{path.name} is not the credentials an earlier `up` wrote: move it aside to make new ones"
    return None


def _own_postgres_problems(root: Path, reach: bool) -> list[str]:
    """PostgreSQL's programs, and (as root, where it runs as the ``postgres`` user) a ``--root`` that user reaches
    (when ``reach``: a folder this user cannot make is named once)."""
    out = []
    for program in ("initdb", "pg_ctl", "psql"):
        try:
            pg_bin(program)
        except ServiceError as exc:
            out.append(f"{exc}, or name a running server in VGRPO_DATABASE_URL")
            break
    if os.geteuid() != 0 or not reach:
        return out
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        return [*out, "PostgreSQL runs as the `postgres` system user when `up` runs as root; this machine has none"]
    blocked = _unreachable(root.absolute(), user.pw_uid, os.getgrouplist(user.pw_name, user.pw_gid))
    if blocked is not None:
        out.append(
            f"--root {root}: the `postgres` system user, which runs PostgreSQL here, cannot reach it ({blocked} "
            "is closed to it): pick a folder under one open to others (chmod o+x), or run `up` as another user"
        )
    return out


def _unreachable(path: Path, uid: int, gids: list[int]) -> Path | None:
    """The first folder on the way to ``path`` that user ``uid`` (in groups ``gids``) may not enter: an existing one
    by its mode, a folder still to be made by this process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            return folder if umask & 0o001 else None
        info = folder.stat()
        search = stat.S_IXUSR if info.st_uid == uid else stat.S_IXGRP if info.st_gid in gids else stat.S_IXOTH
        if not info.st_mode & search:
            return folder
    return None


def _database_url_problems(url: str, source: str) -> list[str]:
    shown = f"{source} {mask_url(url)}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:  # its text would quote the URL's pieces, a password's among them
        why = "the port is not a number, or an IPv6 address lacks its ]"
        return [f"{shown}: not a well-formed URL ({why}; percent-encode a password's / : @ # ?)"]
    schemes = " or ".join(f"{s}://" for s in DATABASE_SCHEMES)
    example = "postgresql://user:password@host:port"
    if parts.scheme not in DATABASE_SCHEMES:
        named = f"the scheme {parts.scheme}://" if parts.scheme and "://" in url else "no scheme"
        return [f"{shown}: {named}; supported: {schemes} ({example})"]
    # Only the masked URL is quoted below: a password holding / or @ splits into the parts urlsplit returns.
    out = []
    if not parts.hostname:
        out.append(f"{shown}: no host ({example})")
    if port == 0:
        out.append(f"{shown}: port 0 is not a port")
    if parts.path:
        out.append(
            f"{shown}: a path after the server (a database name?); give the server alone ({example}): the services "
            "use its databases prefect and mlflow"
        )
    if parts.query or parts.fragment:
        out.append(f"{shown}: query parameters are not passed on (Prefect's asyncpg driver takes none of libpq's)")
    return out
