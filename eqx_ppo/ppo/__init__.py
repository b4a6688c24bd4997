"""The training engine: configs, rollout, GAE, learners, the pure `init` /
`step` and the driver; PPO is its first learner."""

from ._config import (
    DriverConfig as DriverConfig,
    EvalConfig as EvalConfig,
    IterationConfig as IterationConfig,
    LearnerConfig as LearnerConfig,
    OptimizerConfig as OptimizerConfig,
    PPOConfig as PPOConfig,
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
from ._rollout import (
    SaveAt as SaveAt,
    Steps as Steps,
    Transition as Transition,
    eval_rollout as eval_rollout,
    record_activations_rollout as record_activations_rollout,
    rollout as rollout,
    run_episodes as run_episodes,
    run_fresh_episodes as run_fresh_episodes,
    start_episodes as start_episodes,
)
from ._step import (
    TrainingState as TrainingState,
    init as init,
    make_optimizer as make_optimizer,
    ppo_init as ppo_init,
    ppo_run as ppo_run,
    ppo_step as ppo_step,
    scan_steps as scan_steps,
    step as step,
)
from ._train import (
    TrainResult as TrainResult,
    VideoData as VideoData,
    init_state as init_state,
    init_states as init_states,
    select_seed as select_seed,
    train as train,
    train_ppo as train_ppo,
)
