"""The environment protocol, wrappers, auto-reset and built-in pure-JAX envs."""

from ._state import State as State
from ._env import AbstractEnv as AbstractEnv
from ._wrappers import AbstractWrapper as AbstractWrapper
from ._wrappers import EpisodeWrapper as EpisodeWrapper
from ._wrappers import RewardScalingWrapper as RewardScalingWrapper
from ._counter import Counter as Counter
from ._parrot import Parrot as Parrot
from ._move_to_center import MoveToCenter as MoveToCenter
from ._dict_env import DictObsAct as DictObsAct
from ._two_arm import TwoArm as TwoArm
from ._recall import Recall as Recall
from ._pendulum import Pendulum as Pendulum
from ._gymnax import GymnaxAdapter as GymnaxAdapter
from ._registry import make as make
from ._registry import registered_names as registered_names
