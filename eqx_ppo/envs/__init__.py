"""The environment protocol, wrappers, auto-reset and built-in pure-JAX envs.

Built-in envs are made by name (`make("cartpole", hide_velocity=True)`;
`registered_names()` lists them), as are Brax, MuJoCo Playground and gymnax
envs (`make("brax:ant")`, `make("gymnax:CartPole-v1")`).
"""

from ._env import AbstractEnv as AbstractEnv
from ._gymnax import GymnaxAdapter as GymnaxAdapter
from ._registry import make as make, registered_names as registered_names
from ._state import State as State
from ._wrappers import (
    AbstractWrapper as AbstractWrapper,
    EpisodeWrapper as EpisodeWrapper,
    RewardScalingWrapper as RewardScalingWrapper,
)
