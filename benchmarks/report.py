"""Turn the runs of ``benchmarks/compare.py`` into a markdown report with PNG plots.

    python benchmarks/report.py runs/bench/full docs/benchmarks [--mlflow sqlite:////abs/runs/mlflow/mlflow.db]

Every number in the report is computed here from the run records; nothing is typed in by hand.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METHODS = ("vgrpo", "naive_elbo", "flow_grpo", "mixgrpo", "diffusion_nft")
LABELS = {
    "vgrpo": "V-GRPO",
    "naive_elbo": "naive ELBO-GRPO",
    "flow_grpo": "Flow-GRPO",
    "mixgrpo": "MixGRPO",
    "diffusion_nft": "DiffusionNFT",
}
HELD_OUT = {"geneval": "geneval_partial", "preference": "world_pickscore"}


def load_runs(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def collapsed(run: dict[str, Any]) -> bool:
    """A run collapsed when its final held-out reward fell below half of its start (GenEval partial credit) or
    more than 1.0 below it (PickScore, a logit), or when it skipped iterations for NaN/Inf."""
    key = HELD_OUT[run["spec"]["reward"]]
    first, last = run["curve"][0][key], run["curve"][-1][key]
    drop = last < 0.5 * first if run["spec"]["reward"] == "geneval" else last < first - 1.0
    return bool(drop or run["skipped_iterations"])


def mean_curve(runs: Sequence[dict[str, Any]], key: str) -> list[dict[str, float]]:
    """Point-wise mean, min and max over seeds of the evaluation points (they share iterations)."""
    points = []
    for i in range(min(len(r["curve"]) for r in runs)):
        rows = [r["curve"][i] for r in runs]
        values = [row[key] for row in rows]
        points.append(
            {
                "iteration": rows[0]["iteration"],
                "train_s": statistics.mean(r["train_s"] for r in rows),
                "gradient_steps": rows[0]["gradient_steps"],
                "nfe": statistics.mean(r["nfe"] for r in rows),
                "mean": statistics.mean(values),
                "min": min(values),
                "max": max(values),
            }
        )
    return points


def first_reaching(curve: Sequence[dict[str, float]], level: float, axis: str) -> float | None:
    """The first evaluation point whose mean reaches ``level`` (evaluation points only: no interpolation)."""
    return next((p[axis] for p in curve if p["mean"] >= level - 1e-12), None)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it (the report shows repository paths)."""
    full = path.resolve()
    return str(full.relative_to(Path.cwd())) if full.is_relative_to(Path.cwd()) else str(path)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _plot(curves: dict[str, list[dict[str, float]]], axis: str, ylabel: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method, curve in curves.items():
        xs = [p[axis] for p in curve]
        ax.plot(xs, [p["mean"] for p in curve], marker="o", label=LABELS.get(method, method))
        ax.fill_between(xs, [p["min"] for p in curve], [p["max"] for p in curve], alpha=0.2)
    ax.set_xlabel(
        {
            "train_s": "training wall time (s, evaluation excluded)",
            "gradient_steps": "gradient steps",
            "nfe": "model evaluations (NFE, training)",
        }[axis]
    )
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _targets(curves: dict[str, list[dict[str, float]]]) -> list[str]:
    lines = []
    v = curves.get("vgrpo")
    if v is None:
        return ["V-GRPO has no runs yet."]
    for other, factor in (("flow_grpo", 0.5), ("mixgrpo", 0.5)):
        c = curves.get(other)
        if c is None:
            lines.append(f"- vs {LABELS[other]}: no runs yet.")
            continue
        best = max(p["mean"] for p in c)
        t_other = first_reaching(c, best, "train_s")
        t_v = first_reaching(v, best, "train_s")
        if not t_other:
            lines.append(
                f"- vs {LABELS[other]}: its best held-out reward is its start ({best:.3f}); it did not "
                "improve within the budget, so there is no time to compare against."
            )
        elif t_v is None:
            lines.append(
                f"- vs {LABELS[other]}: its best held-out reward {best:.3f} (at {t_other:.0f} s) is **not "
                f"reached** by V-GRPO within the budget (V-GRPO's best {max(p['mean'] for p in v):.3f}): "
                "target missed."
            )
        else:
            ratio = t_v / t_other if t_other else float("inf")
            verdict = "met" if ratio <= factor else "missed"
            lines.append(
                f"- vs {LABELS[other]}: V-GRPO reaches its best held-out reward {best:.3f} at {t_v:.0f} s "
                f"against its {t_other:.0f} s: ratio {ratio:.2f} (target <= {factor}): **{verdict}**."
            )
    c = curves.get("diffusion_nft")
    if c is None:
        lines.append("- vs DiffusionNFT: no runs yet.")
    elif c[-1]["mean"] <= c[0]["mean"]:
        lines.append(
            f"- vs DiffusionNFT: its final held-out reward {c[-1]['mean']:.3f} is not above its start "
            f"{c[0]['mean']:.3f}; it did not improve within the budget, so there is no step count to compare against."
        )
    else:
        final, steps = c[-1]["mean"], c[-1]["gradient_steps"]
        s_v = first_reaching(v, final, "gradient_steps")
        if s_v is None:
            lines.append(
                f"- vs DiffusionNFT: its final held-out reward {final:.3f} is **not reached** by V-GRPO: target missed."
            )
        else:
            ratio = s_v / steps if steps else float("inf")
            verdict = "met" if ratio <= 1 / 3 else "missed"
            lines.append(
                f"- vs DiffusionNFT: V-GRPO reaches its final held-out reward {final:.3f} after {s_v:.0f} "
                f"gradient steps against its {steps:.0f}: ratio {ratio:.2f} (target <= 0.33): "
                f"**{verdict}**."
            )
    return lines


def _diagnosis(methods: dict[str, list[dict[str, Any]]], curves: dict[str, list[dict[str, float]]], key: str) -> str:
    """What the numbers say about why a target is met or missed: the spread of the methods against the noise of
    the evaluation, and where each method spends its time."""
    finals = {m: statistics.mean(r["curve"][-1][key] for r in rs) for m, rs in methods.items()}
    starts = [r["curve"][0][key] for rs in methods.values() for r in rs]
    ev = next(iter(methods.values()))[0].get("config", {}).get("evaluation", {})
    images = ev.get("max_prompts", 0) * ev.get("group_size", 0)
    noise = 2 * (0.25 / images) ** 0.5 if images and key.startswith("geneval") else None
    spread = max(finals.values()) - min(finals.values())
    text = (
        f"Diagnosis: from a common start of {statistics.mean(starts):.3f}, the methods' final held-out means span "
        f"{min(finals.values()):.3f}..{max(finals.values()):.3f} (spread {spread:.3f})"
    )
    if noise is not None:
        text += (
            f", {'inside' if spread < noise else 'beyond'} the evaluation's noise of about {noise:.2f}: at this "
            "budget the reward-based targets are " + ("not resolved" if spread < noise else "resolved")
        )
    update = {m: statistics.mean(r["time_split_s"]["update"] for r in rs) for m, rs in methods.items()}
    total = {m: statistics.mean(r["time_split_s"]["total"] for r in rs) for m, rs in methods.items()}
    parts = ", ".join(f"{LABELS[m]} {total[m]:.1f} s ({update[m]:.1f} s update)" for m in methods)
    return text + f". Seconds per iteration: {parts}."


def write_report(
    folder: Path, docs: Path, *, command: str, grid_s: float | None = None, planned: Sequence[str] = ()
) -> None:
    runs = load_runs(folder)
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "runs.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "config"}) + "\n" for r in runs)
    )
    done = {r["name"] for r in runs}
    missing = [p for p in planned if p not in done]
    out = ["# Benchmarks: V-GRPO and the baselines side by side on the embedded default", ""]
    out += [
        f"Produced by `{command}` (or `python benchmarks/report.py {_shown(folder)} {_shown(docs)}` from its records).",
        "Machine: 2 CPU cores, no GPU. Every run trains a LoRA on `models/embedded-base` with the same prompts "
        "per iteration, group size, rollout steps, seeds and number of iterations (equal rollout budgets); the "
        "held-out reward is measured on fixed test prompts with fixed seeds by ODE sampling.",
        "",
    ]
    if runs:
        r0 = runs[0]
        out.append(
            f"Per run: {r0['iterations']} iterations of {r0['samples_per_iteration']} samples; evaluations "
            f"at iterations {[int(p['iteration']) for p in r0['curve']]}."
        )
    if runs and "config" in runs[0]:
        ev = runs[0]["config"]["evaluation"]
        images = ev["max_prompts"] * ev["group_size"]
        out.append(
            f"Held-out evaluation: the first {ev['max_prompts']} test prompts x {ev['group_size']} samples = {images} "
            f"images, {ev['num_steps']} Euler steps. With so few images a difference below about "
            f"{2 * (0.25 / images) ** 0.5:.2f} in GenEval credit (two binomial standard errors at p = 0.5) is within "
            "noise; the seeds help."
        )
    runs_s = sum(r["wall_s"] for r in runs)
    out.append(
        f"Runs done: {len(done)} of {len(planned) or len(done)}; their wall times sum to {runs_s / 60:.1f} min "
        "(training, evaluations and loading; process start-up adds about 10 s a run)."
    )
    if grid_s is not None and grid_s > 60:
        out.append(f"This invocation took {grid_s / 60:.1f} min.")
    if missing:
        out += ["", f"Not run yet ({len(missing)}; the command resumes the grid): " + ", ".join(missing)]
    by_group: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        s = r["spec"]
        if s["group"] == "methods":
            by_group[(s["reward"], s["method"])].append(r)
    for reward in ("geneval", "preference"):
        methods = {m: by_group[(reward, m)] for m in METHODS if by_group.get((reward, m))}
        if not methods:
            continue
        key = HELD_OUT[reward]
        curves = {m: mean_curve(rs, key) for m, rs in methods.items()}
        out += ["", f"## Reward: {reward} (held-out `{key}`)", ""]
        out += [
            "| method | seeds | start | final (mean +- sd) | best | collapsed | s/iteration (rollout / reward / "
            "prepare / update) | NFE/iteration | grad steps | peak RSS MB |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for m, rs in methods.items():
            finals = [r["curve"][-1][key] for r in rs]
            sd = statistics.stdev(finals) if len(finals) > 1 else float("nan")
            split = [
                statistics.mean(r["time_split_s"][k] for r in rs)
                for k in ("total", "rollout", "reward", "prepare", "update")
            ]
            nfe_it = statistics.mean(r["curve"][-1]["nfe"] / r["iterations"] for r in rs)
            out.append(
                f"| {LABELS[m]} | {len(rs)} | {_fmt(statistics.mean(r['curve'][0][key] for r in rs))} | "
                f"{_fmt(statistics.mean(finals))} +- {_fmt(sd)} | {_fmt(max(p['mean'] for p in curves[m]))} | "
                f"{sum(collapsed(r) for r in rs)}/{len(rs)} | {split[0]:.1f} ({split[1]:.1f} / {split[2]:.1f} / "
                f"{split[3]:.1f} / {split[4]:.1f}) | {nfe_it:.0f} | {rs[0]['curve'][-1]['gradient_steps']:.0f} | "
                f"{statistics.mean(r['peak_rss_mb'] for r in rs):.0f} |"
            )
        for axis in ("train_s", "gradient_steps", "nfe"):
            name = f"{reward}-vs-{axis}.png"
            _plot(curves, axis, key, docs / name, f"{reward}: held-out {key} (band: min..max over seeds)")
            out.append(f"\n![{reward} vs {axis}]({name})")
        out += ["", "Targets (evaluation points only, no interpolation; mean over seeds):", *_targets(curves)]
        out += ["", _diagnosis(methods, curves, key)]
        naive, v = methods.get("naive_elbo"), methods.get("vgrpo")
        if naive and v:
            out += [
                "",
                "Surrogate variance (paper, FLUX: overall CV 0.230 -> 0.128, within-group 0.170 -> 0.038, "
                "naive -> V-GRPO), mean over iterations and seeds:",
                "",
                "| | overall CV | within-group CV |",
                "|---|---|---|",
            ]
            for label, rs in (("naive ELBO-GRPO", naive), ("V-GRPO", v)):
                out.append(
                    f"| {label} | {_fmt(statistics.mean(r['surrogate_cv'] for r in rs))} | "
                    f"{_fmt(statistics.mean(r['surrogate_cv_within_group'] for r in rs))} |"
                )
    sweep = [
        r
        for r in runs
        if r["spec"]["group"] in ("lr_sweep", "methods") and r["spec"]["seed"] == 0 and r["spec"]["reward"] == "geneval"
    ]
    if any(r["spec"]["group"] == "lr_sweep" for r in sweep):
        scales = sorted({r["spec"]["lr_scale"] for r in sweep})
        out += [
            "",
            "## Learning-rate sweep (GenEval, seed 0): final held-out partial credit",
            "",
            "| method | " + " | ".join(f"lr x{s:g}" for s in scales) + " |",
            "|---|" + "---|" * len(scales),
        ]
        for m in METHODS:
            cells = []
            for s in scales:
                r = next((r for r in sweep if r["spec"]["method"] == m and r["spec"]["lr_scale"] == s), None)
                cells.append("-" if r is None else f"{r['curve'][-1]['geneval_partial']:.3f} ({r['lr']:.1e})")
            out.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |")
    ablation = [r for r in runs if r["spec"]["group"] == "ablation"]
    if ablation:
        out += [
            "",
            "## Ablations (V-GRPO, GenEval, seed 0)",
            "",
            "| variant | start | final partial | final strict | overall CV | within-group CV | collapsed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in ablation:
            c = r["curve"]
            out.append(
                f"| {r['spec']['variant']} | {_fmt(c[0]['geneval_partial'])} | {_fmt(c[-1]['geneval_partial'])} | "
                f"{_fmt(c[-1]['geneval_strict'])} | {_fmt(r['surrogate_cv'])} | "
                f"{_fmt(r['surrogate_cv_within_group'])} | {'yes' if collapsed(r) else 'no'} |"
            )
    out += [
        "",
        "Collapse: the final held-out reward below half its start (GenEval partial credit) or more than 1.0 "
        "below it (PickScore), or any iteration skipped for NaN/Inf. The raw records are in `runs.jsonl`.",
    ]
    (docs / "README.md").write_text("\n".join(out) + "\n")


def log_to_mlflow(folder: Path, uri: str, experiment: str = "vgrpo-bench") -> list[str]:
    """One MLflow run per record in ``folder`` (idempotent: a run already logged under its name is skipped):
    the spec and the resolved stage config as params, the held-out curve as metrics at each evaluated iteration,
    and the time split, NFE, peak memory and surrogate CV as final metrics. Returns the new run ids."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mlflow import MlflowClient

    from tasks.tracking import end_run, log_metrics, log_params, start_run

    client = MlflowClient(uri)
    known = client.get_experiment_by_name(experiment)
    logged = set()
    if known is not None:
        logged = {r.info.run_name for r in client.search_runs([known.experiment_id], max_results=10_000)}
    new = []
    for run in load_runs(folder):
        if run["name"] in logged:
            continue
        spec = run["spec"]
        tags = {"vgrpo.bench.group": spec["group"], "vgrpo.bench.method": spec["method"],
                "vgrpo.bench.reward": spec["reward"], "vgrpo.bench.variant": spec["variant"]}  # fmt: skip
        run_id = start_run(client, experiment, run["name"], tags=tags)
        log_params(client, run_id, {"spec": spec, "lr": run["lr"], "config": run.get("config", {})})
        for point in run["curve"]:
            log_metrics(client, run_id, {f"held_out/{k}": v for k, v in point.items() if k != "iteration"},
                        step=int(point["iteration"]))  # fmt: skip
        final = {f"time/{k}_s": v for k, v in run["time_split_s"].items() if v is not None}
        final |= {"peak_rss_mb": run["peak_rss_mb"], "skipped_iterations": float(run["skipped_iterations"]),
                  "collapsed": float(collapsed(run)), "wall_s": run["wall_s"]}  # fmt: skip
        final |= {k: run[k] for k in ("surrogate_cv", "surrogate_cv_within_group") if run.get(k) is not None}
        log_metrics(client, run_id, final, step=run["iterations"])
        end_run(client, run_id)
        new.append(run_id)
    return new


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the records folder of benchmarks/compare.py")
    parser.add_argument("docs", type=Path, help="where the page and plots go")
    parser.add_argument("--mlflow", help="also log every record as an MLflow run to this tracking URI")
    args = parser.parse_args()
    write_report(args.runs, args.docs, command="python benchmarks/compare.py (see runs.jsonl)")
    if args.mlflow:
        print(f"{len(log_to_mlflow(args.runs, args.mlflow))} runs logged to {args.mlflow}")
