"""Seconds and peak memory until each class of bad input is refused, on the embedded default, through the command
line and through the Python API (docs/reliability.md, "Refusals").

    python -m benchmarks.refusals                       # -> docs/benchmarks/refusals.md and refusals.json
    python -m benchmarks.refusals --out /tmp/refusals

Each case is a fresh process (as a user runs it), measured from its start to its exit by ``os.wait4``: wall seconds
and the child's peak resident memory (``ru_maxrss``). The first row is the floor every command pays, importing
torch, diffusers and transformers (``python -m vgrpo.cli --help``). The base pipeline is a copy of
``models/embedded-base``, so a refusal that failed could not harm the committed one; the starting adapter is trained
for one small iteration first. Each case must exit 2 with one line naming its culprit, and the copy of the base and
the adapter must be byte-identical afterwards; the table says so per case. Run nothing else alongside: the numbers
are wall-clock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGE = ["params/base.yaml", "params/models/embedded.yaml", "params/stages/embedded/2-geneval.yaml"]
TIMEOUT_S = 120
BOMB = "\n".join(
    ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    + [f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
)


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run ``argv``; its exit status, wall seconds, peak RSS (MB) and stderr's first error line."""
    with tempfile.TemporaryFile() as err_file:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err_file)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - started > TIMEOUT_S:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - started
        err_file.seek(0)
        err = err_file.read().decode(errors="replace")
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = err.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
    said = lines[start : start + 2] if start is not None and lines[start].endswith(":") else lines[start:][:1]
    first = " ".join(line.strip() for line in said) if start is not None else ""
    return {
        "exit": proc.returncode,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "message": first[:200],
        "traceback": "Traceback" in err,
    }


def _api(call: str) -> list[str]:
    """A Python process that builds a Trainer and trains, printing a UserError as the CLI does."""
    code = (
        "import sys\nfrom vgrpo.errors import UserError\nfrom vgrpo.trainer import Trainer\n"
        f"try:\n    {call}.train()\nexcept UserError as exc:\n    print(f'error: {{exc}}', file=sys.stderr)\n"
        "    sys.exit(2)\n"
    )
    return [sys.executable, "-c", code]


def _workspace(tmp: Path, env: dict[str, str]) -> None:
    """The copy of the base, a one-iteration adapter of rank 32, the same padded to rank 64, a corrupt adapter, bad
    params files, a reward module that does not compile, and a prompt file with an unknown colour."""
    shutil.copytree(ROOT / "models" / "embedded-base", tmp / "base")
    small = ["rollout.prompts_per_iteration=2", "rollout.group_size=2", "rollout.num_steps=4", "iterations=1"]
    train = [sys.executable, "-m", "vgrpo.cli", "train", "--params", *STAGE, "--root", str(ROOT)]
    train += ["--pipeline", str(tmp / "base"), "--out", str(tmp / "init"), "--work-dir", str(tmp / "init-work")]
    subprocess.run([*train, "--set", *small, "eval_prompts=null"], cwd=ROOT, env=env, check=True, capture_output=True)
    from safetensors.torch import load_file, save_file  # the benchmark's own setup, after the adapter is trained

    lora = "pytorch_lora_weights.safetensors"
    tensors = load_file(tmp / "init" / lora)
    (tmp / "rank64").mkdir()
    save_file(
        {k: v.repeat_interleave(2, dim=0 if ".lora_A." in k else 1) for k, v in tensors.items()}, tmp / "rank64" / lora
    )
    (tmp / "corrupt").mkdir()
    (tmp / "corrupt" / lora).write_bytes((tmp / "init" / lora).read_bytes()[:300])
    (tmp / "bomb.yaml").write_text(BOMB + "\n")
    (tmp / "twice.yaml").write_text("rollout:\n  group_size: 4\nrollout:\n  num_steps: 3\n")
    (tmp / "rewards_syntax.py").write_text("def brightness(images, prompts, metadata:\n    return 0\n")
    (tmp / "a_file").write_text("")
    row: dict[str, object] = {"prompt": "a photo of a mauve square", "tag": "color_attr"}
    row["include"] = [{"class": "square", "count": 1, "color": "mauve"}]
    (tmp / "mauve.jsonl").write_text(json.dumps(row) + "\n")
    (tmp / "reward.yaml").write_text(yaml.safe_dump({"rewards": [{"name": "rewards_syntax:brightness"}]}))


def cases(tmp: Path) -> dict[str, list[str]]:
    """Case name -> command line."""
    cli = [sys.executable, "-m", "vgrpo.cli"]
    train = [*cli, "train", "--params", *STAGE, "--root", str(ROOT), "--pipeline", str(tmp / "base")]
    out = ["--out", str(tmp / "out"), "--work-dir", str(tmp / "work")]
    params = ", ".join(repr(p) for p in STAGE)
    base = f"pipeline={str(tmp / 'base')!r}, root={str(ROOT)!r}, work_dir={str(tmp / 'work')!r}"
    return {
        "floor: import (vgrpo.cli --help)": [*cli, "--help"],
        "--out is the pipeline": [*train, "--out", str(tmp / "base"), "--work-dir", str(tmp / "work")],
        "--out is the starting adapter": [
            *train,
            "--init-lora",
            str(tmp / "init"),
            "--out",
            str(tmp / "init"),
            "--work-dir",
            str(tmp / "work"),
        ],
        "export --scale nan": [
            *cli,
            "export",
            str(tmp / "base"),
            "--lora",
            str(tmp / "init"),
            "--out",
            str(tmp / "merged"),
            "--scale",
            "nan",
        ],
        "YAML alias bomb": [*train, "--params", *STAGE, str(tmp / "bomb.yaml"), *out],
        "rollout.num_steps=1e9": [*train, *out, "--set", "rollout.num_steps=1000000000"],
        "evaluation.resolution=48": [*train, *out, "--set", "evaluation.resolution=48"],
        "--work-dir under a file": [*train, "--out", str(tmp / "out"), "--work-dir", str(tmp / "a_file" / "w")],
        "a section set twice": [*train, "--params", *STAGE, str(tmp / "twice.yaml"), *out],
        "reward module does not compile": [*train, "--params", *STAGE, str(tmp / "reward.yaml"), *out],
        "--init-lora of another rank": [*train, "--init-lora", str(tmp / "rank64"), *out],
        "--init-lora corrupt": [*train, "--init-lora", str(tmp / "corrupt"), *out],
        "unknown GenEval colour": [*train, *out, "--set", f"prompts={tmp / 'mauve.jsonl'}"],
        "API: out_dir is the pipeline": _api(f"Trainer.from_params({params}, {base}, out_dir={str(tmp / 'base')!r})"),
        "API: corrupt init_lora": _api(
            f"Trainer.from_params({params}, {base}, out_dir={str(tmp / 'out')!r}, init_lora={str(tmp / 'corrupt')!r})"
        ),
        "API: unknown GenEval colour": _api(
            f"Trainer.from_params({params}, overrides={{'prompts': {str(tmp / 'mauve.jsonl')!r}}}, {base}, "
            f"out_dir={str(tmp / 'out')!r})"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="folder for refusals.md and .json")
    args = parser.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), "."])}
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp)])
        _workspace(tmp, env)
        inputs = {"base": _digest(tmp / "base"), "init": _digest(tmp / "init")}
        for case, command in cases(tmp).items():
            row = {"case": case, **_run(command, ROOT, env)}
            row["inputs_intact"] = inputs == {"base": _digest(tmp / "base"), "init": _digest(tmp / "init")}
            row["nothing_written"] = not any((tmp / p).exists() for p in ("out", "work", "merged"))
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "refusals.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "# Refusals: seconds and memory until bad input is refused",
        "",
        "`python -m benchmarks.refusals` on the embedded default (2 CPU cores), each case a fresh process measured by",
        "`os.wait4` from start to exit; the first row is what every command pays to import torch, diffusers and",
        "transformers. 'intact': the copy of the base pipeline and the starting adapter byte-identical afterwards;",
        "'nothing written': no `--out`, work folder or export created.",
        "",
        "| case | exit | s | peak MB | traceback | intact | nothing written | message |",
        "| --- | ---: | ---: | ---: | --- | --- | --- | --- |",
    ]
    for r in rows:
        message = r["message"].replace("|", "\\|")
        flags = ["yes" if r["traceback"] else "no", "yes" if r["inputs_intact"] else "NO"]
        flags.append("yes" if r["nothing_written"] else "NO")
        cells = [r["case"], str(r["exit"]), f"{r['wall_s']:.1f}", f"{r['peak_rss_mb']:.0f}", *flags, message]
        lines.append("| " + " | ".join(cells) + " |")
    (out / "refusals.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
