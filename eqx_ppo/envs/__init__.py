"""The environment protocol, wrappers, auto-reset and built-in pure-JAX envs."""

from ._cartpole import CartPole as CartPole
from ._counter import Counter as Counter
from ._dict_env import DictObsAct as DictObsAct
from ._env import AbstractEnv as AbstractEnv
from ._gymnax import GymnaxAdapter as GymnaxAdapter
from ._move_to_center import MoveToCenter as MoveToCenter
from ._parrot import Parrot as Parrot
from ._pendulum import Pendulum as Pendulum
from ._popgym import (
    CountRecall as CountRecall,
    RepeatFirst as RepeatFirst,
    RepeatPrevious as RepeatPrevious,
)
from ._recall import Recall as Recall
from ._registry import make as make, registered_names as registered_names
from ._state import State as State
from ._two_arm import TwoArm as TwoArm
from ._wrappers import (
    AbstractWrapper as AbstractWrapper,
    EpisodeWrapper as EpisodeWrapper,
    RewardScalingWrapper as RewardScalingWrapper,
)
