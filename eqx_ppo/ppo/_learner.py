"""Learners: the algorithm half of the engine.

A learner is an immutable module holding an algorithm's config (its
coefficients are traced arrays, so a sweep does not recompile) and answering
three questions for the shared `init` / `step` / driver:

- which module acts in the rollout (`acting`: the network itself, or the
  network beside a teacher);
- what a replay batch is (`replay_batch`: the rollout's transitions, or
  those with a teacher's actions put in);
- the loss of one minibatch (`loss`).

[`eqx_ppo.PPO`][] and [`eqx_ppo.Distillation`][] are the two final
implementations; a third algorithm is one subclass in one file.
"""

import abc
import typing
from typing import Any, NamedTuple

import equinox as eqx
from jaxtyping import Array, Float, PyTree

from ..nn._module import AbstractStatefulModule, State
from ._config import LearnerConfig, PPOConfig
from ._loss import ppo_loss
from ._rollout import Transition

Module = AbstractStatefulModule
Axis = str | None
"""The device axis name under `jax.shard_map`, or `None` on one device."""
Loss = tuple[Float[Array, ""], dict[str, Any]]
"""A minibatch's scalar loss and its metrics."""


class Minibatch(NamedTuple):
    """What a learner's loss gets for one minibatch of `M` envs.

    - `carry`: the acting module's carries at the start of the rollout, `[M]`.
    - `data`: the replay batch (`learner.replay_batch`) sliced to `[T, M]`.
    - `final_obs`: the observations after the rollout's last step, `[M]`.
    """

    carry: State
    data: Transition
    final_obs: PyTree[Array]


class AbstractLearner(eqx.Module):
    """An algorithm on the shared engine.

    **Attributes:**

    - `config`: a [`eqx_ppo.LearnerConfig`][]: the iteration and optimiser
      settings, with the algorithm's own coefficients.

    Subclasses implement `acting`, `loss` and, when the replay needs more
    than the rollout stored, `replay_batch`.
    """

    config: eqx.AbstractVar[LearnerConfig]

    def __check_init__(self):
        # The config class the learner declares (PPO: PPOConfig), so that one
        # learner's config cannot drive another whose loss reads other fields.
        try:
            declared = typing.get_type_hints(type(self)).get("config")
        except NameError:  # an annotation that does not resolve here
            declared = None
        wanted = declared if isinstance(declared, type) else LearnerConfig
        if not isinstance(self.config, wanted):
            raise TypeError(
                f"{type(self).__name__}(config=...): expected a {wanted.__name__}"
                + (" (e.g. PPOConfig)" if wanted is LearnerConfig else "")
                + f", got {type(self.config).__name__}."
            )

    @abc.abstractmethod
    def acting(self, network: Module, obs: PyTree[Array]) -> Module:
        """The module the rollout runs, built around the trained `network`.

        Its carry is the training state's `carry`; `obs` is a batch of
        observations `[n_envs, ...]` (for shape checks). It must end in a
        [`eqx_ppo.nn.PPOAdapter`][] output, and its `extras` have the
        network's structure: the loss replays the network on them and
        `update_statistics` folds them in.
        """

    def replay_batch(self, network: Module, data: Transition) -> Transition:
        """The transitions the loss replays, from the rollout's. The default:
        unchanged."""
        del network
        return data

    @abc.abstractmethod
    def loss(
        self, network: Module, batch: Minibatch, *, axis_name: Axis = None
    ) -> Loss:
        """One minibatch's loss and metrics: `(loss, metrics)`, a scalar and a
        dict of arrays.

        `metrics` must hold `loss/total` (the loss, which the finite check
        reads), and `loss/approx_kl` when `target_kl` is set; keys under
        `loss/` are the engine's and are not logged, every other key is
        logged as the mean over the iteration's updates (`/mean`, `/std` or
        percentiles). Under `jax.shard_map`, `axis_name` names the device
        axis for whole-minibatch statistics."""

    @property
    def keep_terminal_obs(self) -> bool:
        """Whether the rollout stores the terminal observations of truncated
        episodes (for a loss that bootstraps from them)."""
        return False

    @property
    def target_kl(self) -> Float[Array, ""] | None:
        """An early stop of the epoch loop on the minibatches' KL, or `None`."""
        return None

    @property
    def metrics_prefix(self) -> str:
        """Where the rollout's network metrics are logged (`<prefix>/<path>`)."""
        return "net"

    @property
    def logs_rollout_outputs(self) -> bool:
        """Whether `ACTOR_EXTRA` / `CRITIC_EXTRA` log the rollout's
        log-likelihoods and values."""
        return True


def check_learner(where: str, learner: Any) -> None:
    """Raise a `TypeError` unless `learner` is an `AbstractLearner` (a learner's
    config alone, e.g. a `PPOConfig`, is the usual mistake)."""
    if isinstance(learner, AbstractLearner):
        return
    fix = (
        "wrap the config in its learner, e.g. learner=eqx_ppo.PPO(config)"
        if isinstance(learner, LearnerConfig)
        else "pass a learner, e.g. learner=eqx_ppo.PPO(eqx_ppo.PPOConfig())"
    )
    raise TypeError(
        f"{where}(learner=<{type(learner).__name__}>): expected an "
        f"eqx_ppo.AbstractLearner, got {type(learner).__name__}. Fix: {fix}."
    )


class PPO(AbstractLearner):
    """Proximal policy optimisation: the clipped surrogate with GAE advantages.

    The network acts itself; the loss is [`eqx_ppo.ppo.ppo_loss`][]. All
    settings are in `config`, see [`eqx_ppo.PPOConfig`][].

    ```python
    learner = eqx_ppo.PPO(eqx_ppo.PPOConfig(learning_rate=3e-4))
    ```
    """

    config: PPOConfig

    def acting(self, network: Module, obs: PyTree[Array]) -> Module:
        del obs
        return network

    def loss(
        self, network: Module, batch: Minibatch, *, axis_name: Axis = None
    ) -> Loss:
        return ppo_loss(network, *batch, self.config, axis_name=axis_name)

    @property
    def keep_terminal_obs(self) -> bool:
        return self.config.truncation == "bootstrap"

    @property
    def target_kl(self) -> Float[Array, ""] | None:
        return self.config.target_kl
