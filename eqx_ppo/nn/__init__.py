"""Layers, containers and samplers: every one an immutable stateful module."""

from ._module import (
    AbstractStatefulModule as AbstractStatefulModule,
    AbstractStatistics as AbstractStatistics,
    State as State,
    StatefulModuleOutput as StatefulModuleOutput,
    apply_batched as apply_batched,
    reset_where as reset_where,
    trainable as trainable,
)
from ._adapter import PPONetworkOutput as PPONetworkOutput
from ._dense import Dense as Dense
from ._dense import get_activation as get_activation
from ._normalizer import Normalizer as Normalizer
from ._normalizer import NormalizerStatistics as NormalizerStatistics
from ._recurrent import GRU as GRU
from ._recurrent import LSTM as LSTM
from ._containers import (
    Concat as Concat,
    Map as Map,
    Merge as Merge,
    Parallel as Parallel,
    Sequential as Sequential,
)
from ._utils import (
    Filter as Filter,
    FilterSpec as FilterSpec,
    Flattener as Flattener,
    Scale as Scale,
    Splitter as Splitter,
)
from ._adapter import PPOAdapter as PPOAdapter
from ..samplers import (
    CategoricalSampler as CategoricalSampler,
    NormalSampler as NormalSampler,
    NormalTanhSampler as NormalTanhSampler,
)
from ._delay import Delay as Delay
from ._variational import AR1VariationalBottleneck as AR1VariationalBottleneck
from ._variational import VariationalBottleneck as VariationalBottleneck
from ._factories import (
    make_lstm_actor_critic as make_lstm_actor_critic,
    make_mlp as make_mlp,
    make_mlp_actor_critic as make_mlp_actor_critic,
)
