"""eqx_ppo: PPO for stateful and recurrent policies in JAX, written with Equinox."""

from . import analysis as analysis, envs as envs, graph as graph, nn as nn
from .checkpoint import (
    CheckpointError as CheckpointError,
    latest_checkpoint as latest_checkpoint,
    list_checkpoints as list_checkpoints,
    load_checkpoint as load_checkpoint,
    make_checkpoint_fn as make_checkpoint_fn,
    read_header as read_header,
    register_config as register_config,
    save_checkpoint as save_checkpoint,
)
from .distill import Distillation as Distillation
from .graph import (
    PopulationGraph as PopulationGraph,
    PopulationGraphBuilder as PopulationGraphBuilder,
)
from .logging import (
    CSVLogger as CSVLogger,
    JSONLLogger as JSONLLogger,
    LoggingLevel as LoggingLevel,
    TensorBoardLogger as TensorBoardLogger,
    WandbLogger as WandbLogger,
    combine_loggers as combine_loggers,
)
from .nn import (
    AbstractStatefulModule as AbstractStatefulModule,
    PPOAdapter as PPOAdapter,
    PPONetworkOutput as PPONetworkOutput,
    StatefulModuleOutput as StatefulModuleOutput,
    apply_batched as apply_batched,
    make_lstm_actor_critic as make_lstm_actor_critic,
    make_mlp as make_mlp,
    make_mlp_actor_critic as make_mlp_actor_critic,
    make_recurrent_actor_critic as make_recurrent_actor_critic,
    trainable as trainable,
)
from .ppo import (
    PPO as PPO,
    AbstractLearner as AbstractLearner,
    EvalConfig as EvalConfig,
    Minibatch as Minibatch,
    TrainConfig as TrainConfig,
    TrainingState as TrainingState,
    TrainResult as TrainResult,
    VideoConfig as VideoConfig,
    VideoData as VideoData,
    eval_rollout as eval_rollout,
    gae as gae,
    init as init,
    make_mesh as make_mesh,
    record_activations_rollout as record_activations_rollout,
    select_seed as select_seed,
    shard_state as shard_state,
    shard_step as shard_step,
    step as step,
    train as train,
)
from .recording import (
    ACTIVATION_KEY as ACTIVATION_KEY,
    Recorder as Recorder,
    extract_activations as extract_activations,
    with_recording as with_recording,
)
from .samplers import (
    CategoricalSampler as CategoricalSampler,
    NormalSampler as NormalSampler,
    NormalTanhSampler as NormalTanhSampler,
)

__version__ = "0.1.0"
