"""Where the team's services listen and the certificate they present (:class:`TeamServices`, :class:`TLS`), and how a
secret is written to disk (:func:`write_private`): shared by :mod:`services.team` (secrets, Prefect, MLflow,
``up``/``down``) and :mod:`services.team_postgres` (the PostgreSQL cluster)."""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOST", "PG_USER", "TLS", "TeamServices", "write_private"]

HOST = "127.0.0.1"
PG_USER = "vgrpo"


@dataclass(frozen=True)
class TLS:
    """The certificate Prefect's, MLflow's and PostgreSQL's servers present (PEM files): ``cert`` (the chain),
    ``key`` (its private key, kept 0600), ``ca`` (what clients verify it against: the team's CA, copied to every
    machine)."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class TeamServices:
    """Where the services listen. ``host`` is the address the other machines reach this one at."""

    root: Path
    store: str
    host: str = HOST
    pg_port: int = 5432
    prefect_port: int = 4200
    mlflow_port: int = 5000
    database_url: str | None = None  # an existing PostgreSQL server (postgresql://user:password@host:port)
    tls: TLS | None = None  # Prefect's, MLflow's and (unless database_url) PostgreSQL's servers over TLS

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def database(self, name: str, driver: str, password: str) -> str:
        """The SQLAlchemy URL of one database (``driver``: asyncpg for Prefect, psycopg2 for MLflow), with its
        credentials: it goes to a server's environment only."""
        url = self.database_url or f"postgresql://{PG_USER}:{urllib.parse.quote(password, safe='')}@" + (
            f"{_url_host(self.host)}:{self.pg_port}"
        )
        scheme, rest = url.split("://", 1)
        query = ""
        if self.postgres_ca is not None and driver == "psycopg2":
            # libpq verifies the server's certificate and name; asyncpg (Prefect) gets the same through Prefect's
            # connect_args.tls settings (services.team)
            query = f"?sslmode=verify-full&sslrootcert={urllib.parse.quote(str(self.postgres_ca), safe='/')}"
        return f"{scheme}+{driver}://{rest}/{name}{query}"

    @property
    def postgres_ca(self) -> Path | None:
        """The CA the team's own PostgreSQL cluster is verified against: it takes TLS connections only when the
        team has a certificate; None for no TLS or for a server named by ``database_url``."""
        return self.tls.ca.resolve() if self.tls is not None and self.database_url is None else None

    @property
    def prefect_api_url(self) -> str:
        return f"{self.scheme}://{_url_host(self.host)}:{self.prefect_port}/api"

    @property
    def prefect_origin(self) -> str:
        """The origin of Prefect's UI, the only one its API answers cross-origin requests from."""
        return f"{self.scheme}://{_url_host(self.host)}:{self.prefect_port}"

    @property
    def mlflow_tracking_uri(self) -> str:
        return f"{self.scheme}://{_url_host(self.host)}:{self.mlflow_port}"


def _url_host(host: str) -> str:
    """``host`` as a URL names it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user alone (0600 from its creation), replacing it whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
