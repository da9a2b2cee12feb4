from pathlib import Path

import pytest

from vgrpo.algorithms.config import MixGRPOConfig, NaiveELBOConfig, VGRPOConfig
from vgrpo.config import TrainConfig, load_config
from vgrpo.errors import ConfigError

PARAMS = Path(__file__).resolve().parents[1] / "params"


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_are_the_papers_sd35_stage_one_controls():
    config = TrainConfig()
    algo = config.algorithm
    assert isinstance(algo, VGRPOConfig)
    assert (algo.n_mc, algo.share, algo.timestep_sampling, algo.prediction) == (4, "batch", "stratified", "x")
    assert algo.self_normalize and algo.clip_range is None and algo.kl_coef == 0.0
    assert config.advantage.soft_clip_eta == 3.0 and config.optim.gradient_steps == 1
    assert config.lora is not None and (config.lora.rank, config.lora.alpha) == (32, 64)
    assert config.optim.lr == 3e-4 and config.optim.weight_decay == 1e-4


def test_unknown_key_is_an_error_naming_file_and_key(tmp_path):
    path = _write(tmp_path, "algorithm:\n  name: vgrpo\n  n_mcc: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config([path])
    assert str(path) in str(err.value) and "algorithm.vgrpo.n_mcc" in str(err.value)


def test_mistyped_value_is_an_error_naming_the_key(tmp_path):
    path = _write(tmp_path, "rollout:\n  group_size: eight\n")
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config([path])


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("rollout:\n  group_size: 1\n", "rollout.group_size"),
        ("algorithm:\n  name: vgrpo\n  n_mc: 0\n", "n_mc"),
        ("algorithm:\n  name: vgrpo\n  clip_range: 0\n", "clip_range"),
        ("algorithm:\n  name: ppo\n", "algorithm"),
        ("optim:\n  minibatches: 5\n", "minibatches"),
        ("rollout:\n  num_steps: 3\nalgorithm:\n  name: vgrpo\n  n_mc: 4\n", "n_mc"),
        ("- just\n- a list\n", "mapping"),
        ("rollout: [unclosed\n", "not valid YAML"),
    ],
)
def test_impossible_values_are_rejected_with_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError, match=key):
        load_config([_write(tmp_path, text)])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: params file not found"):
        load_config([tmp_path / "nope.yaml"])


def test_later_files_and_overrides_win_and_algorithm_switch_drops_old_keys(tmp_path):
    base = _write(tmp_path, "seed: 1\nalgorithm:\n  name: vgrpo\n  n_mc: 8\n", "a.yaml")
    preset = _write(tmp_path, "algorithm:\n  name: mixgrpo\n  window_size: 2\n", "b.yaml")
    config = load_config([base, preset], {"seed": 5})
    assert config.seed == 5
    assert isinstance(config.algorithm, MixGRPOConfig) and config.algorithm.window_size == 2


def test_configs_are_frozen():
    config = TrainConfig()
    with pytest.raises(Exception, match="frozen"):
        config.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize("preset", sorted((PARAMS / "algorithms").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_presets_load(preset):
    config = load_config([PARAMS / "base.yaml", preset])
    assert config.algorithm.name == preset.stem


def test_naive_preset_is_vgrpo_with_techniques_off():
    config = load_config([PARAMS / "base.yaml", PARAMS / "algorithms" / "naive_elbo.yaml"])
    assert isinstance(config.algorithm, NaiveELBOConfig)
    assert config.algorithm.share == "none" and not config.algorithm.self_normalize


@pytest.mark.parametrize("module", ["vgrpo.config", "vgrpo.algorithms.config", "vgrpo.world.config"])
def test_config_modules_import_first_in_a_fresh_process(module):
    """vgrpo.config imports the configs beside their readers (vgrpo.algorithms.config runs the algorithms
    package's __init__): no import order may meet a half-initialised module."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _leaves(raw: dict, prefix: str = ""):
    for key, value in raw.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize(
    ("file", "section", "schema"),
    [("pretrain.yaml", "pretrain", "PretrainConfig"), ("rewards.yaml", None, "WorldRewardModelsConfig")],
)
def test_world_params_load_with_every_value_they_spell(file, section, schema):
    """The world's optimiser fields come from the shared AdamWConfig; the files keep their flat keys and values."""
    import yaml

    from vgrpo.training.optim import AdamWConfig
    from vgrpo.world import config as world_config

    path = PARAMS / "embedded" / file
    config = load_config([path], section=section, schema=getattr(world_config, schema))
    raw = yaml.safe_load(path.read_text())
    raw = raw[section] if section else raw
    dumped = config.model_dump(mode="json")
    for dotted, value in _leaves(raw):
        node = dumped
        for key in dotted.split("."):
            node = node[key]
        assert node == value, dotted
    jobs = [config, config.vae] if section else [config.world_clip, config.world_pickscore]
    assert all(isinstance(job, AdamWConfig) for job in jobs)


def test_world_optimiser_keys_reject_bad_values_and_unknown_keys(tmp_path):
    from vgrpo.world.config import PretrainConfig

    for text, key in [
        ("pretrain:\n  lr: 0\n", "lr"),
        ("pretrain:\n  vae:\n    weight_decay: -1\n", "vae.weight_decay"),
        ("pretrain:\n  vae:\n    momentum: 0.9\n", "vae.momentum"),
    ]:
        with pytest.raises(ConfigError, match=key):
            load_config([_write(tmp_path, text)], section="pretrain", schema=PretrainConfig)


def test_params_expand_only_the_projects_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vgrpo.config import read_params

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG")
    monkeypatch.setenv("VGRPO_MODELS", "/models")
    leak = tmp_path / "leak.yaml"
    leak.write_text("pipeline: s3://bucket/${AWS_SECRET_ACCESS_KEY}\n")
    with pytest.raises(ConfigError, match=r"leak\.yaml: \$\{AWS_SECRET_ACCESS_KEY\}: params may name only VGRPO_\*"):
        read_params(leak)
    ok = tmp_path / "ok.yaml"
    ok.write_text("pipeline: ${VGRPO_MODELS}/sd35\nprompts: ${VGRPO_UNSET_HERE}/p.jsonl\n")
    monkeypatch.delenv("VGRPO_UNSET_HERE", raising=False)
    assert read_params(ok) == {"pipeline": "/models/sd35", "prompts": "${VGRPO_UNSET_HERE}/p.jsonl"}


def test_every_later_option_is_a_field_left_out_only_at_its_own_default() -> None:
    """``FrozenConfig.LATER_OPTIONS``: each listed key is a field of its config with exactly that default, so only
    an unset option is left out of the dump (a typo, or a default moved without the list, would drop a value the
    user set)."""
    import vgrpo.algorithms.config
    import vgrpo.config
    import vgrpo.models.config  # their configs are among FrozenConfig's subclasses below
    from vgrpo.config_base import FrozenConfig

    def subclasses(cls: type) -> list[type]:
        return [c for s in cls.__subclasses__() for c in (s, *subclasses(s))]

    listed = [c for c in subclasses(FrozenConfig) if c.LATER_OPTIONS]
    assert len(listed) >= 5
    for cls in listed:
        for key, default in cls.LATER_OPTIONS.items():
            assert key in cls.model_fields, (cls.__name__, key)
            assert cls.model_fields[key].default == default, (cls.__name__, key)
    stage = vgrpo.config.load_config(
        ["params/base.yaml", "params/models/embedded.yaml", "params/stages/embedded/2-geneval.yaml"],
        {
            "precision": {"merged_lora": True},
            "rollout": {"group_noise": "shared"},
            "algorithm": {"name": "flow_grpo", "timestep_order": "first"},
        },
        schema=vgrpo.config.StageConfig,
    ).model_dump(mode="json")
    assert stage["precision"]["merged_lora"] is True and stage["rollout"]["group_noise"] == "shared"  # set: kept
    assert stage["algorithm"]["timestep_order"] == "first"
    assert "compile" not in stage["precision"] and "hold" not in stage  # unset: left out
