"""The optimiser of every training job: AdamW with global-norm gradient clipping, configured by one
:class:`AdamWConfig`.

A job's config inherits its fields flat, so each params section keeps ``lr``, ``weight_decay`` and
``max_grad_norm`` at its own top level: the RL stages under ``optim:`` (:class:`OptimConfig`), the embedded
world's base pretraining under ``pretrain:`` and ``pretrain.vae:``, and its reward models under ``world_clip:`` and
``world_pickscore:`` (:mod:`vgrpo.world.config`). A job restates only the defaults it changes, with the shared
constraints (:data:`LearningRate`, :data:`WeightDecay`). The RL stage may ask for bitsandbytes' 8-bit AdamW
(``optim.optimizer: adamw8bit``: its two moments in 8 bits with blockwise scales, Dettmers et al. 2022,
"8-bit Optimizers via Block-wise Quantization"), a quarter of AdamW's state memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from vgrpo.config_base import MAX_MICRO_BATCH, FrozenConfig
from vgrpo.errors import ConfigError
from vgrpo.parallel.distributed import is_sharded
from vgrpo.policy import trainable_parameters

__all__ = [
    "AdamWConfig",
    "LearningRate",
    "OptimConfig",
    "WeightDecay",
    "build_adamw",
    "build_optimizer",
    "clip_gradients",
]

LearningRate = Annotated[float, Field(gt=0, description="AdamW learning rate.")]
WeightDecay = Annotated[float, Field(ge=0, description="AdamW's decoupled weight decay.")]


class AdamWConfig(FrozenConfig):
    """AdamW's step size and weight decay, and the global-norm clip of the gradients before each step: what every
    training job states of its optimiser."""

    lr: LearningRate = 1e-3
    weight_decay: WeightDecay = 0.0
    max_grad_norm: float | None = Field(1.0, gt=0, description="Global-norm gradient clip; None = off.")


class OptimConfig(AdamWConfig):
    """The RL stage's optimiser (``optim:``): AdamW with its moment settings, plus the steps and minibatches of
    one iteration. The global-norm clip at 1 is [inferred]."""

    optimizer: Literal["adamw", "adamw8bit"] = Field(
        "adamw", description="torch's AdamW, or bitsandbytes' 8-bit AdamW (needs bitsandbytes installed)."
    )
    lr: LearningRate = Field(3e-4, description="AdamW lr (SD3.5 LoRA: 3e-4; FLUX full: 1e-5).")
    weight_decay: WeightDecay = 1e-4
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's decay rates of the two moments.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW's epsilon.")
    gradient_steps: int = Field(
        1, ge=1, le=MAX_MICRO_BATCH, description="Optimizer steps per iteration (SD3.5: 1, FLUX: 4)."
    )
    minibatches: int = Field(
        1,
        ge=1,
        le=MAX_MICRO_BATCH,
        description="Each step uses 1/minibatches of the batch, cycling; 1 = full batch [inferred].",
    )
    micro_batch_size: int = Field(
        16, ge=1, le=MAX_MICRO_BATCH, description="Samples per forward/backward (memory only)."
    )


def build_adamw(
    params: Iterable[Tensor] | Iterable[dict[str, Any]], config: AdamWConfig, **moments: Any
) -> torch.optim.Optimizer:
    """AdamW over ``params`` (tensors, or parameter groups whose own keys override the config's) with the config's
    lr and weight decay; ``moments`` are AdamW's ``betas`` and ``eps`` where a job sets them (else torch's).
    An :class:`OptimConfig` with ``optimizer: adamw8bit`` gets bitsandbytes' ``AdamW8bit`` with the same settings.

    Raises:
        ConfigError: ``adamw8bit`` is asked for and bitsandbytes is not installed.
    """
    if isinstance(config, OptimConfig) and config.optimizer == "adamw8bit":
        return _adamw8bit(params, lr=config.lr, weight_decay=config.weight_decay, **moments)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, **moments)


def build_optimizer(policy: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the policy's trainable parameters (LoRA adapters, or everything)."""
    params = trainable_parameters(policy)
    if not params:
        raise ValueError("the policy has no trainable parameters")
    return build_adamw(params, config, betas=config.betas, eps=config.adam_eps)


def _adamw8bit(params: Iterable[Tensor] | Iterable[dict[str, Any]], **settings: Any) -> torch.optim.Optimizer:
    """bitsandbytes' ``AdamW8bit`` whose ``state_dict`` keeps each parameter's quantisation tensors (the 8-bit
    moments, their block scales and code books) at the top level of its state, as torch's AdamW keeps its moments,
    so a checkpoint (:func:`vgrpo.checkpoints.state.save_training_state`) stores them as tensors. bitsandbytes nests
    them
    under one key to hide them from FSDP1's state gathering; its ``load_state_dict`` reads either form."""
    try:
        import bitsandbytes
    except ImportError as exc:
        raise ConfigError(
            "optim.optimizer: adamw8bit needs the bitsandbytes package, which is not installed here "
            f"({exc}); pip install bitsandbytes, or use optim.optimizer: adamw"
        ) from exc

    class AdamW8bit(bitsandbytes.optim.AdamW8bit):
        def state_dict(self) -> dict[str, Any]:
            packed: dict[str, Any] = super().state_dict()
            for param_state in packed["state"].values():
                param_state.update(param_state.pop(self._FSDP_WRAPPED_QUANT_STATE_KEY, {}))
            return packed

    optimizer: torch.optim.Optimizer = AdamW8bit(params, **settings)
    return optimizer


def clip_gradients(params: Iterable[Tensor], config: AdamWConfig) -> Tensor:
    """Scale the gradients of ``params`` to a global norm of at most ``config.max_grad_norm`` (none when it is
    None); returns the norm before clipping."""
    max_norm = config.max_grad_norm if config.max_grad_norm is not None else float("inf")
    params = list(params)
    total = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])  # what clip_grad_norm_ runs
    if is_sharded(total):  # FSDP: each rank's norm covers its shards; reduce to the whole gradient's
        total = total.full_tensor()
    nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
