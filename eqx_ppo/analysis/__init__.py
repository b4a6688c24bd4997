"""Look inside a trained policy: lesions, population analysis of recorded
activity, fixed points of a recurrent layer, and their plots. Optimistix and
matplotlib are imported only when a function needs them."""

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
