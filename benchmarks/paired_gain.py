"""Paired gains of stage runs' evaluations over the base's, on the prompts both evaluated: the tuning table.

    python -m benchmarks.paired_gain RUN.json ... [--base metrics/base_validation.scores.json]
        [--pretrain-params params/embedded/pretrain.yaml] [--out metrics/tuning/NAME.json]

Recipe selection reads the validation split (docs/embedded.md#the-validation-split): the default base is the base's
evaluation on ``data/world/validation.jsonl`` (DVC stage ``evaluate_base_validation``), and a base evaluated on the
test split is refused unless ``--final-report`` says the table is the final report's. ``--out`` records the table
with what it was computed from: the commit (and whether the code differed from it), the split (the base's prompt
file and its SHA-256), the base file and each run's file and numbers.

Each input is a ``--metrics`` file of ``python -m vgrpo.cli train`` (its last evaluation is used) or an
evaluation table with ``per_prompt``. A stage evaluation with ``max_prompts: 120`` covers the first 120 test
prompts, with the same noise per image as the base's 560-prompt evaluation (sample ``i`` draws from
``(seed, i)``), so every image is paired with the base's. GenEval strict is the mean over tags; its gain
has a paired bootstrap 95% CI stratified by tag (:func:`vgrpo.evaluation.stats.bootstrap_ci`). The ``colors`` and
``color_attr`` prompts are also split into those naming a held-out colour-shape pair (the pretraining
params' ``held_out_pairs``) and the rest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.atomic import file_sha256, write_json_atomic
from vgrpo.evaluation.stats import bootstrap_ci, stratified_mean
from vgrpo.params_file import load_params
from vgrpo.splits import tuning_prompt_problems
from vgrpo.world.config import PretrainConfig

COLOUR_TAGS = ("colors", "color_attr")


def _per_prompt(path: Path) -> tuple[dict[str, Any], int | None]:
    data = json.loads(path.read_text())
    table = data["evaluations"][-1] if data.get("evaluations") else data
    if "per_prompt" not in table:
        raise SystemExit(
            f"{path}: no per-prompt scores (neither a train --metrics file with an evaluation nor an evaluation table)"
        )
    return table["per_prompt"], table.get("iteration")


def _names_held_out_pair(prompt: str, held_out: Sequence[tuple[str, str]]) -> bool:
    return any(f"{color} {shape}" in prompt for color, shape in held_out)


def paired_row(run: dict[str, Any], base: dict[str, Any], held_out: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Strict, its paired gain and CI, per-tag gains, held-out/seen colour gains, OCR and preference gains."""
    n = len(run["prompt"])
    if base["prompt"][:n] != run["prompt"]:
        raise ValueError("the run's evaluation prompts are not the first prompts of the base's evaluation")
    idx = [i for i in range(n) if run["geneval"]["strict"][i] is not None]
    ours = np.array([run["geneval"]["strict"][i] for i in idx])
    theirs = np.array([base["geneval"]["strict"][i] for i in idx])
    tags = np.array([run["tag"][i] for i in idx])
    low, high = bootstrap_ci(ours - theirs, tags)
    row: dict[str, Any] = {
        "prompts": n,
        "strict": stratified_mean(ours, tags),
        "base_strict": stratified_mean(theirs, tags),
        "gain": stratified_mean(ours - theirs, tags),
        "gain_ci": [low, high],
        "per_tag_gain": {t: float((ours - theirs)[tags == t].mean()) for t in dict.fromkeys(tags.tolist())},
    }
    for held in (True, False):
        mask = np.array(
            [run["tag"][i] in COLOUR_TAGS and _names_held_out_pair(run["prompt"][i], held_out) == held for i in idx]
        )
        row["held_out_colour_gain" if held else "seen_colour_gain"] = float((ours - theirs)[mask].mean())
    for reward in ("ocr", "world_clipscore", "world_pickscore"):
        if reward in run:
            scores = zip(run[reward]["mean"], base[reward]["mean"][:n], strict=True)
            row[f"{reward}_gain"] = float(np.mean([a - b for a, b in scores if a is not None]))
    return row


def base_split(base_scores: Path) -> dict[str, Any]:
    """The prompt file a base's per-prompt scores (``X.scores.json``) were evaluated on, from its table ``X.json``,
    with the file's SHA-256 when it is there."""
    table = base_scores.with_name(base_scores.name.replace(".scores.json", ".json"))
    prompts = json.loads(table.read_text()).get("prompt_file") if table.is_file() else None
    digest = file_sha256(Path(prompts)) if prompts and Path(prompts).is_file() else None
    return {"prompt_file": prompts, "sha256": digest}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--base", type=Path, default=Path("metrics/base_validation.scores.json"))
    parser.add_argument("--pretrain-params", type=Path, default=Path("params/embedded/pretrain.yaml"))
    parser.add_argument("--out", type=Path, help="the tuning record to write (JSON)")
    parser.add_argument("--final-report", action="store_true", help="allow a base evaluated on the test split")
    args = parser.parse_args(argv)
    split = base_split(args.base)
    if split["prompt_file"] and not args.final_report:
        problems = tuning_prompt_problems(
            {f"--base {args.base}: evaluated on": split["prompt_file"]},
            ["data/world/test.jsonl"],
            final_report="--final-report; the validation base is metrics/base_validation.scores.json",
        )
        if problems:
            raise SystemExit(problems[0])
    base = json.loads(args.base.read_text())
    held_out = load_params([args.pretrain_params], section="pretrain", schema=PretrainConfig).held_out_pairs
    rows: dict[str, Any] = {}
    print("| run | iteration | strict (base) | gain [95% CI] | per-tag gain | colours held-out / seen | OCR | Pick |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.runs:
        per_prompt, iteration = _per_prompt(path)
        try:
            r = paired_row(per_prompt, base, held_out)
        except ValueError as err:
            raise SystemExit(f"{path} against {args.base}: {err}") from err
        rows[str(path)] = {"iteration": iteration, **r}
        tags = ", ".join(f"{t} {g:+.2f}" for t, g in r["per_tag_gain"].items())
        print(
            f"| {path.stem} | {iteration} | {r['strict']:.3f} ({r['base_strict']:.3f}) | {r['gain']:+.3f} "
            f"[{r['gain_ci'][0]:+.3f}, {r['gain_ci'][1]:+.3f}] | {tags} | {r['held_out_colour_gain']:+.2f} / "
            f"{r['seen_colour_gain']:+.2f} | {r.get('ocr_gain', float('nan')):+.3f} | "
            f"{r.get('world_pickscore_gain', float('nan')):+.2f} |"
        )
    if args.out:
        record = {
            "commit": _git("rev-parse", "HEAD") or None,
            "code_dirty": bool(_git("status", "--porcelain", "--", "vgrpo", "tasks", "benchmarks", "params")),
            "split": split,
            "base": str(args.base),
            "runs": rows,
        }
        write_json_atomic(args.out, record)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
