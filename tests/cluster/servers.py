"""Real servers on 127.0.0.1 for the cluster tests, each in its own process group and stopped by it: an
S3-compatible object store (moto's server, ``moto_server`` from the ``moto[server]`` wheel in the dev extra), and
the team's services as ``python -m services.team up`` starts them, with credentials and TLS
(:func:`team_services`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.local import ServiceError, wait_healthy
from services.team import TLS, TeamServices, team_down, team_up
from services.team_checks import check_team_settings
from services.team_postgres import pg_bin
from tasks.launch import free_port
from tasks.process_group import stop_group

S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def s3_server(log_dir: Path, bucket: str = "vgrpo") -> Iterator[dict[str, str]]:
    """Start moto's S3 server, create ``bucket``, and yield the environment a client needs to reach it
    (``AWS_ENDPOINT_URL`` and test credentials)."""
    port = free_port()
    log = log_dir / "s3.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy("moto's S3 server", url + "/moto-api/", proc, log, 60)
        env = {**S3_ENV, "AWS_ENDPOINT_URL": url}
        import boto3

        boto3.client("s3", endpoint_url=url, **_creds()).create_bucket(Bucket=bucket)
        yield env
    finally:
        stop_group(proc)


def _creds() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_DEFAULT_REGION"],
    }


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def self_signed_tls(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A CA made here and a server certificate it signs for ``host`` (an IP address): ``(cert, key, ca)`` PEM
    files in ``folder``, the key 0600. What a team's own CA would issue; nothing is fetched."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vgrpo test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path, ca_path = folder / "server.pem", folder / "server.key", folder / "ca.pem"
    cert_path.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return cert_path, key_path, ca_path


@dataclass(frozen=True)
class Team:
    """The team's services, started: ``env`` is what a client on any machine exports (``team.env`` and
    ``secrets.env``: the addresses, the team's CA, Prefect's auth string and MLflow's credentials)."""

    services: TeamServices
    env: dict[str, str]

    @property
    def logs(self) -> list[Path]:
        root = self.services.root.resolve()
        return [root / "prefect.log", root / "mlflow.log", root / "postgres" / "server.log"]

    def client_env(self, **extra: str) -> dict[str, str]:
        """This process's environment with no Prefect or MLflow setting of its own, the team's, and ``extra``."""
        own = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        return own | self.env | extra

    def prefect_settings(self) -> dict[Any, str]:
        """The settings (for ``prefect.settings.temporary_settings``) that reach the team's Prefect server from this
        process: its URL, the auth string and the CA."""
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_SSL_CERT_FILE, PREFECT_API_URL

        return {
            PREFECT_API_URL: self.env["PREFECT_API_URL"],
            PREFECT_API_AUTH_STRING: self.env["PREFECT_API_AUTH_STRING"],
            PREFECT_API_SSL_CERT_FILE: self.env["PREFECT_API_SSL_CERT_FILE"],
        }


@contextmanager
def team_services(store: Path) -> Iterator[Team]:
    """``team_up`` on free loopback ports with TLS (a CA and a certificate for 127.0.0.1 made here) and its
    artifacts under ``store``; stopped and removed after. Skips where PostgreSQL is not installed."""
    try:
        pg_bin("initdb")
    except ServiceError as missing:
        pytest.skip(str(missing))
    # PostgreSQL runs as the postgres user when the tests run as root: a folder it can reach (pytest's own
    # temporary folders are private to root).
    root = Path(tempfile.mkdtemp(prefix="vgrpo-team-"))
    root.chmod(0o755)
    services = TeamServices(
        root / "services",
        str(store),
        pg_port=free_port(),
        prefect_port=free_port(),
        mlflow_port=free_port(),
        tls=TLS(*self_signed_tls(root / "tls")),
    )
    try:
        check_team_settings(services)  # what `up` checks first: the good settings pass it
        yield Team(services, team_up(services))
    finally:
        team_down(services.root)
        shutil.rmtree(root, ignore_errors=True)
