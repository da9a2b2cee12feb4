"""The records of curriculum runs over training seeds x float orders (``metrics/curriculum_runs.json``, written by
:mod:`benchmarks.robustness`): reading and merging them, each run's headline gains, and the tables over runs (the
gains' spread, each run's stages on validation and what a stage gave back)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.atomic import write_json_atomic

HEADLINE = ("geneval_strict", "geneval_partial", "ocr", "world_clipscore", "world_pickscore")
"""The headline rewards of a record, as the README's table names them."""
STAGE_COLUMNS = {
    "geneval_strict": "eval/geneval_geneval_strict",
    "geneval_partial": "eval/geneval_geneval_partial",
    "ocr": "eval/ocr",
    "world_clipscore": "eval/world_clipscore",
    "world_pickscore": "eval/world_pickscore",
}
"""Each headline reward's number in a stage's evaluation (flat metrics)."""
TOLERANCES = {
    "geneval_strict": 0.03,
    "geneval_partial": 0.03,
    "ocr": 0.03,
    "world_clipscore": 0.05,
    "world_pickscore": 0.5,
}
"""How far on validation a stage may lower what an earlier stage raised (issue 42's targets)."""


def give_backs(
    stages: Sequence[Mapping[str, Any]], tolerances: Mapping[str, float] = TOLERANCES
) -> list[dict[str, Any]]:
    """Each stage that lowers a reward below the best an earlier stage reached, when that best is above the base,
    by more than the reward's tolerance: ``stage``, ``reward``, ``value``, ``best`` and the stage that reached it
    (``stages``: the base first, then each stage's validation numbers)."""
    out = []
    for reward, tolerance in tolerances.items():
        rows = [(s["stage"], s[reward]) for s in stages if reward in s]
        if not rows:
            continue
        base = rows[0][1]
        for j in range(2, len(rows)):
            best_stage, best = max(rows[1:j], key=lambda r: r[1])
            name, value = rows[j]
            if best > base and value < best - tolerance:
                out.append({"stage": name, "reward": reward, "value": value, "best": best, "best_stage": best_stage})
    return out


def headline_gains(final: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each headline reward's ``base``, ``final``, paired ``gain`` and its 95% interval ``lo``, ``hi`` from an
    evaluation table with gains over ``base`` (``vgrpo.cli evaluate --baseline``;
    :func:`~vgrpo.evaluation.tables.compare`).
    GenEval strict is GenEval's overall (the mean of its tags) with its tag-stratified paired interval; GenEval
    partial is the mean partial credit (the GenEval reward's score) with its paired interval."""
    rewards, before = final["rewards"], base["rewards"]
    out: dict[str, dict[str, float]] = {}

    def row(b: float, f: float, gain: float, ci: Sequence[float]) -> dict[str, float]:
        return {"base": b, "final": f, "gain": gain, "lo": ci[0], "hi": ci[1]}

    if "geneval" in rewards:
        g, b = rewards["geneval"], before["geneval"]
        out["geneval_strict"] = row(
            b["geneval_strict"], g["geneval_strict"], g["geneval_strict_gain"], g["geneval_strict_gain_ci"]
        )
        out["geneval_partial"] = row(b["mean"], g["mean"], g["gain"], g["gain_ci"])
    for key in ("ocr", "world_clipscore", "world_pickscore"):
        if key in rewards:
            out[key] = row(before[key]["mean"], rewards[key]["mean"], rewards[key]["gain"], rewards[key]["gain_ci"])
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of ``path`` (none when it does not exist)."""
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise SystemExit(f"{path}: expected a list of run records")
    return data


def merge_record(path: Path, record: Mapping[str, Any]) -> None:
    """``record`` into ``path`` in place of the record of the same ``seed`` and ``threads``, atomically; records
    ordered by seed, then threads."""
    others = [r for r in read_records(path) if (r["seed"], r["threads"]) != (record["seed"], record["threads"])]
    records = sorted([*others, dict(record)], key=lambda r: (r["seed"], r["threads"]))
    write_json_atomic(path, records)


def gains_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Median, minimum and maximum gain over runs of each headline reward, the runs whose interval lies above 0,
    and the worst run's interval, as a Markdown table."""
    runs = ", ".join(f"seed {r['seed']} x {r['threads']} threads" for r in records)
    lines = [
        f"Over {len(records)} runs ({runs}):",
        "",
        "| | runs | median gain | min | max | CI above 0 | worst run [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in HEADLINE:
        rows = [r["rewards"][name] for r in records if name in r.get("rewards", {})]
        if not rows:
            continue
        gains = np.array([row["gain"] for row in rows])
        worst = rows[int(np.argmin(gains))]
        digits = 2 if name == "world_pickscore" else 3
        lines.append(
            f"| {name} | {len(rows)} | {np.median(gains):+.{digits}f} | {gains.min():+.{digits}f} | "
            f"{gains.max():+.{digits}f} | {sum(row['lo'] > 0 for row in rows)} of {len(rows)} | "
            f"{worst['gain']:+.{digits}f} [{worst['lo']:+.{digits}f}, {worst['hi']:+.{digits}f}] |"
        )
    if any("give_backs" in r for r in records):
        held = sum(not r.get("give_backs") for r in records if "give_backs" in r)
        lines += [
            "",
            f"Runs in which no stage gave back more than its tolerance on validation: {held} of {len(records)}",
        ]
    if any("clutter" in r for r in records):
        clean = sum(r["clutter"]["final"] <= r["clutter"]["base"] for r in records if "clutter" in r)
        lines.append(f"Runs whose final clutter is at most the base's: {clean} of {len(records)}")
    return "\n".join(lines)


def stages_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Each run's validation numbers after each stage (the base first; strict / partial / OCR / CLIPScore /
    PickScore), the iteration a holding stage kept, the give-backs and clutter: what recipe selection reads, as a
    Markdown table with a column per run."""
    heads = [f"{Path(str(r.get('curriculum', '?'))).stem}, seed {r['seed']} x {r['threads']}" for r in records]
    lines = ["| after | " + " | ".join(heads) + " |", "|---|" + "---|" * len(records)]
    depth = max(len(r["stages"]) for r in records)
    for i in range(depth):
        names = {r["stages"][i]["stage"] for r in records if i < len(r["stages"])}
        cells = []
        for r in records:
            if i >= len(r["stages"]):
                cells.append("")
                continue
            row = r["stages"][i]
            numbers = " / ".join(
                f"{row[n]:.2f}" if n == "world_pickscore" else f"{row[n]:.3f}" for n in HEADLINE if n in row
            )
            kept = row.get("kept_iteration")
            cells.append(numbers + (f" (kept {kept})" if kept is not None else ""))
        lines.append(f"| {' / '.join(sorted(names))} | " + " | ".join(cells) + " |")
    lines.append(
        "| give-backs beyond the tolerances | " + " | ".join(str(len(r["give_backs"])) for r in records) + " |"
    )
    clutter = [
        " -> ".join(f"{s['clutter']:.3f}" for s in r["clutter"]["stages"]) if "clutter" in r else "" for r in records
    ]
    lines.append("| clutter, base -> each stage | " + " | ".join(clutter) + " |")
    return "\n".join(lines)


def paired_stage_table(
    changed: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], stage: str, threads: int
) -> str:
    """Markdown: a setting's effect on one stage's validation numbers, paired by seed. ``changed`` and
    ``reference`` are records of the same curriculum (up to ``stage``) with and without the setting; each seed's
    difference is ``changed - reference`` at ``threads``, summarised by its mean with a t-based 95% interval over
    seeds, beside the float-order spread (the reference's runs at another thread count minus those at ``threads``,
    same seeds): a setting that only rounds differently should move the numbers no more than that does."""
    from scipy import stats

    def at(records: Sequence[Mapping[str, Any]], seed: int, n_threads: int) -> Mapping[str, Any] | None:
        for record in records:
            if record["seed"] == seed and record["threads"] == n_threads:
                return next((s for s in record["stages"] if s["stage"] == stage), None)
        return None

    pairs: list[tuple[int, Mapping[str, Any], Mapping[str, Any]]] = []
    for seed in sorted({r["seed"] for r in changed if r["threads"] == threads}):
        with_setting, without = at(changed, seed, threads), at(reference, seed, threads)
        if with_setting is not None and without is not None:
            pairs.append((seed, with_setting, without))
    if not pairs:
        raise ValueError(f"no seed has stage {stage!r} at {threads} threads in both record sets")
    others = sorted({r["threads"] for r in reference} - {threads})
    lines = [
        f"{stage} on validation, paired by seed ({', '.join(str(s) for s, _, _ in pairs)}; {threads} thread(s)): "
        "the setting minus the reference, each seed, and their mean with a t-based 95% interval over seeds"
        + (f"; beside it the reference at {others[0]} threads minus at {threads} (float order alone)" if others else "")
        + ".",
        "",
        "| reward | per seed | mean [95% CI] | float order alone |",
        "|---|---|---|---|",
    ]
    moved = [(at(reference, s, others[0]), r) for s, _, r in pairs] if others else []
    for key in HEADLINE:
        diffs = np.array([c[key] - r[key] for _, c, r in pairs])
        mean = float(diffs.mean())
        if len(diffs) > 1:
            half = float(stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs)))
            interval = f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"
        else:
            interval = f"{mean:+.3f} (one seed)"
        float_order = " ".join(f"{m[key] - r[key]:+.3f}" for m, r in moved if m is not None)
        lines.append(f"| {key} | {' '.join(f'{d:+.3f}' for d in diffs)} | {interval} | {float_order} |")
    return "\n".join(lines)
