"""Learners: an algorithm and its settings, as one immutable value.

A learner says which module acts in the rollout (`acting`), what the replay
batch is (`replay_batch`) and the loss of one minibatch (`loss`). Structural
settings are static (they fix the compiled program); coefficients are
float32 array leaves, so `jax.vmap` can sweep them without recompiling.
"""

import abc
import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import equinox as eqx
from beartype.vale import Is
from jaxtyping import Array, Float, PyTree

from .._typecheck import (
    Int,
    Number,
    check_range,
    checked,
    each,
    float32,
    optional_float32,
)
from ..checkpoint import register_config
from ..logging import LoggingLevel
from ..nn._module import AbstractStatefulModule, State
from ._loss import ppo_loss
from ._rollout import Transition

Module = AbstractStatefulModule
Axis = str | None
"""The device axis name under `jax.shard_map`, or `None` on one device."""
Loss = tuple[Float[Array, ""], dict[str, Any]]
"""A minibatch's scalar loss and its metrics."""
Percentile = Annotated[Number, Is[lambda p: 0 <= p <= 100]]


def _percentiles(
    levels: each(Sequence, Percentile) | None,
) -> tuple[Number, ...] | None:
    return None if levels is None else tuple(levels)


def _weight_decay(value: Number | bool | None) -> Number | None:
    # nnx-ppo reads `True` as optax's default AdamW decay and `False` as none.
    return {True: 1e-4, False: None}[value] if isinstance(value, bool) else value


def setting(
    default: Any,
    low: float | int | None = None,
    high: float | int | None = None,
    *,
    open_low: bool = False,
    static: bool = True,
    **kwargs: Any,
) -> Any:
    """A static, keyword-only learner field, range-checked at construction."""
    limits = {"low": low, "high": high, "open_low": open_low}
    bounds = {} if low is None and high is None else {"bounds": limits}
    return eqx.field(
        static=static, kw_only=True, default=default, metadata=bounds, **kwargs
    )


def coefficient(
    default: float | None,
    low: float | int | None = None,
    high: float | int | None = None,
    *,
    open_low: bool = False,
) -> Any:
    """A traced float32 learner field (`None` switches an optional one off)."""
    converter = float32 if default is not None else optional_float32
    return setting(
        default, low, high, open_low=open_low, static=False, converter=converter
    )


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
    """An algorithm on the shared engine, with the settings every one has.

    Subclasses add `setting` and `coefficient` fields (range-checked from
    their bounds) and implement `acting` and `loss` (the custom-learner guide).

    **Settings** (keyword-only):

    - `n_envs`: parallel environments; divisible by `n_minibatches`.
    - `rollout_length`: steps per env per iteration.
    - `total_steps`: env steps to train for, rounded up to whole iterations.
    - `n_epochs`, `n_minibatches`: passes over the rollout; minibatches of envs.
    - `learning_rate`, `lr_schedule`: Adam(W)'s step size, constant or decayed to 0.
    - `gradient_clipping`: global-norm clip, or `None`.
    - `weight_decay`: AdamW's decay, or `None` for Adam (`True`: `1e-4`).
    - `reset_mode`: where finished envs restart (see the concepts page).
    - `check_finite`: stop with a `FloatingPointError` naming what went
      non-finite (the FAQ).
    - `logging_level`, `logging_percentiles`: see [`eqx_ppo.LoggingLevel`][].
    """

    n_envs: Int = setting(256, low=1)
    rollout_length: Int = setting(20, low=1)
    total_steps: Int = setting(512_000, low=1)
    n_epochs: Int = setting(4, low=1)
    n_minibatches: Int = setting(4, low=1)
    learning_rate: Float[Array, ""] = coefficient(1e-4, low=0.0)
    lr_schedule: Literal["constant", "linear", "cosine"] = setting("constant")
    gradient_clipping: Number | None = setting(0.5, low=0.0, open_low=True)
    weight_decay: Number | None = setting(None, low=0.0, converter=_weight_decay)
    reset_mode: Literal["cached", "fresh", "initial"] = setting("cached")
    check_finite: bool = setting(True)
    logging_level: LoggingLevel = setting(LoggingLevel.LOSSES)
    logging_percentiles: tuple[Number, ...] | None = setting(
        None, converter=_percentiles
    )

    metrics_prefix: ClassVar[str] = "net"
    """Where the rollout's network metrics are logged (`<prefix>/<path>`)."""
    logs_rollout_outputs: ClassVar[bool] = True
    """Whether `ACTOR_EXTRA` / `CRITIC_EXTRA` log the rollout's log-likelihoods
    and values."""

    def __check_init__(self):
        name = type(self).__name__
        for field in dataclasses.fields(self):
            if "bounds" in field.metadata:
                value = getattr(self, field.name)
                check_range(f"{name}({field.name}=", value, **field.metadata["bounds"])
        if self.n_envs % self.n_minibatches:
            raise ValueError(
                f"{name}(n_envs={self.n_envs}, n_minibatches={self.n_minibatches}): "
                "n_envs must be divisible by n_minibatches because minibatches "
                "split the env axis. Fix: e.g. n_envs="
                f"{self.n_minibatches * max(1, self.n_envs // self.n_minibatches)}."
            )

    @property
    def steps_per_iteration(self) -> int:
        """Env steps taken by one iteration: `n_envs * rollout_length`."""
        return self.n_envs * self.rollout_length

    @property
    def n_iterations(self) -> int:
        """Iterations needed to reach `total_steps` (rounded up)."""
        return -(-self.total_steps // self.steps_per_iteration)

    @property
    def n_updates(self) -> int:
        """Optimiser steps in a whole run: one per minibatch, epoch and iteration."""
        return self.n_iterations * self.n_epochs * self.n_minibatches

    def free_on_resume(self) -> frozenset[str]:
        """The settings a resumed run may change (`total_steps` only when a
        constant learning rate does not depend on it)."""
        free = {"logging_level", "logging_percentiles", "check_finite"}
        if self.lr_schedule == "constant":
            free.add("total_steps")
        return frozenset(free)

    @abc.abstractmethod
    def acting(self, network: Module, obs: PyTree[Array]) -> Module:
        """The module the rollout runs, built around the trained `network`
        (`obs`: a batch of observations, for shape checks); its carry is the
        training state's `carry`, and it ends in a `PPOAdapter`."""

    def replay_batch(self, network: Module, data: Transition) -> Transition:
        """The transitions the loss replays, from the rollout's (default: those)."""
        del network
        return data

    @abc.abstractmethod
    def loss(
        self, network: Module, batch: Minibatch, *, axis_name: Axis = None
    ) -> Loss:
        """One minibatch's `(loss, metrics)`: `metrics` holds `loss/total`
        (and `loss/approx_kl` with `target_kl`); other keys are logged."""

    @property
    def keep_terminal_obs(self) -> bool:
        """Whether the rollout keeps truncated episodes' terminal observations."""
        return False

    @property
    def target_kl(self) -> Float[Array, ""] | None:
        """An early stop of the epoch loop on the minibatches' KL, or `None`."""
        return None


@register_config
@checked
class PPO(AbstractLearner):
    """Proximal policy optimisation: the clipped surrogate with GAE advantages.

    The network acts itself; the loss is [`eqx_ppo.ppo.ppo_loss`][]. Gradient
    clipping at 0.5 and non-finite checks are on by default (the FAQ, "Why
    did my run collapse?", has more on these settings).

    ```python
    learner = eqx_ppo.PPO(n_envs=64, learning_rate=3e-4)
    ```

    **Settings** (keyword-only), besides [`eqx_ppo.AbstractLearner`][]'s:

    - `clip_range`: the surrogate's ratio clip `epsilon`.
    - `discounting_factor`, `gae_lambda`: GAE's `gamma` and `lambda`.
    - `critic_loss_weight`: weight of the value loss `0.5 * mean((V - target)^2)`.
    - `normalize_advantages`: standardise advantages per minibatch.
    - `combine_advantages`: sum per-reward-key advantages for every log-likelihood.
    - `target_kl`: skip the iteration's updates past `1.5 * target_kl`, or `None`.
    - `value_clip_range`: CleanRL's clipped value loss, or `None`.
    - `reward_scaling`: `> 0`, the factor the loss multiplies rewards by.
    - `truncation`: `"drop"` or `"bootstrap"` a time limit's advantage.
    """

    clip_range: Float[Array, ""] = coefficient(0.2, low=0.0)
    discounting_factor: Float[Array, ""] = coefficient(0.99, low=0.0, high=1.0)
    gae_lambda: Float[Array, ""] = coefficient(0.95, low=0.0, high=1.0)
    critic_loss_weight: Float[Array, ""] = coefficient(1.0, low=0.0)
    target_kl: Float[Array, ""] | None = coefficient(None, low=0.0)
    value_clip_range: Float[Array, ""] | None = coefficient(None, low=0.0)
    # Zero would erase every reward: the actor would learn from entropy alone.
    reward_scaling: Float[Array, ""] = coefficient(1.0, low=0.0, open_low=True)
    normalize_advantages: bool = setting(True)
    combine_advantages: bool = setting(False)
    truncation: Literal["drop", "bootstrap"] = setting("drop")

    def acting(self, network: Module, obs: PyTree[Array]) -> Module:
        del obs
        return network

    def loss(
        self, network: Module, batch: Minibatch, *, axis_name: Axis = None
    ) -> Loss:
        return ppo_loss(network, *batch, self, axis_name=axis_name)

    @property
    def keep_terminal_obs(self) -> bool:
        return self.truncation == "bootstrap"
