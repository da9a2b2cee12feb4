"""Every class of bad input is refused before any compute, through the command line and through the Python API
alike: exit status 2 (a :class:`vgrpo.errors.UserError` from :class:`vgrpo.trainer.Trainer`), one message naming
the key or file, no traceback, nothing written under ``--out`` or the work folder, and the base pipeline and the
starting adapter byte for byte as they were (docs/reliability.md, "Refusals")."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file, save_file

from tests.tiny_world import tiny_stage_config, write_tiny_world
from vgrpo.checkpoints.state import LORA_FILE
from vgrpo.cli import main
from vgrpo.errors import UserError
from vgrpo.trainer import Trainer

BOMB = "\n".join(
    [
        'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]',
        *(f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)),
    ]
)
"""Nine lines that expand to 10**9 strings."""


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny world, a rank-4 adapter trained on it (``init``), the same adapter padded to rank 8 (``rank8``), a
    corrupt adapter, a reward module that does not compile and one that raises on import, and the params file."""
    root = write_tiny_world(tmp_path_factory.mktemp("refusals"))
    stage = tiny_stage_config(iterations=1, eval_prompts=None).model_dump(mode="json") | {"pipeline": "base"}
    (root / "stage.yaml").write_text(yaml.safe_dump(stage))
    Trainer.from_params(root / "stage.yaml", work_dir=root / "init-work", out_dir=root / "init", root=root).train()
    (root / "rank8").mkdir()
    padded = {}
    for name, tensor in load_file(root / "init" / LORA_FILE).items():
        dim = 0 if ".lora_A." in name else 1
        padded[name] = tensor.repeat_interleave(2, dim=dim)
    save_file(padded, root / "rank8" / LORA_FILE)
    (root / "corrupt").mkdir()
    (root / "corrupt" / LORA_FILE).write_bytes((root / "init" / LORA_FILE).read_bytes()[:200])
    (root / "rewards_syntax.py").write_text("def brightness(images, prompts, metadata:\n    return 0\n")
    (root / "rewards_raises.py").write_text("raise RuntimeError('needs a GPU')\n")
    (root / "rewards_signatures.py").write_text(
        "from vgrpo.rewards.base import Reward\n\n"
        "def per_image(image):\n    return 0.0\n\n"
        "def trl_style(completions, prompts, channel=0):\n    return [0.0] * len(completions)\n\n"
        "class Half(Reward):\n    name = 'half'\n"
    )
    (root / "bomb.yaml").write_text(BOMB + "\n")
    (root / "twice.yaml").write_text("rollout:\n  group_size: 4\noptim:\n  lr: 1.0e-3\nrollout:\n  num_steps: 3\n")
    (root / "nested_twice.yaml").write_text("optim:\n  lr: 1.0e-3\n  lr: 1.0e-2\n")
    (root / "a_file").write_text("not a folder\n")
    return root


Case = tuple[str, dict[str, Any], dict[str, str], list[str]]
"""(id, overrides of the stage's params, what the run is given (out, work, init, pipeline, params), what the
message names)."""

CASES: list[Case] = [
    # data loss: an output that is an input
    ("out is the pipeline", {}, {"out": "base"}, ["--out", "base", "is an input", "pipeline"]),
    ("out is the starting adapter", {}, {"out": "init", "init": "init"}, ["--out", "init", "starting adapter"]),
    ("out contains the pipeline", {}, {"out": "."}, ["contains an input", "pipeline"]),
    ("work dir is the pipeline", {}, {"work": "base"}, ["--work-dir", "base", "is an input"]),
    ("out inside the pipeline", {}, {"out": "base/lora"}, ["lies inside an input", "pipeline"]),
    ("out is the work dir", {}, {"out": "w", "work": "w"}, ["overlap"]),
    ("out is the prompt file", {}, {"out": "train.jsonl"}, ["train.jsonl", "is an input", "prompts"]),
    # hangs and unbounded work
    ("alias bomb", {}, {"params": "bomb.yaml"}, ["bomb.yaml", "100,000 values"]),
    ("a billion steps", {"rollout": {"num_steps": 10**9}}, {}, ["rollout.num_steps", "less than or equal to 1000"]),
    ("huge group", {"rollout": {"group_size": 10**6}}, {}, ["rollout.group_size", "1024"]),
    ("huge batch", {"rollout": {"prompts_per_iteration": 4096, "group_size": 1024}}, {}, ["65,536"]),
    ("huge resolution", {"rollout": {"resolution": 10**6}}, {}, ["rollout.resolution", "8192"]),
    ("a trillion iterations", {"iterations": 10**12}, {}, ["iterations", "100000"]),
    ("huge N_MC", {"algorithm": {"name": "vgrpo", "n_mc": 10**6}}, {}, ["n_mc", "256"]),
    ("NaN learning rate", {"optim": {"lr": float("nan")}}, {}, ["optim.lr", "finite"]),
    # found after compute before: image sides, output folders
    (
        "evaluation resolution too large",
        {"eval_prompts": "test.jsonl", "evaluation": {"resolution": 64}},
        {},
        [
            "evaluation.resolution",
            "64 px",
            "pos_embed_max_size",
        ],
    ),
    (
        "rollout resolution off the patch grid",
        {"rollout": {"resolution": 14}},
        {},
        [
            "rollout.resolution",
            "not a multiple of 4",
        ],
    ),
    ("work dir under a file", {}, {"work": "a_file/work"}, ["a_file", "is a file"]),
    ("out under a file", {}, {"out": "a_file/out"}, ["a_file", "is a file"]),
    # silent acceptance
    ("a section twice", {}, {"params": "twice.yaml"}, ["twice.yaml", "line 5", "'rollout' is set twice"]),
    ("a nested key twice", {}, {"params": "nested_twice.yaml"}, ["nested_twice.yaml", "'optim.lr' is set twice"]),
    # raw tracebacks that named nothing
    (
        "reward module does not compile",
        {"rewards": [{"name": "rewards_syntax:brightness"}]},
        {},
        [
            "rewards_syntax",
            "SyntaxError",
            "line 1",
        ],
    ),
    (
        "reward module raises on import",
        {"rewards": [{"name": "rewards_raises:brightness"}]},
        {},
        [
            "rewards_raises",
            "RuntimeError: needs a GPU",
        ],
    ),
    (
        "reward function of no known signature",
        {"rewards": [{"name": "rewards_signatures:per_image"}]},
        {},
        ["rewards_signatures:per_image", "not a reward function", "fn(completions, **kwargs) -> list[float]"],
    ),
    (
        "abstract reward class",
        {"rewards": [{"name": "rewards_signatures:Half"}]},
        {},
        ["rewards_signatures:Half", "class Half cannot be built: it is abstract (score() not implemented)"],
    ),
    (
        "trl reward function with a misspelt option",
        {"rewards": [{"name": "rewards_signatures:trl_style", "options": {"chanel": 1}}]},
        {},
        ["rewards_signatures:trl_style", "options ['chanel']"],
    ),
    ("starting adapter of another rank", {}, {"init": "rank8"}, ["rank8", "rank 8", "lora.rank is 4"]),
    (
        "starting adapter of other layers",
        {"lora": {"rank": 4, "alpha": 8, "target_modules": ["to_q"]}},
        {"init": "init"},
        ["init", "does not name"],
    ),
    (
        "a LoRA target that names nothing",
        {"lora": {"rank": 4, "alpha": 8, "target_modules": ["to_qq"]}},
        {},
        [
            "lora.target_modules",
            "to_qq",
        ],
    ),
    ("corrupt starting adapter", {}, {"init": "corrupt"}, ["corrupt", LORA_FILE, "does not open"]),
    ("unknown GenEval colour", {"prompts": "mauve.jsonl"}, {}, ["mauve.jsonl", "mauve"]),
    ("a prompt tag no prompt has", {"prompt_tags": ["counting", "colour"]}, {}, ["prompt_tags ['colour']"]),
    (
        "a tag weight for no prompt",
        {"prompt_tags": ["counting"], "prompt_tag_weights": {"counting": 1.0, "colors": 1.0}},
        {},
        ["prompt_tag_weights", "['colors']"],
    ),
]


@pytest.fixture(scope="module")
def mauve(world: Path) -> Path:
    row = {"prompt": "a photo of a mauve square", "tag": "color_attr", "include": [{"class": "square", "count": 1}]}
    row["include"][0]["color"] = "mauve"
    (world / "mauve.jsonl").write_text(json.dumps(row) + "\n")
    return world


def _params(world: Path, tmp_path: Path, overrides: dict[str, Any], given: dict[str, str]) -> list[Path]:
    stage = yaml.safe_load((world / "stage.yaml").read_text())
    for key, value in overrides.items():
        stage[key] = value
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    return [tmp_path / "stage.yaml", *([world / given["params"]] if "params" in given else [])]


def _paths(world: Path, tmp_path: Path, given: dict[str, str]) -> dict[str, Path]:
    def at(key: str, default: Path) -> Path:
        return world / given[key] if key in given else default

    return {"out": at("out", tmp_path / "out"), "work": at("work", tmp_path / "work")}


def _unchanged(world: Path, run: Callable[[], None], written: list[Path]) -> None:
    before = {name: _digest(world / name) for name in ("base", "init", "rank8")}
    prompts = (world / "train.jsonl").read_bytes()
    existed = {p: p.exists() for p in written}
    run()
    assert {name: _digest(world / name) for name in before} == before
    assert (world / "train.jsonl").read_bytes() == prompts
    for path, was in existed.items():
        if not was:
            assert not path.exists(), f"{path} was written"
    assert not list(world.glob(".*.tmp-*")) and not list(world.glob(".vgrpo-write-check-*"))


@dataclass
class Refusal:
    """One of :data:`CASES` set up in the world: the params files, the output and work folders the run is given
    (neither exists), the starting adapter it names (if any) and what the message must name."""

    params: list[Path]
    out: Path
    work: Path
    init: str | None
    named: list[str]


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def refusal(
    request: pytest.FixtureRequest, world: Path, mauve: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Refusal:
    """The case, run from inside the world (its reward modules importable, its folders relative)."""
    _, overrides, given, named = request.param
    monkeypatch.syspath_prepend(str(world))
    monkeypatch.chdir(world)
    paths = _paths(world, tmp_path, given)
    return Refusal(_params(world, tmp_path, overrides, given), paths["out"], paths["work"], given.get("init"), named)


def test_the_cli_refuses_before_any_compute(world: Path, refusal: Refusal, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--params", *map(str, refusal.params), "--root", str(world)]
    argv += ["--out", str(refusal.out), "--work-dir", str(refusal.work)]
    argv += ["--init-lora", refusal.init] if refusal.init is not None else []
    codes: list[int] = []
    _unchanged(world, lambda: codes.append(main(argv)), [refusal.out, refusal.work])
    err = capsys.readouterr().err
    assert codes == [2], err
    assert "Traceback" not in err and err.startswith("error: "), err
    for part in refusal.named:
        assert part in err, (part, err)


def test_the_trainer_refuses_what_the_cli_refuses(world: Path, refusal: Refusal) -> None:
    init = Path(refusal.init) if refusal.init is not None else None
    messages: list[str] = []

    def train() -> None:
        with pytest.raises(UserError) as caught:
            Trainer.from_params(
                *refusal.params, work_dir=refusal.work, out_dir=refusal.out, init_lora=init, root=world
            ).train()
        messages.append(str(caught.value))

    _unchanged(world, train, [refusal.out, refusal.work])
    labels = {"--out": "out_dir", "--work-dir": "work_dir"}
    for part in refusal.named:
        assert labels.get(part, part) in messages[0], (part, messages[0])


EXPORTS = [
    ("scale NaN", ["--scale", "nan"], "merged", ["LoRA scale nan", "finite"]),
    ("scale infinite", ["--scale", "inf"], "merged", ["LoRA scale inf"]),
    ("scale absurd", ["--scale", "1e6"], "merged", ["at most 16"]),
    ("out is the pipeline", [], "base", ["--out", "is an input (pipeline)"]),
    ("out is the adapter", [], "init", ["--out", "is an input (--lora adapter)"]),
    ("out inside the pipeline", [], "base/merged", ["lies inside an input (pipeline"]),
    ("an adapter of another model", ["--lora", "rank8-other"], "merged", ["rank8-other", "does not fit"]),
]


@pytest.fixture(scope="module")
def other_model_adapter(world: Path) -> Path:
    """An adapter whose layers have other widths than the tiny pipeline's."""
    (world / "rank8-other").mkdir(exist_ok=True)
    tensors = {
        k: v.repeat_interleave(2, dim=1 if ".lora_A." in k else 0)
        for k, v in load_file(world / "init" / LORA_FILE).items()
    }
    save_file(tensors, world / "rank8-other" / LORA_FILE)
    return world


@pytest.mark.parametrize(("case", "extra", "out", "named"), EXPORTS, ids=[c[0] for c in EXPORTS])
def test_export_refuses_before_loading(
    world: Path,
    other_model_adapter: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    extra: list[str],
    out: str,
    named: list[str],
) -> None:
    monkeypatch.chdir(world)
    lora = ["--lora", "init"] if "--lora" not in extra else []
    codes: list[int] = []
    _unchanged(world, lambda: codes.append(main(["export", "base", *lora, *extra, "--out", out])), [world / "merged"])
    err = capsys.readouterr().err
    assert codes == [2] and "Traceback" not in err, err
    for part in named:
        assert part in err, (part, err)


def test_trainer_export_refuses_the_same(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(world)
    trainer = Trainer.from_params(
        world / "stage.yaml", work_dir=world / "init-work", out_dir=world / "init", root=world
    )
    for target, scale, named in [("base", 1.0, "is an input (pipeline)"), ("merged", float("nan"), "not a finite")]:
        with pytest.raises(UserError, match=named.replace("(", r"\(").replace(")", r"\)")):
            _unchanged(
                world, lambda t=target, s=scale: trainer.export(t, merged=True, lora_scale=s), [world / "merged"]
            )
    assert not (world / "merged").exists()


def test_a_merge_that_gives_nan_writes_nothing(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter holding a NaN merges to NaN weights: the export stops before publishing, naming the tensors."""
    monkeypatch.chdir(world)
    (world / "nan-adapter").mkdir(exist_ok=True)
    tensors = load_file(world / "init" / LORA_FILE)
    first = sorted(k for k in tensors if ".lora_B." in k)[0]
    tensors[first][0, 0] = float("nan")
    save_file(tensors, world / "nan-adapter" / LORA_FILE)
    assert main(["export", "base", "--lora", "nan-adapter", "--out", "merged-nan"]) == 2
    assert not (world / "merged-nan").exists() and not list(world.glob(".merged-nan.tmp-*"))


def test_evaluate_refuses_outputs_over_inputs(
    world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(world)
    params = world / "eval.yaml"
    params.write_text(
        yaml.safe_dump({"evaluation": {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}]}})
    )
    before = (world / "test.jsonl").read_bytes()
    base = ["evaluate", "base", "--params", str(params), "--prompts", "test.jsonl"]
    assert main([*base, "--out", "test.jsonl"]) == 2
    assert "--out test.jsonl is an input (--prompts)" in capsys.readouterr().err
    assert main([*base, "--out", "r.json", "--set", "resolution=64"]) == 2
    assert "resolution: 64 px is larger than 16 px" in capsys.readouterr().err
    assert (world / "test.jsonl").read_bytes() == before and not (world / "r.json").exists()


def _break_newest_state(work: Path) -> Path:
    """Drop ``history`` from the newest checkpoint's ``state.json`` (a checkpoint written by a buggy or older tool)."""
    newest = max((work / "checkpoints").glob("iter-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((newest / "state.json").read_text())
    del state["history"]
    (newest / "state.json").write_text(json.dumps(state))
    return newest


def test_a_checkpoint_that_does_not_parse_is_set_aside_by_the_cli(
    world: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(world)
    (tmp_path / "stage.yaml").write_text(
        yaml.safe_dump(yaml.safe_load((world / "stage.yaml").read_text()) | {"iterations": 2})
    )
    argv = [
        "train",
        "--params",
        str(tmp_path / "stage.yaml"),
        "--root",
        str(world),
        "--work-dir",
        str(tmp_path / "work"),
    ]
    assert main([*argv, "--out", str(tmp_path / "first")]) == 0
    broken = _break_newest_state(tmp_path / "work")
    capsys.readouterr()
    code = main([*argv, "--out", str(tmp_path / "second"), "--metrics", str(tmp_path / "m.json")])
    assert "state.json: no field 'history'" in caplog.text  # on stderr outside pytest: tests/test_console_warnings.py
    assert code == 0 and "Traceback" not in capsys.readouterr().err
    assert json.loads((tmp_path / "m.json").read_text())["resumed_from"] == 1
    assert broken.exists() and list((tmp_path / "work" / "checkpoints").glob(".corrupt-iter-2*"))  # set aside, redone


def test_a_checkpoint_that_does_not_parse_is_set_aside_by_the_trainer(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(world)

    def trainer(out: str) -> Trainer:
        overrides = {"iterations": 2}
        return Trainer.from_params(
            world / "stage.yaml", overrides=overrides, work_dir=tmp_path / "work", out_dir=tmp_path / out, root=world
        )

    trainer("first").train()
    _break_newest_state(tmp_path / "work")
    with caplog.at_level(logging.WARNING, logger="vgrpo"):
        assert trainer("second").train().resumed_from == 1
    assert "state.json: no field 'history'" in caplog.text


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "curriculum",
    sorted(
        str(p.relative_to(REPO / "params"))
        for folder in ("curricula", "experiments/curricula")
        for p in (REPO / "params" / folder).glob("*.yaml")
    ),
)
def test_the_bounds_leave_every_shipped_recipe_loading(curriculum: str) -> None:
    """Every curriculum, with every algorithm preset and every ablation merged after each stage, still loads: the
    bounds stop typos, not the papers' SD3.5-M and FLUX.1-dev recipes."""
    from vgrpo.config import load_curriculum

    extras = [
        None,
        *sorted((REPO / "params" / "algorithms").glob("*.yaml")),
        *sorted((REPO / "params" / "ablations").glob("*.yaml")),
    ]
    from vgrpo.errors import ConfigError

    for extra in extras:
        try:
            _, stages = load_curriculum(REPO / "params" / curriculum, root=REPO, extra=[extra] if extra else [])
        except ConfigError as exc:  # a preset written for SD3.5's grid on another family: refused by a cross-check
            assert extra is not None and Path(curriculum).name in OTHER_GRIDS, exc
            assert any(reason in str(exc) for reason in OTHER_GRIDS[Path(curriculum).name]), exc
            continue
        assert stages and all(s.rollout.prompts_per_iteration * s.rollout.group_size <= 65_536 for s in stages)


OTHER_GRIDS = {
    "flux-kontext.yaml": (
        "schedule: diffusers is the SD3 pipeline's static-shift schedule",
        "algorithm.n_mc=8 stratified timesteps need rollout.num_steps >= n_mc (got 6)",
    ),
    "qwen-image.yaml": ("schedule: diffusers is the SD3 pipeline's static-shift schedule",),
    "flux2.yaml": ("schedule: diffusers is the SD3 pipeline's static-shift schedule",),
    "z-image.yaml": ("algorithm.n_mc=8 stratified timesteps need rollout.num_steps >= n_mc (got 6)",),
    # replay weighs V-GRPO's reference KL: a preset of another algorithm, or one without that KL, is refused over it
    "embedded-validation-kl3-ocr-replay.yaml": ("replay: weights",),
    "embedded-validation-kl3-ocr-replay-180.yaml": ("replay: weights",),
    "embedded-validation-kl3-ocr-replay-ema.yaml": ("replay: weights",),
    "embedded-validation-kl3-ocr-replay-180-lr2.5e-4.yaml": ("replay: weights",),
    "embedded-validation-kl3-ocr-replay-180-lr1e-3.yaml": ("replay: weights",),
    "embedded-validation-kl3-ocr-replay-300.yaml": ("replay: weights",),
    "embedded-validation-kl3-tagged-ocr-replay-180.yaml": ("replay: weights",),
    # a DiffusionNFT stage 5: V-GRPO's ablations set fields DiffusionNFT has not (prediction, share, self_normalize)
    "embedded-validation-kl3-ocr-nft-180.yaml": tuple(
        f"algorithm.diffusion_nft.{field}: Extra inputs are not permitted"
        for field in ("prediction", "share", "self_normalize")
    ),
}
"""Curricula of families whose own grid some presets do not fit (a dynamic shift; 6 rollout steps), with the
cross-check that refuses the combination: not a bound."""


def test_an_output_over_a_params_file_is_refused(
    world: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--metrics`` (train) or ``--out`` (evaluate) naming a params file the command read would overwrite it."""
    monkeypatch.chdir(world)
    params = tmp_path / "stage.yaml"
    params.write_text((world / "stage.yaml").read_text())
    before = params.read_bytes()
    argv = ["train", "--params", str(params), "--root", str(world), "--out", str(tmp_path / "o"), "--work-dir", "w"]
    assert main([*argv, "--metrics", str(params)]) == 2
    assert f"--metrics {params} is an input (--params {params})" in capsys.readouterr().err
    assert params.read_bytes() == before and not (tmp_path / "o").exists()
