"""The PPO training engine: config, rollout, GAE, loss, pure step and driver."""

from ._config import (
    EvalConfig as EvalConfig,
    PPOConfig as PPOConfig,
    TrainConfig as TrainConfig,
    VideoConfig as VideoConfig,
)
from ._gae import gae as gae
from ._loss import ppo_loss as ppo_loss, replay as replay
from ._rollout import (
    Transition as Transition,
    eval_rollout as eval_rollout,
    record_activations_rollout as record_activations_rollout,
    rollout as rollout,
)
from ._step import (
    TrainingState as TrainingState,
    make_optimizer as make_optimizer,
    ppo_init as ppo_init,
    ppo_run as ppo_run,
    ppo_step as ppo_step,
    scan_steps as scan_steps,
)
from ._train import (
    TrainResult as TrainResult,
    VideoData as VideoData,
    init_state as init_state,
    select_seed as select_seed,
    train_ppo as train_ppo,
)
