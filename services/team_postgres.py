"""The team's PostgreSQL cluster, as ``python -m services.team up`` runs it: created on the first start with
password auth (scram-sha-256) over TCP and peer auth on a 0700 socket folder, over TLS only when the team has a
certificate (``hostssl``), run as the ``postgres`` system user when started as root."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from services.local import ServiceError
from services.team_config import PG_USER, TeamServices, write_private
from tasks.process_group import log_tail

__all__ = ["DATABASES", "pg_bin", "start_postgres", "stop_postgres"]

DATABASES = ("prefect", "mlflow")


def _as_postgres(cmd: Sequence[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run ``cmd`` as the ``postgres`` system user."""
    if os.geteuid() != 0:
        return list(cmd)
    return ["runuser", "-u", "postgres", "--", *cmd]


def pg_bin(name: str) -> str:
    """A PostgreSQL program: on PATH, or in the distribution's versioned folder (Debian keeps initdb off PATH)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for folder in versions:
        if (folder / name).is_file():
            return str(folder / name)
    raise ServiceError(f"PostgreSQL's {name} is not installed (Debian: apt install postgresql)")


def _hba_line(host: str) -> str | None:
    """The ``pg_hba.conf`` line that lets this machine's servers reach PostgreSQL at ``host`` with a password
    (initdb's own lines cover loopback): the address itself, or ``samehost`` for a name (its connection type is set
    by :func:`_hba_with_tls`)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"host all {PG_USER} samehost scram-sha-256"
    if address.is_loopback:
        return None
    return f"host all {PG_USER} {address}/{address.max_prefixlen} scram-sha-256"


def _hba_with_tls(text: str, tls: bool) -> str:
    """``pg_hba.conf`` with every TCP rule (``host``/``hostssl``) of type ``hostssl`` when ``tls``: a client that
    does not encrypt finds no rule and is refused; else ``host``. Comments and socket rules are kept as they are."""
    lines = []
    for line in text.splitlines():
        fields = line.split(None, 1)
        if len(fields) == 2 and fields[0] in ("host", "hostssl"):
            line = ("hostssl " if tls else "host ") + fields[1]
        lines.append(line)
    return "\n".join(lines) + "\n"


def _postgres_tls(services: TeamServices) -> tuple[list[str], dict[str, str]]:
    """PostgreSQL's TLS options (``-c`` settings for ``pg_ctl -o``) and its clients' libpq environment: the
    certificate and key copied into the cluster's 0700 folder, the key 0600 and owned by the server's user, as
    PostgreSQL requires; none without :class:`TLS`."""
    ca = services.postgres_ca
    if services.tls is None or ca is None:
        return [], {}
    folder = services.root / "postgres"
    cert, key = folder / "server.crt", folder / "server.key"
    shutil.copyfile(services.tls.cert, cert)
    write_private(key, services.tls.key.read_text())
    if os.geteuid() == 0:
        for path in (cert, key):
            shutil.chown(path, "postgres", "postgres")
    options = ["ssl=on", f"ssl_cert_file={cert}", f"ssl_key_file={key}", "ssl_min_protocol_version=TLSv1.2"]
    env = {"PGSSLMODE": "verify-full", "PGSSLROOTCERT": str(ca)}
    return [f"-c {o}" for o in options], env


def _init_postgres(data: Path, password: str) -> None:
    """``initdb`` with password auth (scram-sha-256) over TCP and peer auth on the socket, a ``vgrpo`` superuser
    whose password comes from a 0600 file (never the command line), removed after."""
    pwfile = data.parent / "pwfile"
    write_private(pwfile, password + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres", "postgres")
    try:
        subprocess.run(
            _as_postgres(
                [
                    pg_bin("initdb"),
                    "-D",
                    str(data),
                    "-U",
                    PG_USER,
                    "--auth-local=peer",
                    "--auth-host=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            capture_output=True,
        )
    finally:
        pwfile.unlink(missing_ok=True)


def start_postgres(services: TeamServices, password: str) -> None:
    """Create the cluster under ``root/postgres`` on the first start (:func:`_init_postgres`; a ``pg_hba`` line
    for ``host`` when it is not loopback), its socket in that 0700 folder; start it on ``pg_port`` and create the
    databases it lacks. A cluster an earlier ``up`` created with trust auth is refused, naming what to do."""
    data, log = services.root / "postgres" / "data", services.root / "postgres" / "server.log"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.parent.chmod(0o700)  # the socket's folder: no other local user reaches the socket
    if os.geteuid() == 0:
        shutil.chown(data.parent, "postgres", "postgres")
    hba = data / "pg_hba.conf"
    if not (data / "PG_VERSION").is_file():
        _init_postgres(data, password)
        line = _hba_line(services.host)
        if line is not None:
            with hba.open("a") as f:
                f.write(line + "\n")
    rules = [r.split() for r in hba.read_text().splitlines() if r.strip() and not r.lstrip().startswith("#")]
    if any("trust" in rule for rule in rules):
        raise ServiceError(
            f"{hba} trusts connections (a cluster an earlier `up` created): any local user would be its superuser. "
            f"Move {data} aside (or give the vgrpo role a password and replace trust by scram-sha-256 there)"
        )
    tls_options, tls_env = _postgres_tls(services)
    rules_text = hba.read_text()
    wanted = _hba_with_tls(rules_text, services.tls is not None)
    if wanted != rules_text:  # rewritten only when TLS was turned on or off since the last start
        hba.write_text(wanted)
    options = " ".join([f"-h {services.host} -p {services.pg_port} -k {data.parent}", *tls_options])
    result = subprocess.run(
        _as_postgres([pg_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"]),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ServiceError(f"PostgreSQL did not start on port {services.pg_port}: {result.stderr}\n{log_tail(log)}")
    psql = [pg_bin("psql"), "-h", services.host, "-p", str(services.pg_port), "-U", PG_USER, "-d", "postgres", "-w"]
    env = {**os.environ, "PGPASSWORD": password, **tls_env}  # an environment only this user (and root) can read
    existing = subprocess.run(
        [*psql, "-tAc", "SELECT datname FROM pg_database"], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    for name in DATABASES:
        if name not in existing:
            subprocess.run([*psql, "-c", f"CREATE DATABASE {name}"], check=True, capture_output=True, env=env)


def stop_postgres(root: Path) -> None:
    data = root / "postgres" / "data"
    if (data / "postmaster.pid").is_file():
        subprocess.run(_as_postgres([pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), capture_output=True)
