"""The command line: split files, evaluation JSON and grid, and clear errors for bad params, prompt files and
pipeline directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.models.test_embedded import TINY
from vgrpo.cli import main
from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
from vgrpo.world import GENEVAL_TAGS, read_jsonl
from vgrpo.world.cli import main as world_main

PARAMS = Path(__file__).parents[1] / "params" / "embedded" / "pretrain.yaml"
EVAL_PARAMS = PARAMS.with_name("evaluate.yaml")
WORLD_CLIP = Path(__file__).parents[1] / "models" / "world-clip"


def _world_splits(out: Path, *, train: int, test: int) -> int:
    """``python -m vgrpo.world.cli world-splits`` on the embedded pretraining params with ``train`` and ``test``
    prompts, written to ``out``: the exit status."""
    args = ["world-splits", "--params", str(PARAMS), "--set", f"train_prompts={train}", f"test_prompts={test}"]
    return world_main([*args, "--out", str(out)])


def test_world_splits_are_seeded_and_hold_out_pairs(tmp_path: Path) -> None:
    assert _world_splits(tmp_path / "a", train=70, test=35) == 0
    assert _world_splits(tmp_path / "b", train=70, test=35) == 0
    train, test = read_jsonl(tmp_path / "a" / "train.jsonl"), read_jsonl(tmp_path / "a" / "test.jsonl")
    assert len(train) == 70 and len(test) == 35
    assert (tmp_path / "a" / "test.jsonl").read_bytes() == (tmp_path / "b" / "test.jsonl").read_bytes()
    assert {r["tag"] for r in test} == {*GENEVAL_TAGS, "ocr"}
    named = {(c["color"], c["class"]) for r in train for c in r.get("include", []) if "color" in c}
    assert not named & {("red", "triangle"), ("blue", "circle")}


def test_evaluate_writes_the_table_and_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _world_splits(tmp_path / "world", train=1, test=14) == 0
    prompts = [r["prompt"] for r in read_jsonl(tmp_path / "world" / "test.jsonl")]
    pipe = build_pipeline(TINY, train_clip_tokenizer(prompts, TINY))
    pipe.save_pretrained(tmp_path / "pipe")
    out = tmp_path / "eval.json"
    prompts_file = str(tmp_path / "world" / "test.jsonl")
    grid = str(tmp_path / "grid.png")
    code = main(
        [
            "evaluate",
            str(tmp_path / "pipe"),
            "--prompts",
            prompts_file,
            "--out",
            str(out),
            "--grid",
            grid,
            "--images",
            str(tmp_path / "samples"),
            "--params",
            str(EVAL_PARAMS),
            "--set",
            "group_size=2",
            "num_steps=2",
            "rewards=[{name: geneval},{name: ocr}, {name: clipscore, options: {path: " + str(WORLD_CLIP) + "}}]",
        ]
    )
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "samples").iterdir())[:3] == ["00000-0.png", "00000-1.png", "00001-0.png"]
    assert len(list((tmp_path / "samples").iterdir())) == 28
    result = json.loads(out.read_text())
    geneval, ocr = result["rewards"]["geneval"], result["rewards"]["ocr"]
    assert set(geneval["per_tag"]) == set(GENEVAL_TAGS)
    assert result["prompts"] == 14 and result["group_size"] == 2 and ocr["images"] == 4
    assert 0 <= geneval["geneval_strict"] <= 1 and 0 <= ocr["mean"] <= 1
    assert result["rewards"]["clipscore"]["images"] == 28
    assert (tmp_path / "grid.png").stat().st_size > 0
    assert "overall" in capsys.readouterr().out
    assert result["images_dir"] == str(tmp_path / "samples")
    # an edit set from the samples: a counting row's sample GenEval credits gives an edit, the rest drop
    credited = json.loads(out.with_suffix(".scores.json").read_text())["credited"]
    rows = read_jsonl(prompts_file)
    sources = sum(
        r["tag"] == "counting" and mark is True for r, marks in zip(rows, credited, strict=True) for mark in marks
    )
    assert main(["edit-set", "--sources", str(out), "--out", str(tmp_path / "edits")]) == 0
    assert f"{28 - sources} dropped" in capsys.readouterr().out
    written = sum(len(read_jsonl(tmp_path / "edits" / f"{s}.jsonl")) for s in ("train", "validation", "test"))
    assert written == sources

    import torch

    from vgrpo.checkpoints.state import save_lora
    from vgrpo.models import add_lora

    add_lora(pipe.transformer, rank=2, alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    with torch.no_grad():
        for name, param in pipe.transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    save_lora(pipe.transformer, tmp_path / "lora")
    code = main(
        [
            "evaluate",
            str(tmp_path / "pipe"),
            "--lora",
            str(tmp_path / "lora"),
            "--prompts",
            prompts_file,
            "--out",
            str(tmp_path / "lora.json"),
            "--params",
            str(EVAL_PARAMS),
            "--set",
            "group_size=2",
            "num_steps=2",
            "rewards=[{name: clipscore, options: {path: " + str(WORLD_CLIP) + "}}]",
        ]
    )
    adapted = json.loads((tmp_path / "lora.json").read_text())
    assert code == 0 and adapted["lora"] == str(tmp_path / "lora")
    assert adapted["rewards"]["clipscore"]["mean"] != pytest.approx(result["rewards"]["clipscore"]["mean"], abs=1e-6)


def test_bad_inputs_exit_2_naming_the_culprit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert world_main(["world-splits", "--params", str(PARAMS), "--set", "batchsize=3", "--out", str(tmp_path)]) == 2
    assert "batchsize" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("pretrain:\n  model:\n    patch_size: 3\n")
    assert world_main(["world-splits", "--params", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "patch_size" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["evaluate", str(tmp_path), "--prompts", str(empty), "--out", str(tmp_path / "x.json")]) == 2
    assert "prompt file is empty" in capsys.readouterr().err
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"tag": "single_object", "include": [{"class": "ring", "count": 1}], "prompt": "a photo of a ring"}\n'
    )
    assert main(["evaluate", str(tmp_path / "none"), "--prompts", str(good), "--out", str(tmp_path / "x.json")]) == 2
    assert "pipeline directory not found" in capsys.readouterr().err
    lora = ["--lora", str(tmp_path / "no-adapter"), "--prompts", str(good), "--out", str(tmp_path / "x.json")]
    assert main(["evaluate", str(tmp_path), *lora]) == 2
    err = capsys.readouterr().err
    assert "--lora" in err and "no-adapter" in err and "adapter directory not found" in err
    assert "x.json lies inside an input (pipeline" in err  # the pipeline folder here is tmp_path itself


def test_bad_evaluation_params_and_prompt_lines_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"tag": "single_object", "include": [{"class": "ring", "count": 1}], "prompt": "a ring"}\n')
    base = ["evaluate", str(tmp_path), "--params", str(EVAL_PARAMS), "--out", str(tmp_path / "x.json")]
    cases = [
        (["--prompts", str(good), "--set", "rewards=[{name: hps}]"], "unknown reward 'hps'"),
        (["--prompts", str(good), "--set", "p_mix=0.8"], "needs both p_mix and base_pipeline"),
        (["--prompts", str(good), "--set", "rewards=[{name: ocr}, {name: ocr}]"], "used twice"),
        (["--prompts", str(good), "--set", "group_size=0"], "group_size"),
    ]
    for extra, message in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and str(EVAL_PARAMS) in err, err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a ring"}\n{"prompt": \n')
    assert main([*base, "--prompts", str(broken)]) == 2
    assert f"{broken}:2: not valid JSON" in capsys.readouterr().err
    no_prompt = tmp_path / "no_prompt.jsonl"
    no_prompt.write_text('{"tag": "ocr"}\n')
    assert main([*base, "--prompts", str(no_prompt)]) == 2
    assert f"{no_prompt}:1: expected a JSON object with a non-empty string 'prompt'" in capsys.readouterr().err


def test_only_user_errors_exit_2_and_bugs_propagate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One bad-input family: params, prompt files, pipeline and checkpoint errors are UserErrors (keeping their
    builtin bases); any other exception of a command is a bug and keeps its traceback."""
    import argparse

    from vgrpo.checkpoints.state import CheckpointError
    from vgrpo.cli import run_command
    from vgrpo.errors import ConfigError, UserError
    from vgrpo.models.pipeline import PipelineError
    from vgrpo.prompts import PromptFileError

    for error, builtin in [
        (ConfigError, ValueError),
        (PipelineError, ValueError),
        (PromptFileError, ValueError),
        (CheckpointError, RuntimeError),
    ]:
        assert issubclass(error, UserError) and issubclass(error, builtin)

    def fail(exc: Exception):
        def func(_: argparse.Namespace) -> None:
            raise exc

        return argparse.Namespace(func=func)

    assert run_command(fail(CheckpointError("runs/x: incomplete checkpoint"))) == 2
    assert capsys.readouterr().err == "error: runs/x: incomplete checkpoint\n"
    with pytest.raises(ValueError, match="a bug"):
        run_command(fail(ValueError("a bug")))


def test_detector_check_needs_a_split_with_scenes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"tag": "single_object", "include": [{"class": "ring", "count": 1}], "prompt": "a ring"}\n')
    assert world_main(["detector-check", "--prompts", str(rows), "--out", str(tmp_path / "q.json")]) == 2
    assert f"{rows}:1: a record needs its ground-truth 'scene'" in capsys.readouterr().err
    assert _world_splits(tmp_path, train=1, test=28) == 0
    assert (
        world_main(["detector-check", "--prompts", str(tmp_path / "test.jsonl"), "--out", str(tmp_path / "q.json")])
        == 0
    )
    quality = json.loads((tmp_path / "q.json").read_text())
    assert quality["ground_truth"] == 1.0 and quality["pipeline"] is None and quality["images"] > 0


def test_help_shows_each_commands_defaults_and_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    top = capsys.readouterr().out
    assert exit_.value.code == 0 and top.startswith("usage: vgrpo [-h] [-v | -q] {train,evaluate,export,edit-set}")
    assert "examples:\n  vgrpo train --params params/base.yaml" in top and "-v, --verbose" in top
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    train = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal's width
    assert "CPU threads per process (default: 2)" in train
    assert "(default: runs/work)" in train and "(default: .)" in train
    assert "--out OUT the stage's adapter (or full pipeline) directory --work-dir" in train  # required: no default
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "(default: ['params/embedded/evaluate.yaml'])" in " ".join(capsys.readouterr().out.split())


def test_the_command_line_imports_no_torch_until_a_command_runs() -> None:
    """``vgrpo --help`` answers in well under a second: neither torch, diffusers nor transformers is imported
    for it (each is seconds), and it prints no warning."""
    import subprocess
    import sys

    check = (
        "import sys, vgrpo.cli\n"
        "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers', 'mlflow', 'prefect') if m in sys.modules)\n"
        "print(heavy)\n"
        "vgrpo.cli.main(['--help'])\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[]" and "examples:" in done.stdout
    assert done.stderr == ""
