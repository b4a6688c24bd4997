"""Look inside a trained policy: lesions, population analysis and fixed points.

Every function takes the networks, activations and layers the rest of
eqx_ppo produces, and none changes them:

- [`ablate`][eqx_ppo.analysis.ablate], [`clamp`][eqx_ppo.analysis.clamp] and
  [`perturb`][eqx_ppo.analysis.perturb] are pure tree transforms that hold or
  shift some units of one layer;
  [`unit_importance`][eqx_ppo.analysis.unit_importance] lesions every unit of
  a layer in one vmapped program.
- [`pca`][eqx_ppo.analysis.pca] and
  [`linear_probe`][eqx_ppo.analysis.linear_probe] read recorded activity
  ([`eqx_ppo.record_activations_rollout`][]).
- [`fixed_points`][eqx_ppo.analysis.fixed_points] finds where a recurrent
  layer rests under a constant input (with Optimistix, the `analysis` extra).
- `plot_*` draw each (with matplotlib, the `analysis` or `plot` extra).

Optimistix and matplotlib are imported only when a function needs them.
"""

from ._fixed_points import FixedPoints as FixedPoints, fixed_points as fixed_points
from ._importance import unit_importance as unit_importance
from ._lesion import (
    Intervention as Intervention,
    ablate as ablate,
    clamp as clamp,
    perturb as perturb,
)
from ._pca import PCA as PCA, pca as pca
from ._plot import (
    plot_fixed_points as plot_fixed_points,
    plot_importance as plot_importance,
    plot_trajectories as plot_trajectories,
)
from ._probe import linear_probe as linear_probe
