"""One training iteration per case on the tiny SD3 transformer with LoRA, sharded over however many processes
started it; rank 0 writes what the iteration computed (advantages, pairs, old surrogates, updated adapter).

    accelerate launch --config_file configs/accelerate/cpu_2proc.yaml -m tests.distributed_worker OUT.safetensors

``tests/parallel/test_distributed.py`` runs :func:`run_case` in its own process (one rank, the whole batch) and
compares.
With ``--fsdp`` the worker runs the full fine-tuning cases (:data:`FSDP_CASES`) with the transformer sharded by
FSDP instead; ``tests/parallel/test_fsdp.py`` compares them with :func:`run_full_case` in one unsharded process.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from tests.algorithms.helpers import make_config, make_policy
from vgrpo.algorithms import build_algorithm
from vgrpo.algorithms.base import PreparedBatch
from vgrpo.algorithms.diffusion_nft import DiffusionNFTPayload
from vgrpo.algorithms.vgrpo import VGRPOPayload
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning
from vgrpo.parallel.distributed import Distributed, is_sharded
from vgrpo.parallel.fsdp import shard_transformer
from vgrpo.training.iteration import train_iteration
from vgrpo.training.optim import build_optimizer

PROMPT_TEXTS = ["a red circle", "two blue squares", "a green star", "three yellow dots"]
# Rollout micro-batches of one group (G = 3) cut the global batch where the ranks cut it, so every rank's
# forward passes see the same inputs as the single process's and the samples agree bit for bit; the
# update's micro-batches of 4 do not align (6 samples per rank: 4 + 2), which only reorders float sums.
SECTIONS: dict[str, Any] = {
    "rollout": {"prompts_per_iteration": len(PROMPT_TEXTS), "micro_batch_size": 3},
    "optim": {"gradient_steps": 2, "lr": 1e-2, "micro_batch_size": 4},
}
CASES: dict[str, dict[str, Any]] = {
    "vgrpo_batch": {"algorithm": {"name": "vgrpo", "share": "batch", "n_mc": 2}},
    "vgrpo_none": {"algorithm": {"name": "vgrpo", "share": "none", "n_mc": 2, "memory_bounded": False}},
    "diffusion_nft": {"algorithm": {"name": "diffusion_nft", "n_mc": 2}},
    # Per-rank SDE noise and per-rank minibatches: no single-process twin, but every rank must agree.
    "flow_grpo": {"algorithm": {"name": "flow_grpo"}, "optim": {"minibatches": 2}},
}


def toy_reward(samples: Tensor, prompts: object) -> dict[str, Tensor]:
    return {"bright": samples.mean(dim=(1, 2, 3)), "contrast": samples.std(dim=(1, 2, 3))}


def run_case(name: str, dist: Distributed) -> tuple[dict[str, Tensor], dict[str, float]]:
    """One iteration of case ``name``: the global batch's advantages, pairs (``t``, ``eps``, one row per
    pair row of the global batch), old surrogates / old velocities and the updated trainable parameters,
    identical on every rank, plus the iteration's metrics."""
    case = CASES[name]
    config = make_config(
        case["algorithm"], rollout=SECTIONS["rollout"], optim={**SECTIONS["optim"], **case.get("optim", {})}
    )
    policy = make_policy(config)  # seeded: the same weights in every process
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE, dist=dist)
    captured: list[PreparedBatch] = []
    prepare = algorithm.prepare

    def recording_prepare(*args: Any, **kwargs: Any) -> PreparedBatch:
        captured.append(prepare(*args, **kwargs))
        return captured[-1]

    algorithm.prepare = recording_prepare  # type: ignore[method-assign]
    record = train_iteration(
        policy=policy,
        algorithm=algorithm,
        optimizer=build_optimizer(policy, config.optim),
        reward_fn=toy_reward,
        prompts=PROMPT_TEXTS,
        cond=tiny_conditioning(len(PROMPT_TEXTS)),
        config=config,
        latent_shape=TINY_LATENT_SHAPE,
        generator=torch.Generator().manual_seed(0),
        iteration=1,  # DiffusionNFT's EMA decay is 0 at iteration 0
    )
    batch = captured[0]
    out = {"advantages": dist.gather(batch.advantages), "samples": dist.gather(record.samples)}
    if isinstance(batch.payload, VGRPOPayload | DiffusionNFTPayload):
        pairs = batch.payload.pairs  # one row for share=batch (already global), else the ranks' rows in order
        gather = (lambda x: x) if pairs.share == "batch" else dist.gather
        out |= {"pairs_t": gather(pairs.t), "pairs_eps": gather(pairs.eps)}
    tensors = batch.payload.tensors()
    for key in ("old_surrogates", "v_old"):
        if key in tensors:
            out[key] = dist.gather(tensors[key])
    for param_name, p in policy.named_parameters():
        if p.requires_grad:
            value = p.detach()
            # Every rank must hold the same weights after the update: record the largest gap to rank 0's.
            out["param_rank_gap_max"] = torch.maximum(
                out.get("param_rank_gap_max", torch.zeros(())),
                dist.reduce_metrics({"gap_max": (value - dist.broadcast(value)).abs().max().item()})["gap_max"]
                * torch.ones(()),
            )
            out[f"param.{param_name}"] = value.clone()
    metrics = {k: v for k, v in record.metrics.items() if not k.startswith("time/")}
    return {f"{name}/{k}": v.contiguous() for k, v in out.items()}, metrics


# Full fine-tuning (lora: null). A snapshot matters only once it differs from the live weights: from the second
# iteration on (V-GRPO's reference is the starting weights; DiffusionNFT's old policy, with a large EMA decay,
# lags the live one after the first).
FSDP_CASES: dict[str, dict[str, Any]] = {
    "full_vgrpo": {"algorithm": {"name": "vgrpo", "share": "batch", "n_mc": 2}, "iterations": 1},
    "full_vgrpo_ref_kl": {"algorithm": {"name": "vgrpo", "n_mc": 2, "ref_kl_coef": 1.0}, "iterations": 2},
    "full_diffusion_nft": {"algorithm": {"name": "diffusion_nft", "n_mc": 2, "ema_decay_rate": 0.4}, "iterations": 2},
}


def _whole(tensor: Tensor) -> Tensor:
    return tensor.full_tensor() if is_sharded(tensor) else tensor.detach().clone()


def run_full_case(name: str, dist: Distributed) -> dict[str, Tensor]:
    """Case ``name`` of :data:`FSDP_CASES` (iterations 1, 2, ...), the transformer sharded by FSDP when ``dist`` has
    more than one rank: the whole trained weights, every snapshot's, and the velocity of a probe batch with the
    live weights, with each snapshot swapped in, and with the live weights again after the swaps."""
    case = FSDP_CASES[name]
    strategy = "fsdp" if dist.world_size > 1 else "ddp"
    config = make_config(
        case["algorithm"],
        rollout=SECTIONS["rollout"],
        optim=SECTIONS["optim"],
        lora=None,
        distributed={"strategy": strategy},
    )
    policy = make_policy(config)
    if strategy == "fsdp":
        shard_transformer(policy.get_submodule("transformer"), dist)
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE, dist=dist)
    optimizer = build_optimizer(policy, config.optim)
    for iteration in range(1, 1 + case["iterations"]):
        train_iteration(
            policy=policy,
            algorithm=algorithm,
            optimizer=optimizer,
            reward_fn=toy_reward,
            prompts=PROMPT_TEXTS,
            cond=tiny_conditioning(len(PROMPT_TEXTS)),
            config=config,
            latent_shape=TINY_LATENT_SHAPE,
            generator=torch.Generator().manual_seed(iteration),
            iteration=iteration,
        )
    out = {f"param.{n}": _whole(p) for n, p in policy.named_parameters()}
    # What this rank holds: its shards under FSDP, everything in one process.
    held = [p for p in policy.parameters()]
    moments = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, Tensor) and v.ndim]
    for kind, tensors in {
        "params": held,
        "grads": [p.grad for p in held if p.grad is not None],
        "moments": moments,
    }.items():
        out[f"numel.{kind}"] = torch.tensor(sum((t.to_local() if is_sharded(t) else t).numel() for t in tensors))
    g = torch.Generator().manual_seed(5)
    probe = (torch.randn(2, *TINY_LATENT_SHAPE, generator=g), torch.rand(2, generator=g), tiny_conditioning(2, seed=3))
    with torch.no_grad():
        out["probe.live"] = policy(*probe)
        for snap_name, snapshot in algorithm.snapshots().items():
            out |= {f"snapshot.{snap_name}.{i}": _whole(v) for i, v in enumerate(snapshot.values)}
            with snapshot.swapped_in():
                out[f"probe.{snap_name}"] = policy(*probe)
        out["probe.after_swaps"] = policy(*probe)
    return {f"{name}/{k}": v.contiguous() for k, v in out.items()}


def run_stage_worker(argv: list[str]) -> None:
    """``--stage PARAMS WORLD WORK OUT [KILL_AT]``: the stage in ``PARAMS`` on the tiny world's pipeline
    (``WORLD/base``), rank 0 writing ``OUT.json`` (``resumed_from``, the evaluations). With ``KILL_AT = n`` every rank
    SIGKILLs itself once it has written its shards of the n-th checkpoint, before rank 0 publishes it."""
    import os
    import signal
    from pathlib import Path

    import torch.distributed.checkpoint as dcp
    import yaml

    from vgrpo.config import StageConfig
    from vgrpo.training.stage import run_stage

    params, world, work, out, *kill = argv
    if kill:
        save, calls = dcp.save, [0]

        def save_then_die(*args: Any, **kwargs: Any) -> Any:
            result = save(*args, **kwargs)
            calls[0] += 1
            if calls[0] == int(kill[0]):
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        dcp.save = save_then_die
    config = StageConfig.model_validate(yaml.safe_load(Path(params).read_text()))
    result = run_stage(config, pipeline_dir=Path("base"), work_dir=Path(work), out_dir=Path(out), root=Path(world))
    if Distributed.from_environment().is_main:
        summary = {"resumed_from": result.resumed_from, "evaluations": result.evaluations}
        Path(f"{out}.json").write_text(json.dumps(summary, default=str))


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    if argv[0] == "--stage":
        return run_stage_worker(argv[1:])
    dist = Distributed.from_environment()
    tensors: dict[str, Tensor] = {}
    metrics: dict[str, dict[str, float]] = {}
    if argv[0] == "--fsdp":
        argv = argv[1:]
        for name in FSDP_CASES:
            tensors |= run_full_case(name, dist)
    else:
        for name in CASES:
            case_tensors, metrics[name] = run_case(name, dist)
            tensors |= case_tensors
    if dist.is_main:
        save_file(tensors, argv[0], metadata={"metrics": json.dumps(metrics), "world_size": str(dist.world_size)})
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
