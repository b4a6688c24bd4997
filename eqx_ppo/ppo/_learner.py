"""Learners: an algorithm and its settings, as one immutable value.

A learner says which module acts in the rollout (`acting`), what the replay
batch is (`replay_batch`) and the loss of one minibatch (`loss`). Structural
settings are static (they fix the compiled program); coefficients are
float32 array leaves, so `jax.vmap` can sweep them without recompiling.
"""

import abc
import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NamedTuple

import equinox as eqx
from beartype.vale import Is
from jaxtyping import Array, Float, PyTree

from .._typecheck import Int, Number, check_range, checked, float32, optional_float32
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


def _percentiles(levels: Sequence[Percentile] | None) -> tuple[Number, ...] | None:
    return None if levels is None else tuple(levels)


def _weight_decay(value: Number | bool | None) -> Number | None:
    # nnx-ppo reads `True` as optax's default AdamW decay and `False` as none.
    return (
        {True: 1e-4, False: None}.get(value, value)
        if isinstance(value, bool)
        else value
    )


def setting(
    default: Any,
    low: float | int | None = None,
    high: float | int | None = None,
    *,
    open_low: bool = False,
    **kwargs: Any,
) -> Any:
    """A static, keyword-only learner field, range-checked at construction."""
    bounds = {} if low is None and high is None else {"bounds": (low, high, open_low)}
    return eqx.field(
        static=True, kw_only=True, default=default, metadata=bounds, **kwargs
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
    return eqx.field(
        converter=converter,
        kw_only=True,
        default=default,
        metadata={"bounds": (low, high, open_low)},
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

    Subclasses add their own settings (`setting` and `coefficient` fields,
    which are range-checked from their declared bounds) and implement
    `acting` and `loss`, and `replay_batch` when the replay needs more than
    the rollout stored.

    **Settings** (keyword-only):

    - `n_envs`: parallel environments; divisible by `n_minibatches`.
    - `rollout_length`: steps per env per iteration (`T`).
    - `total_steps`: env steps to train for, rounded up to whole iterations
      of `n_envs * rollout_length`.
    - `n_epochs`, `n_minibatches`: passes over the rollout and minibatches per
      pass; minibatches split the *env* axis, each replaying whole sequences.
    - `learning_rate`: Adam(W) step size, scaled by `lr_schedule`:
      `"constant"`, `"linear"` or `"cosine"` (both to 0 at `total_steps`).
    - `gradient_clipping`: global-norm clip, `> 0`, or `None`.
    - `weight_decay`: AdamW decoupled weight decay, or `None` for Adam;
      `True` is optax's default decay (`1e-4`), as in nnx-ppo.
    - `reset_mode`: `"cached"` (default) resets finished envs to start states
      drawn once per iteration; `"fresh"` calls `env.reset` at every step
      (costly for physics envs, exact episode-start diversity).
    - `check_finite`: stop training with a `FloatingPointError` naming what
      became non-finite, where and why (see the FAQ); one fused reduction per
      iteration, and nothing non-finite is ever returned or checkpointed.
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
    reset_mode: Literal["cached", "fresh"] = setting("cached")
    check_finite: bool = setting(True)
    logging_level: LoggingLevel = setting(LoggingLevel.LOSSES)
    logging_percentiles: tuple[Number, ...] | None = setting(
        None, converter=_percentiles
    )

    def __check_init__(self):
        name = type(self).__name__
        for field in dataclasses.fields(self):
            bounds = field.metadata.get("bounds")
            if bounds is not None:
                low, high, open_low = bounds
                check_range(
                    f"{name}({field.name}=",
                    getattr(self, field.name),
                    low,
                    high,
                    open_low=open_low,
                )
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
        """The settings a resumed run may change (`total_steps` only under a
        constant learning rate: a decaying schedule's every rate depends on it)."""
        free = {"logging_level", "logging_percentiles", "check_finite"}
        if self.lr_schedule == "constant":
            free.add("total_steps")
        return frozenset(free)

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


@register_config
@checked
class PPO(AbstractLearner):
    """Proximal policy optimisation: the clipped surrogate with GAE advantages.

    The network acts itself; the loss is [`eqx_ppo.ppo.ppo_loss`][]. The
    defaults are the stable ones CleanRL and Stable-Baselines3 users expect:
    global-norm gradient clipping at 0.5 and non-finite checks on (the FAQ,
    "Why did my run collapse?").

    ```python
    learner = eqx_ppo.PPO(n_envs=64, learning_rate=3e-4)
    ```

    **Settings** (keyword-only), besides [`eqx_ppo.AbstractLearner`][]'s:

    - `clip_range`: the surrogate's ratio clip `epsilon`.
    - `discounting_factor`, `gae_lambda`: GAE's `gamma` and `lambda`.
    - `critic_loss_weight`: weight of the value loss `0.5 * mean((V - target)^2)`:
      the `0.5` is inside, so `0.5` matches Brax's `vf_loss_coefficient=0.5`
      and CleanRL's `vf_coef=0.5`, and the default 1.0 weighs it twice as much.
    - `normalize_advantages`: standardise advantages per minibatch. When
      every episode runs to the time limit this scales the critic's noise up
      to unit size; turn it off for such tasks (the FAQ).
    - `combine_advantages`: sum per-reward-key advantages into one advantage
      for every action log-likelihood (multi-head rewards).
    - `target_kl`: stop the epoch loop once a minibatch's approximate KL
      from the rollout policy (`mean((r - 1) - log r)`) exceeds
      `1.5 * target_kl`: that minibatch and every later one of the iteration
      skip their update (Stable-Baselines3's rule; the skipped fraction is
      logged as `losses/kl_stopped`). `None` never stops.
    - `value_clip_range`: CleanRL's `clip_vloss`,
      `max((V - t)^2, (V_old + clip(V - V_old, -c, c) - t)^2)`; `None` for the
      plain squared error.
    - `reward_scaling`: `> 0`; the loss multiplies every reward by it (Brax's
      `reward_scaling`), so the rollout, its metrics and evaluation stay in
      the env's units. For one factor per key of a dict reward, wrap the env
      in [`eqx_ppo.envs.RewardScalingWrapper`][] (evaluation then sees scaled
      rewards unless `train(eval_env=...)` gets the unwrapped env).
    - `truncation`: `"drop"` zeroes the advantage of a time-limit step (nnx-ppo
      and Brax); `"bootstrap"` bootstraps it from the value of the terminal
      observation.
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
