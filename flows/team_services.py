"""The services a team shares across machines: PostgreSQL, Prefect's server and MLflow's tracking server on it, and
the store every machine reaches (docs/cluster.md). One machine runs them; every other machine sources the
environment file they write and the secrets file (copied to it over a channel only the team reads).

    python -m flows.team_services up --root runs/team --store s3://vgrpo/team   # start them (detached)
    python -m flows.team_services down --root runs/team                          # stop them
    . runs/team/team.env; . runs/team/secrets.env                                 # on every machine

``up`` generates the team's credentials on its first start (``root/secrets.json``, 0600; what a client needs in
``root/secrets.env``, 0600) and starts, each in its own process group with its pid in ``root``: PostgreSQL on
``--pg-port`` (a cluster under ``root/postgres``, created on the first start with password (scram-sha-256) auth
over TCP and peer auth on a 0700 socket folder; ``--database-url`` or ``VGRPO_DATABASE_URL`` uses an existing server
instead), then ``prefect server start`` with its auth string, CSRF protection and CORS limited to its own origin,
then ``mlflow server --app-name basic-auth`` with its backend store on its database and its artifacts under the
store (served by the tracking server, so clients need no store credentials for them); with ``--tls-cert`` and
``--tls-key`` both servers answer over https only and PostgreSQL over TLS only (``hostssl``; its clients verify
it against the CA, ``verify-full``) (:class:`TLS`). Every secret reaches a
server through its environment or a 0600 file, never its command line. Prefect's result storage (the cached
tasks' pickled results and cache records) stays on each machine: a stage done on another machine comes from the
store as JSON and safetensors (:mod:`tasks.store`). The one-machine default stays what it was: sqlite files, no
servers, no credentials.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from flows.services import QUIET_ENV, ServiceError, wait_healthy
from tasks.process_group import log_tail, stop_recorded_group, write_pid_file

__all__ = ["TLS", "TeamSecrets", "TeamServices", "client_secrets", "team_down", "team_env", "team_secrets", "team_up"]

HOST = "127.0.0.1"
PG_USER = "vgrpo"
DATABASES = ("prefect", "mlflow")
START_TIMEOUT_S = 180.0
_QUIET = {**QUIET_ENV, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


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
    tls: TLS | None = None  # Prefect's and MLflow's servers over https with this certificate

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
        if self.database_url is None and self.tls is not None and driver == "psycopg2":
            # libpq verifies the server's certificate and name; asyncpg (Prefect) gets the same through Prefect's
            # connect_args.tls settings (_server_envs)
            ca = urllib.parse.quote(str(self.tls.ca.resolve()), safe="/")
            query = f"?sslmode=verify-full&sslrootcert={ca}"
        return f"{scheme}+{driver}://{rest}/{name}{query}"

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


@dataclass(frozen=True)
class TeamSecrets:
    """The team's credentials, generated by the first ``up`` (:func:`team_secrets`).

    Attributes:
        prefect_auth: Prefect's API auth string (``user:password``): the server's
            ``PREFECT_SERVER_API_AUTH_STRING``, every client's ``PREFECT_API_AUTH_STRING``.
        mlflow_username, mlflow_password: MLflow's basic-auth admin, every client's ``MLFLOW_TRACKING_USERNAME`` /
            ``MLFLOW_TRACKING_PASSWORD``.
        pg_password: the ``vgrpo`` PostgreSQL role's; only the servers on this machine use it.
        flask_secret: the key MLflow's basic-auth app signs its CSRF tokens with.
    """

    prefect_auth: str
    mlflow_username: str
    mlflow_password: str
    pg_password: str
    flask_secret: str


SECRETS_FILE = "secrets.json"
CLIENT_SECRETS_FILE = "secrets.env"


def _token() -> str:
    return secrets.token_urlsafe(32)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user alone (0600 from its creation), replacing it whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def team_secrets(root: Path) -> TeamSecrets:
    """The credentials in ``root/secrets.json``, generated there on the first call (0600). A team that set
    ``PREFECT_SERVER_API_AUTH_STRING`` before its first ``up`` keeps that auth string. A secrets file others can
    read is refused."""
    path = root / SECRETS_FILE
    if path.exists():
        info = path.lstat()
        if not path.is_file() or path.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ServiceError(f"{path}: must be a file of this user that no one else can read (chmod 600 {path})")
        return TeamSecrets(**json.loads(path.read_text()))
    made = TeamSecrets(
        prefect_auth=os.environ.get("PREFECT_SERVER_API_AUTH_STRING") or f"vgrpo:{_token()}",
        mlflow_username="admin",
        mlflow_password=_token(),
        pg_password=_token(),
        flask_secret=_token(),
    )
    _write_private(path, json.dumps(asdict(made), indent=2) + "\n")
    return made


def client_secrets(made: TeamSecrets) -> dict[str, str]:
    """What a client on any machine exports besides :func:`team_env` (``root/secrets.env``): Prefect's auth string
    and MLflow's credentials. Never the database's password."""
    return {
        "PREFECT_API_AUTH_STRING": made.prefect_auth,
        "MLFLOW_TRACKING_USERNAME": made.mlflow_username,
        "MLFLOW_TRACKING_PASSWORD": made.mlflow_password,
    }


def team_env(services: TeamServices) -> dict[str, str]:
    """What a client on any machine exports: the servers' addresses and the store. Prefect's result storage is
    left to each machine (``$PREFECT_HOME/storage``): its records are pickles, which run code when read, so they
    never go where other hosts write; what crosses machines goes through the store as JSON and safetensors
    (:mod:`tasks.store`)."""
    env = {
        **_QUIET,
        "PREFECT_API_URL": services.prefect_api_url,
        "MLFLOW_TRACKING_URI": services.mlflow_tracking_uri,
        "VGRPO_STORE": services.store,
        "HF_HUB_OFFLINE": "1",
    }
    if services.tls is not None:  # the clients verify the servers against the team's CA
        ca = str(services.tls.ca.resolve())
        env |= {"PREFECT_API_SSL_CERT_FILE": ca, "MLFLOW_TRACKING_SERVER_CERT_PATH": ca}
    return env


def _as_postgres(cmd: Sequence[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run ``cmd`` as the ``postgres`` system user."""
    if os.geteuid() != 0:
        return list(cmd)
    return ["runuser", "-u", "postgres", "--", *cmd]


def _pg_bin(name: str) -> str:
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
    if services.tls is None:
        return [], {}
    folder = services.root / "postgres"
    cert, key = folder / "server.crt", folder / "server.key"
    shutil.copyfile(services.tls.cert, cert)
    _write_private(key, services.tls.key.read_text())
    if os.geteuid() == 0:
        for path in (cert, key):
            shutil.chown(path, "postgres", "postgres")
    options = ["ssl=on", f"ssl_cert_file={cert}", f"ssl_key_file={key}", "ssl_min_protocol_version=TLSv1.2"]
    env = {"PGSSLMODE": "verify-full", "PGSSLROOTCERT": str(services.tls.ca.resolve())}
    return [f"-c {o}" for o in options], env


def _init_postgres(data: Path, password: str) -> None:
    """``initdb`` with password auth (scram-sha-256) over TCP and peer auth on the socket, a ``vgrpo`` superuser
    whose password comes from a 0600 file (never the command line), removed after."""
    pwfile = data.parent / "pwfile"
    _write_private(pwfile, password + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres", "postgres")
    try:
        subprocess.run(
            _as_postgres(
                [
                    _pg_bin("initdb"),
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
    hba.write_text(_hba_with_tls(hba.read_text(), services.tls is not None))
    options = " ".join([f"-h {services.host} -p {services.pg_port} -k {data.parent}", *tls_options])
    result = subprocess.run(
        _as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"]),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ServiceError(f"PostgreSQL did not start on port {services.pg_port}: {result.stderr}\n{log_tail(log)}")
    psql = [_pg_bin("psql"), "-h", services.host, "-p", str(services.pg_port), "-U", PG_USER, "-d", "postgres", "-w"]
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
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), capture_output=True)


def _spawn(name: str, cmd: Sequence[str], env: dict[str, str], root: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` detached in its own process group, its pid in ``root/<name>.pid``, its log ``root/<name>.log``
    (0600)."""
    log = root / f"{name}.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            env=env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    write_pid_file(root / f"{name}.pid", proc.pid)
    return proc


MLFLOW_AUTH_INI = """[mlflow]
default_permission = READ
database_uri = sqlite:///{db}
admin_username = {admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
grant_default_workspace_access = false
"""
"""MLflow's basic-auth config: its user database under ``root``; the admin's password comes from the server's
environment (``MLFLOW_AUTH_ADMIN_PASSWORD``), used when the user database is created."""


def _server_envs(services: TeamServices, made: TeamSecrets, root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The environments of Prefect's and MLflow's servers: every credential they need, and only there."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PG"))} | _QUIET
    prefect = base | {
        "PREFECT_HOME": str(root / "prefect"),
        "PREFECT_API_DATABASE_CONNECTION_URL": services.database("prefect", "asyncpg", made.pg_password),
        "PREFECT_SERVER_API_AUTH_STRING": made.prefect_auth,
        "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
        "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS": services.prefect_origin,
    }
    if services.tls is not None:
        prefect |= {"PREFECT__SERVER_FINAL": "1", "PREFECT_UI_API_URL": services.prefect_api_url}
    if services.tls is not None and services.database_url is None:  # asyncpg to PostgreSQL over verified TLS
        prefect |= {
            "PREFECT_SERVER_DATABASE_SQLALCHEMY_CONNECT_ARGS_TLS_ENABLED": "true",
            "PREFECT_SERVER_DATABASE_SQLALCHEMY_CONNECT_ARGS_TLS_CA_FILE": str(services.tls.ca.resolve()),
        }
    auth = root / "mlflow-auth"
    auth.mkdir(mode=0o700, exist_ok=True)
    ini = auth / "basic_auth.ini"
    _write_private(ini, MLFLOW_AUTH_INI.format(db=auth / "users.db", admin=made.mlflow_username))
    mlflow = base | {
        "MLFLOW_BACKEND_STORE_URI": services.database("mlflow", "psycopg2", made.pg_password),
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_PASSWORD": made.mlflow_password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": made.flask_secret,
    }
    if services.tls is not None:
        cert, key = services.tls.cert.resolve(), services.tls.key.resolve()
        mlflow["MLFLOW_UVICORN_OPTS"] = f"--ssl-certfile {shlex.quote(str(cert))} --ssl-keyfile {shlex.quote(str(key))}"
    return prefect, mlflow


def _prefect_command(services: TeamServices) -> list[str]:
    """``prefect server start``; with TLS, the uvicorn command Prefect's own ``--background`` runs (its app factory,
    ``PREFECT__SERVER_FINAL`` in the environment) with the certificate added, which ``prefect server start`` does not
    take."""
    address = ["--host", services.host, "--port", str(services.prefect_port)]
    if services.tls is None:
        return [sys.executable, "-m", "prefect", "server", "start", *address]
    import prefect

    tls = ["--ssl-certfile", str(services.tls.cert.resolve()), "--ssl-keyfile", str(services.tls.key.resolve())]
    app = ["--app-dir", str(prefect.__module_path__.parent), "--factory", "prefect.server.api.server:create_app"]
    return [sys.executable, "-m", "uvicorn", *app, *address, *tls, "--workers", "1"]


def team_up(services: TeamServices, timeout: float = START_TIMEOUT_S) -> dict[str, str]:
    """Start PostgreSQL (unless ``database_url``), Prefect's server and MLflow's tracking server, each with the
    team's credentials (:func:`team_secrets`); write ``root/team.env`` (addresses) and ``root/secrets.env`` (0600:
    :func:`client_secrets`); return the client environment, secrets included. On a failure, stop what started."""
    root = services.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    made = team_secrets(root)
    prefect_env, mlflow_env = _server_envs(services, made, root)
    try:
        if services.database_url is None:
            start_postgres(services, made.pg_password)
        prefect = _spawn("prefect", _prefect_command(services), prefect_env, root)
        mlflow = _spawn(
            "mlflow",
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--app-name",
                "basic-auth",
                "--host",
                services.host,
                "--port",
                str(services.mlflow_port),
                "--artifacts-destination",
                services.store.rstrip("/") + "/mlflow-artifacts",
                "--workers",
                "1",
            ],
            mlflow_env,
            root,
        )
        ca = services.tls.ca if services.tls is not None else None
        prefect_health = services.prefect_api_url + "/health"
        wait_healthy("Prefect's server", prefect_health, prefect, root / "prefect.log", timeout, ca)
        mlflow_health = services.mlflow_tracking_uri + "/health"
        wait_healthy("MLflow's server", mlflow_health, mlflow, root / "mlflow.log", timeout, ca)
    except BaseException:
        team_down(root)
        raise
    env = team_env(services)
    (root / "team.env").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    client = client_secrets(made)
    _write_private(root / CLIENT_SECRETS_FILE, "".join(f"export {k}={shlex.quote(v)}\n" for k, v in client.items()))
    return env | client


def team_down(root: Path, timeout: float = 15.0) -> None:
    """Stop the servers' process groups (SIGTERM, then SIGKILL after ``timeout``), each only when its pid file still
    names the process ``up`` started (:func:`tasks.process_group.stop_recorded_group`), and PostgreSQL."""
    root = root.resolve()
    for name in ("mlflow", "prefect"):
        pid_file = root / f"{name}.pid"
        if pid_file.is_file() and not stop_recorded_group(pid_file, timeout):
            print(f"{name}: its recorded process is gone (its pid now names another process, left alone)")
    stop_postgres(root)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--root", type=Path, default=Path("runs/team"), help="the services' data, logs and pids")
    parser.add_argument("--store", default=None, help="the shared store: a path every machine mounts, or s3://...")
    parser.add_argument("--host", default=HOST, help="the address the other machines reach this one at")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--prefect-port", type=int, default=4200)
    parser.add_argument("--mlflow-port", type=int, default=5000)
    parser.add_argument(
        "--database-url",
        default=None,
        help="an existing PostgreSQL without its password (postgresql://user@host:port); the password-bearing URL "
        "goes in VGRPO_DATABASE_URL instead, never on a command line",
    )
    parser.add_argument("--tls-cert", type=Path, default=None, help="Prefect's and MLflow's certificate (PEM chain)")
    parser.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM, 0600)")
    parser.add_argument("--tls-ca", type=Path, default=None, help="the CA clients verify it against (default: cert)")
    args = parser.parse_args(argv)
    if args.action == "down":
        team_down(args.root)
        return
    if not args.store:
        parser.error("up needs --store (a shared path or an s3:// URL)")
    if args.database_url and urllib.parse.urlsplit(args.database_url).password:
        parser.error("--database-url carries a password, which every local user sees in ps: set VGRPO_DATABASE_URL")
    database_url = os.environ.get("VGRPO_DATABASE_URL") or args.database_url
    store = args.store if "://" in args.store else str(Path(args.store).resolve())
    ports = (args.pg_port, args.prefect_port, args.mlflow_port)
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            parser.error("--tls-cert and --tls-key go together")
        tls = TLS(args.tls_cert, args.tls_key, args.tls_ca or args.tls_cert)
    services = TeamServices(args.root, store, args.host, *ports, database_url, tls)
    team_up(services)
    root = args.root.resolve()
    print(f"services up; on every machine: . {root / 'team.env'}; . {root / CLIENT_SECRETS_FILE}")
    print(f"  ({CLIENT_SECRETS_FILE} holds the team's credentials: copy it only over a channel the team alone reads)")
    for k, v in team_env(services).items():
        print(f"  {k}={v}")


if __name__ == "__main__":
    main()
