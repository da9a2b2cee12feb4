"""``python -m services.team up`` with a bad setting, run as a user runs it: exit status 2, one line naming the
flag or variable it came from (several bad settings: one line each, in one message), no traceback, no password,
nothing made under ``--root`` and no process left; the good settings pass the same checks (the slow
``tests/cluster/test_team_services.py`` starts the services with them, through
:func:`tests.cluster.servers.team_services`)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.team import TeamSecrets
from services.team_checks import SECRET_KEYS, mask_url, team_problems
from services.team_config import TLS, TeamServices
from tasks.launch import free_port
from tests.cluster.servers import self_signed_tls

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "pw-never-shown-7f3a"
GOOD_DATABASE = f"postgresql://vgrpo:{PASSWORD}@127.0.0.1:5432"  # a server of the team's: no own PostgreSQL checks


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[TLS, TLS]:
    """A certificate for 127.0.0.1 and one for another address, each with its own CA."""
    here, other = tmp_path_factory.mktemp("tls-here"), tmp_path_factory.mktemp("tls-other")
    return TLS(*self_signed_tls(here)), TLS(*self_signed_tls(other, host="10.1.2.3"))


def _tls_args(tls: TLS) -> list[str]:
    return ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca)]


def _processes_naming(text: str) -> list[str]:
    """The command lines of this machine's processes that name ``text`` (a server started under ``--root``)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone since the listing
            continue
        if text in args:
            found.append(args)
    return found


def _up(tmp_path: Path, *args: str, database: str | None = GOOD_DATABASE) -> subprocess.CompletedProcess[str]:
    """``up`` with ``args`` on free ports (unless ``args`` name them), its root ``tmp_path/root``."""
    env = {k: v for k, v in os.environ.items() if k != "VGRPO_DATABASE_URL"}
    if database is not None:
        env["VGRPO_DATABASE_URL"] = database
    ports = [] if "--prefect-port" in args else ["--prefect-port", str(free_port())]
    ports += [] if "--mlflow-port" in args else ["--mlflow-port", str(free_port())]
    root, store = tmp_path / "root", tmp_path / "store"
    cmd = [sys.executable, "-m", "services.team", "up", "--root", str(root), "--store", str(store)]
    return subprocess.run([*cmd, *ports, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def _refused(result: subprocess.CompletedProcess[str], tmp_path: Path, *named: str, lines: int = 1) -> str:
    """Assert the refusal and return its message."""
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "Traceback" not in out and PASSWORD not in out
    message = result.stderr.strip()
    assert message.startswith("error: ") and len(message.splitlines()) == lines, message
    for name in named:
        assert name in message, (name, message)
    assert not (tmp_path / "root").exists()  # nothing made, so nothing started
    assert _processes_naming(str(tmp_path / "root")) == []
    return message


def test_a_missing_certificate_is_named_by_its_flag(tmp_path: Path, certs: tuple[TLS, TLS]) -> None:
    here, _ = certs
    missing = tmp_path / "nope.pem"
    args = ["--tls-cert", str(missing), "--tls-key", str(here.key), "--tls-ca", str(here.ca)]
    _refused(_up(tmp_path, *args), tmp_path, f"--tls-cert {missing}: no such file")


def test_a_key_that_is_not_the_certificates_is_named(tmp_path: Path, certs: tuple[TLS, TLS]) -> None:
    here, other = certs
    args = _tls_args(dataclasses.replace(here, key=other.key))
    _refused(_up(tmp_path, *args), tmp_path, f"--tls-key {other.key}: not the private key of --tls-cert {here.cert}")


def test_a_key_that_is_not_pem_is_named(tmp_path: Path, certs: tuple[TLS, TLS]) -> None:
    here, _ = certs
    args = _tls_args(dataclasses.replace(here, key=here.cert))
    _refused(_up(tmp_path, *args), tmp_path, f"--tls-key {here.cert}: no PEM private key")


def test_a_certificate_the_clients_would_refuse_is_named(tmp_path: Path, certs: tuple[TLS, TLS]) -> None:
    """Issued for another address than ``--host``, or by another CA than ``--tls-ca``: refused before the servers
    start, not after the health checks' timeout."""
    here, other = certs
    _refused(_up(tmp_path, *_tls_args(other)), tmp_path, f"--tls-cert {other.cert}", "not valid for '127.0.0.1'")
    foreign_ca = _tls_args(dataclasses.replace(here, ca=other.ca))
    _refused(_up(tmp_path, *foreign_ca), tmp_path, f"--tls-cert {here.cert}", f"--tls-ca {other.ca}")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"postgresql://vgrpo:{PASSWORD}/x@127.0.0.1:5432", "not a well-formed URL"),  # an unencoded / in it
        (f"postgresql://vgrpo:{PASSWORD}@[::1:5432", "not a well-formed URL"),
        (f"mysql://vgrpo:{PASSWORD}@127.0.0.1:3306", "the scheme mysql://; supported: postgresql://"),
        (f"vgrpo:{PASSWORD}@127.0.0.1:5432", "no scheme; supported: postgresql://"),
        (f"postgresql://vgrpo:{PASSWORD}@127.0.0.1:5432/mlflow", "a path after the server"),
        (f"postgresql://vgrpo:{PASSWORD}@127.0.0.1:5432?sslmode=require", "query parameters are not passed on"),
        (f"postgresql://vgrpo:{PASSWORD}@:5432", "no host"),
    ],
)
def test_a_database_url_it_cannot_use_is_named_with_its_password_masked(tmp_path: Path, url: str, says: str) -> None:
    message = _refused(_up(tmp_path, database=url), tmp_path, "VGRPO_DATABASE_URL ", says)
    assert ":***@" in message


def test_the_database_flag_is_named_when_the_url_came_from_it(tmp_path: Path) -> None:
    result = _up(tmp_path, "--database-url", "postgres://vgrpo@127.0.0.1:5432", database=None)
    _refused(result, tmp_path, "--database-url postgres://vgrpo@127.0.0.1:5432: the scheme postgres://")


def test_a_busy_port_is_named_as_busy(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _refused(_up(tmp_path, "--mlflow-port", str(port)), tmp_path, f"--mlflow-port {port}: busy on 127.0.0.1")


def test_ports_out_of_range_or_shared_are_named(tmp_path: Path) -> None:
    _refused(_up(tmp_path, "--prefect-port", "70000"), tmp_path, "--prefect-port 70000: not a port")
    port = str(free_port())
    same = _up(tmp_path, "--prefect-port", port, "--mlflow-port", port)
    _refused(same, tmp_path, f"--mlflow-port {port}: the same port as --prefect-port")


def test_a_root_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cmd = [sys.executable, "-m", "services.team", "up", "--root", str(tmp_path / "file" / "root")]
    env = os.environ | {"VGRPO_DATABASE_URL": GOOD_DATABASE}
    result = subprocess.run(
        [*cmd, "--store", str(tmp_path / "store"), "--prefect-port", str(free_port()), "--mlflow-port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 3  # the header and one line for each setting
    assert f"--root {tmp_path / 'file' / 'root'}: {tmp_path / 'file'} is not a folder" in message
    assert "--mlflow-port 0: not a port" in message


def test_a_secrets_file_others_read_is_named_before_anything_starts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "secrets.json").write_text("{}")
    (root / "secrets.json").chmod(0o644)
    result = _up(tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--root" in result.stderr and "secrets.json must be a file of this user" in result.stderr
    assert sorted(p.name for p in root.iterdir()) == ["secrets.json"]  # nothing else made
    (root / "secrets.json").chmod(0o600)
    assert "not the credentials an earlier `up` wrote" in _up(tmp_path).stderr


def test_every_bad_setting_is_in_one_message_one_line_each(tmp_path: Path, certs: tuple[TLS, TLS]) -> None:
    here, _ = certs
    bad = _tls_args(dataclasses.replace(here, cert=tmp_path / "nope.pem"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        result = _up(tmp_path, *bad, "--prefect-port", busy, database=f"sqlite://u:{PASSWORD}@x")
    named = ("--tls-cert", f"--prefect-port {busy}: busy", "VGRPO_DATABASE_URL sqlite://u:***@x")
    message = _refused(result, tmp_path, "3 problems", *named, lines=4)
    assert [line.startswith("  - ") for line in message.splitlines()] == [False, True, True, True]


def test_the_good_settings_pass(tmp_path: Path, certs: tuple[TLS, TLS]) -> None:
    here, _ = certs
    ports = {"pg_port": free_port(), "prefect_port": free_port(), "mlflow_port": free_port()}
    services = TeamServices(tmp_path / "root", str(tmp_path / "store"), **ports, tls=here, database_url=GOOD_DATABASE)
    assert team_problems(services) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as the postgres user only when up runs as root")
def test_as_root_a_root_the_postgres_user_cannot_reach_is_named(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    services = TeamServices(closed / "root", str(tmp_path / "store"), pg_port=free_port(), prefect_port=free_port())
    problems = " | ".join(team_problems(dataclasses.replace(services, mlflow_port=free_port())))
    assert "the `postgres` system user" in problems or "has none" in problems


def test_a_password_is_masked_however_the_url_is_malformed() -> None:
    for url in (
        "postgresql://u:se@cr/et@h:1",  # an @ and a / unencoded in it
        "postgresql://u:se://cret@h",
        "postgresql:/u:secret@h",  # one slash
        "u:secret@h:5432",  # no scheme
        "postgresql://:secret@h",  # no user
    ):
        masked = mask_url(url)
        assert "***@h" in masked and not any(piece in masked for piece in ("se@", "cr", "et@", "cret")), url
    assert mask_url("postgresql://u@h:5432") == "postgresql://u@h:5432"  # no password: shown whole


def test_the_secrets_files_keys_are_the_secrets_fields() -> None:
    assert {f.name for f in dataclasses.fields(TeamSecrets)} == SECRET_KEYS


@pytest.fixture(autouse=True)
def _no_stray_servers(tmp_path: Path) -> Iterator[None]:
    yield
    assert _processes_naming(str(tmp_path)) == []
