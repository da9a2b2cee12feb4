"""Build benchmark v3's report twice from the same records, with the analysis code of the pre-registration
commit and with this checkout's, and say how they differ.

    python -m benchmarks.compare.prereg_check                      # the grid's records, the pre-registration commit
    python -m benchmarks.compare.prereg_check --commit HEAD --records RECORDS.jsonl

The pre-registration fixes the analysis at its commit; code changed since is reported beside it. This checks that
what the report says with the fixed code is what it says now: every line of the old build that the new one changes
or drops is listed, and every block the new one adds (the sections written after the commit) is named by its first
line. The old code runs from ``git archive`` of the commit, in a subprocess with this interpreter.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.compare.plan_v3 import PREREGISTRATION
from benchmarks.compare.registered import V3_DOCS


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def preregistration_commit() -> str:
    """The commit that last changed the pre-registration file (a shallow clone may not hold it: refused)."""
    if _git("rev-parse", "--is-shallow-repository") == "true":
        raise RuntimeError(f"{ROOT} is a shallow clone: fetch its history (git fetch --unshallow) or pass --commit")
    out = _git("log", "-1", "--format=%H", "--", str(PREREGISTRATION.relative_to(ROOT)))
    if not out:
        raise RuntimeError(f"{PREREGISTRATION} has no commit")
    return out


def compare(old: str, new: str, shown: int = 20) -> list[str]:
    """Markdown lines on how report ``new`` differs from report ``old``: the old lines it changes or drops (up to
    ``shown``), then the blocks it adds, each by its first line that is not blank."""
    a, b = old.splitlines(), new.splitlines()
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    changed = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag in ("replace", "delete")]
    added = [(j1, j2) for tag, _, _, j1, j2 in ops if tag == "insert"]
    lines = [f"Old lines changed or dropped: {sum(i2 - i1 for i1, i2, _, _ in changed)}."]
    for i1, i2, j1, j2 in changed[:shown]:
        now = f"now lines {j1 + 1}-{j2}" if j2 > j1 else "dropped"
        lines.append(f"- old lines {i1 + 1}-{i2} ({now}): `{a[i1][:100]}`")
    lines.append(f"Blocks added (every other line of the old report is there, in order): {len(added)}.")
    lines += [f"- lines {j1 + 1}-{j2}: `{next((x for x in b[j1:j2] if x.strip()), '')[:100]}`" for j1, j2 in added]
    return lines


def build(code: Path, records: Path, docs: Path) -> str:
    """The v3 report built by the report module under ``code`` from ``records`` into ``docs``."""
    env = os.environ | {"PYTHONPATH": str(code), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "benchmarks.compare.report", str(records), str(docs), "--grid", "v3"]
    subprocess.run(cmd, cwd=code, env=env, check=True, stdout=subprocess.DEVNULL)
    return (docs / "README.md").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default=None, help="the old code's commit (default: the pre-registration's)")
    parser.add_argument("--records", type=Path, default=V3_DOCS / "cells.jsonl")
    args = parser.parse_args()
    if not args.records.is_file():
        parser.error(f"--records: {args.records} is not a file")
    try:
        commit = args.commit or preregistration_commit()
    except RuntimeError as exc:
        parser.error(f"--commit: {exc}")
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode:
        parser.error(f"--commit: git archive {commit}: {archive.stderr.decode().strip()}")
    with tempfile.TemporaryDirectory() as tmp:
        old_code = Path(tmp) / "code"
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
            tar.extractall(old_code, filter="data")
        old = build(old_code, args.records.resolve(), Path(tmp) / "old")
        new = build(ROOT, args.records.resolve(), Path(tmp) / "new")
    print(f"The v3 report from {args.records}, built with the code of {commit[:12]} and with this checkout:\n")
    print("\n".join(compare(old, new)))


if __name__ == "__main__":
    main()
