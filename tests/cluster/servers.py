"""Real servers on 127.0.0.1 for the cluster tests, each in its own process group and stopped by it: an
S3-compatible object store (moto's server, ``moto_server`` from the ``moto[server]`` wheel in the dev extra)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flows.services import wait_healthy
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
