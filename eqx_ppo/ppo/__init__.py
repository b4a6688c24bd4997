"""The training engine: learners, the pure `init` / `step`, the rollout and the
driver; PPO is its first learner. Writing a learner needs `replay` (a
minibatch's replay with bootstrap values), `gae` and, to reuse PPO's loss,
`ppo_loss`."""

from ._config import (
    EvalConfig as EvalConfig,
    TrainConfig as TrainConfig,
    VideoConfig as VideoConfig,
)
from ._gae import gae as gae
from ._learner import (
    PPO as PPO,
    AbstractLearner as AbstractLearner,
    Minibatch as Minibatch,
)
from ._loss import ppo_loss as ppo_loss, replay as replay
from ._result import (
    TrainResult as TrainResult,
    VideoData as VideoData,
    select_seed as select_seed,
)
from ._rollout import (
    Transition as Transition,
    eval_rollout as eval_rollout,
    record_activations_rollout as record_activations_rollout,
)
from ._sharding import make_mesh as make_mesh, shard_step as shard_step
from ._step import (
    TrainingState as TrainingState,
    init as init,
    shard_state as shard_state,
    step as step,
)
from ._train import train as train
