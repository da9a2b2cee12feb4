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
