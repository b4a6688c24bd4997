"""eqx_ppo: PPO for stateful and recurrent policies in JAX, written with Equinox."""

from . import envs as envs, nn as nn

__version__ = "0.1.0"
