"""Rewards: scores of generated images against their prompts, behind one interface (:mod:`.base`) and
selected by name (:mod:`.registry`). Heavy engines are imported by their own modules only when built."""

from vgrpo.rewards.base import Metadata, Reward, RewardError, RewardOutput
from vgrpo.rewards.registry import REWARDS, build_reward, get_reward_class

__all__ = ["REWARDS", "Metadata", "Reward", "RewardError", "RewardOutput", "build_reward", "get_reward_class"]
