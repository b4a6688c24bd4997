"""Layers, containers and samplers: every one an immutable stateful module."""

from ..samplers import (
    CategoricalSampler as CategoricalSampler,
    NormalSampler as NormalSampler,
    NormalTanhSampler as NormalTanhSampler,
)
from ._adapter import PPOAdapter as PPOAdapter, PPONetworkOutput as PPONetworkOutput
from ._containers import (
    Concat as Concat,
    Map as Map,
    Merge as Merge,
    Parallel as Parallel,
    Sequential as Sequential,
)
from ._conv import Conv2d as Conv2d, make_cnn_encoder as make_cnn_encoder
from ._delay import Delay as Delay
from ._dense import Dense as Dense
from ._factories import (
    make_mlp as make_mlp,
    make_mlp_actor_critic as make_mlp_actor_critic,
)
from ._filters import (
    AbstractStatistics as AbstractStatistics,
    coefficient as coefficient,
    trainable as trainable,
)
from ._linear_recurrent import LRU as LRU, MinGRU as MinGRU
from ._module import (
    AbstractStatefulModule as AbstractStatefulModule,
    SequenceOutput as SequenceOutput,
    StatefulModuleOutput as StatefulModuleOutput,
    apply_batched as apply_batched,
    merged_steps as merged_steps,
)
from ._normalizer import Normalizer as Normalizer
from ._recurrent import GRU as GRU, LSTM as LSTM
from ._recurrent_factories import (
    make_lstm_actor_critic as make_lstm_actor_critic,
    make_recurrent_actor_critic as make_recurrent_actor_critic,
)
from ._utils import (
    Filter as Filter,
    Flattener as Flattener,
    Scale as Scale,
    Splitter as Splitter,
)
from ._variational import (
    AR1VariationalBottleneck as AR1VariationalBottleneck,
    VariationalBottleneck as VariationalBottleneck,
)
