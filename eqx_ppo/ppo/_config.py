"""Configuration of a PPO run: algorithm, evaluation, video and the driver."""

import dataclasses
import numbers
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..checkpoint import register_config
from ..logging import LoggingLevel
from ._validate import (
    as_percentiles,
    check_bools,
    check_config_types,
    check_finite_value,
    check_flags,
    check_percentiles,
    check_positive_ints,
)


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _coefficient() -> Any:
    return eqx.field(converter=lambda v: jnp.asarray(v, jnp.float32))


def _optional_coefficient() -> Any:
    """A coefficient that `None` switches off (a different program); any value
    switches it on as a float32 array, so sweeping the value does not recompile."""
    return eqx.field(
        converter=lambda v: None if v is None else jnp.asarray(v, jnp.float32)
    )


class IterationConfig(eqx.Module):
    """The shape of one training iteration, shared by every learner.

    All fields are static: they fix array shapes and the compiled program.
    A learner's config (a [`eqx_ppo.LearnerConfig`][], e.g.
    [`eqx_ppo.PPOConfig`][]) inherits them, with those of
    [`eqx_ppo.OptimizerConfig`][].

    **Fields** (keyword-only, so a subclass's own fields may come first):
    `n_envs`, `rollout_length`, `total_steps`, `n_epochs`, `n_minibatches`,
    `reset_mode`, `check_finite`, `logging_level`, `logging_percentiles`; see
    [`eqx_ppo.PPOConfig`][] for each.
    """

    n_envs: int = eqx.field(static=True, kw_only=True, default=256)
    rollout_length: int = eqx.field(static=True, kw_only=True, default=20)
    total_steps: int = eqx.field(static=True, kw_only=True, default=512_000)
    n_epochs: int = eqx.field(static=True, kw_only=True, default=4)
    n_minibatches: int = eqx.field(static=True, kw_only=True, default=4)
    reset_mode: Literal["cached", "fresh"] = eqx.field(
        static=True, kw_only=True, default="cached"
    )
    check_finite: bool = eqx.field(static=True, kw_only=True, default=True)
    logging_level: LoggingLevel = eqx.field(
        static=True, kw_only=True, default=LoggingLevel.LOSSES
    )
    logging_percentiles: tuple[int | float, ...] | None = eqx.field(
        static=True,
        kw_only=True,
        default=None,
        converter=as_percentiles,
    )

    def __check_init__(self):
        kind = type(self).__name__
        check_positive_ints(
            self, "n_envs", "rollout_length", "total_steps", "n_epochs", "n_minibatches"
        )
        if self.n_envs % self.n_minibatches:
            raise ValueError(
                f"{kind}(n_envs={self.n_envs}, n_minibatches={self.n_minibatches}): "
                "n_envs must be divisible by n_minibatches because minibatches "
                "split the env axis. Choose e.g. n_envs="
                f"{self.n_minibatches * max(1, self.n_envs // self.n_minibatches)}."
            )
        _check_choice("reset_mode", self.reset_mode, ("cached", "fresh"), kind)
        check_bools(self, "check_finite")
        check_flags(
            kind,
            "logging_level",
            self.logging_level,
            LoggingLevel,
            "LoggingLevel.LOSSES | LoggingLevel.THROUGHPUT",
        )
        check_percentiles(kind, self.logging_percentiles)

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


def _weight_decay(value: Any) -> Any:
    """`True` as optax's default AdamW decay and `False` as none, as nnx-ppo
    reads them; anything else is checked by `OptimizerConfig`."""
    if value is True:
        return 1e-4
    if value is False:
        return None
    return value


class OptimizerConfig(eqx.Module):
    """The optimiser, shared by every learner: Adam (AdamW with
    `weight_decay`), optional global-norm clipping and a learning-rate
    schedule over the run.

    `learning_rate` is a traced float32 array (sweeping it does not
    recompile); the rest is static. [`eqx_ppo.ppo.make_optimizer`][] builds
    the optax transformation from a [`eqx_ppo.LearnerConfig`][] (the
    schedule needs the run's length).

    **Fields** (keyword-only): `learning_rate`, `lr_schedule`,
    `gradient_clipping`, `weight_decay`; see [`eqx_ppo.PPOConfig`][] for each.
    """

    learning_rate: Float[Array, ""] = eqx.field(
        converter=lambda v: jnp.asarray(v, jnp.float32), kw_only=True, default=1e-4
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = eqx.field(
        static=True, kw_only=True, default="constant"
    )
    gradient_clipping: float | None = eqx.field(static=True, kw_only=True, default=0.5)
    weight_decay: float | None = eqx.field(
        static=True, kw_only=True, default=None, converter=_weight_decay
    )

    def __check_init__(self):
        kind = type(self).__name__
        _check_choice(
            "lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"), kind
        )
        # A zero clip norm scales every gradient to zero: nothing would train.
        for name, positive in (("gradient_clipping", True), ("weight_decay", False)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"{kind}({name}={value!r}): expected a number or None, got "
                    f"{type(value).__name__}. Fix: pass a float or None."
                )
            check_finite_value(kind, name, value)
            if value < 0 or (positive and value == 0):
                bound = "> 0" if positive else ">= 0"
                raise ValueError(f"{kind}({name}={value}): must be {bound} or None.")
        check_coefficient(self, "learning_rate", 0.0)


class LearnerConfig(IterationConfig, OptimizerConfig):
    """What every learner's config is: an iteration and an optimiser config.

    Subclass it for a new algorithm and add the algorithm's coefficients
    (traced float32 arrays) and switches (static fields).
    """

    def free_on_resume(self) -> frozenset[str]:
        """The fields a resumed run may change (see `load_checkpoint(config=)`):
        logging, the finite check, and `total_steps` under a constant learning
        rate (a decaying schedule's every rate depends on it)."""
        free = {"logging_level", "logging_percentiles", "check_finite"}
        if self.lr_schedule == "constant":
            free.add("total_steps")
        return frozenset(free)


@register_config
class PPOConfig(LearnerConfig):
    """The PPO algorithm's settings.

    Structural fields (sizes, counts, flags) are static: they fix array shapes
    and the compiled program. Coefficients (`learning_rate`, `clip_range`,
    `discounting_factor`, `gae_lambda`, `critic_loss_weight`,
    `reward_scaling`, and `target_kl`
    and `value_clip_range` when set) are float32 arrays, so changing one does
    not recompile and `jax.vmap` can sweep them.

    The defaults are the stable ones CleanRL and Stable-Baselines3 users
    expect: global-norm gradient clipping at 0.5 and non-finite checks on.
    See the FAQ, "Why did my run collapse?", for the guards and when to use
    them.

    **Arguments:**

    - `n_envs`: parallel environments; divisible by `n_minibatches`.
    - `rollout_length`: steps per env per iteration (`T`).
    - `total_steps`: env steps to train for (`n_envs * rollout_length` per
      iteration).
    - `n_epochs`, `n_minibatches`: passes over the rollout and minibatches per
      pass; minibatches split the *env* axis, each replaying whole sequences.
    - `learning_rate`: Adam(W) step size, scaled by `lr_schedule`.
    - `clip_range`: the surrogate's ratio clip `epsilon`.
    - `discounting_factor`, `gae_lambda`: GAE's `gamma` and `lambda`.
    - `critic_loss_weight`: weight of the value loss, which is
      `0.5 * mean((V - target)^2)`: the `0.5` is inside, so
      `critic_loss_weight=0.5` matches Brax's `vf_loss_coefficient=0.5` and
      CleanRL's `vf_coef=0.5`, and the default 1.0 weighs it twice as much.
    - `normalize_advantages`: standardise advantages per minibatch. When
      every episode runs to the time limit, this scales the critic's noise
      up to unit size; turn it off for such tasks (the FAQ's "Why did my
      run collapse?").
    - `combine_advantages`: sum per-reward-key advantages into one advantage
      for every action log-likelihood (multi-head rewards).
    - `gradient_clipping`: global-norm clip, `> 0` (default 0.5, as in CleanRL
      and Stable-Baselines3), or `None` for none.
    - `target_kl`: stop the epoch loop early once a minibatch's approximate
      KL divergence from the rollout policy (`mean((r - 1) - log r)`, `r` the
      probability ratio) exceeds `1.5 * target_kl`: that minibatch and every
      later one of the iteration skip their update (Stable-Baselines3's rule).
      `None` (default) never stops. The fraction of skipped updates is logged
      as `losses/kl_stopped` (with `LoggingLevel.LOSSES`).
    - `value_clip_range`: clip the value loss as CleanRL's `clip_vloss`:
      `max((V - t)^2, (V_old + clip(V - V_old, -c, c) - t)^2)`, with `V_old`
      the rollout's value. `None` (default) for the plain squared error.
    - `reward_scaling`: `> 0`; the loss multiplies every reward by it (Brax's
      `reward_scaling`), so advantages and value targets are in scaled units
      while the rollout, its metrics and evaluation stay in the env's units.
      For one factor per key of a dict reward, wrap the env in
      [`eqx_ppo.envs.RewardScalingWrapper`][] instead (then evaluation sees
      scaled rewards unless `train_ppo(eval_env=...)` gets the unwrapped env).
    - `weight_decay`: AdamW decoupled weight decay, or `None` for Adam;
      `True` is optax's default decay (`1e-4`), as in nnx-ppo.
    - `lr_schedule`: `"constant"`, `"linear"` (to 0 at `total_steps`) or
      `"cosine"` (to 0 at `total_steps`).
    - `truncation`: `"drop"` zeroes the advantage of a time-limit step
      before normalisation (nnx-ppo and Brax behaviour: the critic does not
      learn from the step, the actor sees it as a zero advantage);
      `"bootstrap"` bootstraps it from the value of the terminal observation.
    - `reset_mode`: `"cached"` (default) resets finished envs to start states
      drawn once per iteration (one `env.reset` per env per iteration);
      `"fresh"` calls `env.reset` with a new key at every step (costly for
      physics envs, exact episode-start diversity).
    - `check_finite`: stop training with a `FloatingPointError` that names
      what became non-finite (the observations or rewards, with the env
      index; the loss; the updated parameters) and the iteration. On by
      default: it is one fused reduction per iteration, and nothing
      non-finite is ever returned or checkpointed.
    - `logging_level`, `logging_percentiles`: see [`eqx_ppo.LoggingLevel`][].
    """

    normalize_advantages: bool = eqx.field(static=True, default=True)
    combine_advantages: bool = eqx.field(static=True, default=False)
    truncation: Literal["drop", "bootstrap"] = eqx.field(static=True, default="drop")
    clip_range: Float[Array, ""] = _coefficient()
    discounting_factor: Float[Array, ""] = _coefficient()
    gae_lambda: Float[Array, ""] = _coefficient()
    critic_loss_weight: Float[Array, ""] = _coefficient()
    target_kl: Float[Array, ""] | None = _optional_coefficient()
    value_clip_range: Float[Array, ""] | None = _optional_coefficient()
    reward_scaling: Float[Array, ""] = _coefficient()

    def __init__(
        self,
        n_envs: int = 256,
        rollout_length: int = 20,
        total_steps: int = 512_000,
        gae_lambda: float | Array = 0.95,
        discounting_factor: float | Array = 0.99,
        clip_range: float | Array = 0.2,
        learning_rate: float | Array = 1e-4,
        normalize_advantages: bool = True,
        combine_advantages: bool = False,
        n_epochs: int = 4,
        n_minibatches: int = 4,
        critic_loss_weight: float | Array = 1.0,
        gradient_clipping: float | None = 0.5,
        weight_decay: float | bool | None = None,
        lr_schedule: Literal["constant", "linear", "cosine"] = "constant",
        truncation: Literal["drop", "bootstrap"] = "drop",
        reset_mode: Literal["cached", "fresh"] = "cached",
        check_finite: bool = True,
        logging_level: LoggingLevel = LoggingLevel.LOSSES,
        logging_percentiles: tuple[int | float, ...] | None = None,
        target_kl: float | Array | None = None,
        value_clip_range: float | Array | None = None,
        reward_scaling: float | Array = 1.0,
    ):
        self.n_envs = n_envs
        self.rollout_length = rollout_length
        self.total_steps = total_steps
        self.n_epochs = n_epochs
        self.n_minibatches = n_minibatches
        self.normalize_advantages = normalize_advantages
        self.combine_advantages = combine_advantages
        self.gradient_clipping = gradient_clipping
        self.weight_decay = weight_decay
        self.lr_schedule = lr_schedule
        self.truncation = truncation
        self.reset_mode = reset_mode
        self.check_finite = check_finite
        self.logging_level = logging_level
        self.logging_percentiles = logging_percentiles
        self.learning_rate = learning_rate
        self.clip_range = clip_range
        self.discounting_factor = discounting_factor
        self.gae_lambda = gae_lambda
        self.critic_loss_weight = critic_loss_weight
        self.target_kl = target_kl
        self.value_clip_range = value_clip_range
        self.reward_scaling = reward_scaling

    def __check_init__(self):
        _check_choice("truncation", self.truncation, ("drop", "bootstrap"))
        check_bools(self, "normalize_advantages", "combine_advantages")
        bounds = {
            "clip_range": (0.0, None),
            "discounting_factor": (0.0, 1.0),
            "gae_lambda": (0.0, 1.0),
            "critic_loss_weight": (0.0, None),
            "target_kl": (0.0, None),
            "value_clip_range": (0.0, None),
        }
        for name, (low, high) in bounds.items():
            if getattr(self, name) is not None:
                check_coefficient(self, name, low, high)
        # Zero would erase every reward: the actor would learn from entropy alone.
        check_coefficient(self, "reward_scaling", 0.0, open_low=True)


def check_coefficient(
    config: Any,
    name: str,
    low: float,
    high: float | None = None,
    *,
    open_low: bool = False,
) -> None:
    """A concrete coefficient must be a finite scalar in `[low, high]` (`(low,
    high]` with `open_low`); traced values (configs built inside `jax.vmap`)
    are not checked."""
    kind, value = type(config).__name__, getattr(config, name)
    if not _is_concrete(value):
        return
    if value.ndim != 0:
        raise ValueError(
            f"{kind}({name}=array of shape {value.shape}): coefficients are "
            "scalars. To sweep one, build configs inside `jax.vmap`."
        )
    v = float(value)
    check_finite_value(kind, name, v)
    if v < low or (open_low and v == low) or (high is not None and v > high):
        lower = f"> {low}" if open_low else f">= {low}"
        upper = "" if high is None else f" and <= {high}"
        # float32's shortest repr: the value as the user wrote it (-0.001, not
        # -0.0010000000474974513).
        shown = str(np.float32(value))
        raise ValueError(f"{kind}({name}={shown}): must be {lower}{upper}.")


def _check_choice(
    name: str, value: Any, choices: tuple[str, ...], config: str = "PPOConfig"
) -> None:
    if value not in choices:
        raise ValueError(f"{config}({name}={value!r}): expected one of {choices}.")


EVAL_LEVELS_EXAMPLE = "LoggingLevel.ENV_METRICS | LoggingLevel.NETWORK_METRICS"
"""The evaluation flags, as a `check_flags` example."""


@register_config
@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Deterministic evaluation rollouts run by the driver.

    `max_episode_length` steps are run per env without resets. An env's
    return sums its rewards up to and including the step whose `done` ended
    its first episode; later steps count for nothing (see
    [`eqx_ppo.eval_rollout`][]).
    """

    enabled: bool = True
    every_steps: int = 50_000
    n_envs: int = 64
    max_episode_length: int = 1000
    logging_level: LoggingLevel = LoggingLevel.NONE
    logging_percentiles: tuple[int | float, ...] | None = (0, 25, 50, 75, 100)

    def __post_init__(self):
        percentiles = as_percentiles(self.logging_percentiles)
        object.__setattr__(self, "logging_percentiles", percentiles)
        check_bools(self, "enabled")
        check_positive_ints(self, "every_steps", "n_envs", "max_episode_length")
        check_flags(
            "EvalConfig",
            "logging_level",
            self.logging_level,
            LoggingLevel,
            EVAL_LEVELS_EXAMPLE,
        )
        check_percentiles("EvalConfig", self.logging_percentiles)


@register_config
@dataclasses.dataclass(frozen=True)
class VideoConfig:
    """Rendered evaluation episodes, passed to `video_fn` as `VideoData`."""

    enabled: bool = False
    every_steps: int = 200_000
    episode_length: int = 1000
    render_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"height": 240, "width": 320}
    )

    def __post_init__(self):
        check_bools(self, "enabled")
        check_positive_ints(self, "every_steps", "episode_length")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DriverConfig:
    """What the driver does around the learner's iterations: evaluation,
    video, seeds and the cadence of host events. `TrainConfig` and
    `DistillationTrainConfig` add their learner's config to it.

    **Arguments:**

    - `eval`, `video`: the sub-configs.
    - `seed`: the run's seed, used when the driver gets no `key`; with
      `n_seeds > 1`, seeds `seed .. seed+n_seeds-1` are trained together by
      one vmapped program.
    - `checkpoint_every_steps`: cadence of `checkpoint_fn` calls.
    - `log_every_steps`: cadence of host-side logging and progress; the driver
      compiles a loop of this many steps' iterations into one chunk.
    - `progress`: show a progress bar.
    """

    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    video: VideoConfig = dataclasses.field(default_factory=VideoConfig)
    seed: int = 17
    n_seeds: int = 1
    checkpoint_every_steps: int = 500_000
    log_every_steps: int | None = None
    progress: bool = True

    def free_on_resume(self) -> frozenset[str]:
        """The fields a resumed run may change: all but `n_seeds` (the learner's
        config is checked field by field)."""
        return frozenset(
            {"eval", "video", "seed", "checkpoint_every_steps", "log_every_steps"}
            | {"progress"}
        )

    def __post_init__(self):
        check_config_types(self, eval=EvalConfig, video=VideoConfig)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise TypeError(
                f"{type(self).__name__}(seed={self.seed!r}): the seed must be an "
                "int; for other randomness pass `key=` to the driver."
            )
        check_bools(self, "progress")
        check_positive_ints(self, "n_seeds", "checkpoint_every_steps")
        if self.log_every_steps is not None:
            check_positive_ints(self, "log_every_steps")


@register_config
@dataclasses.dataclass(frozen=True)
class TrainConfig(DriverConfig):
    """Everything `train_ppo` needs besides the env and the network: the
    [`eqx_ppo.PPOConfig`][] as `ppo`, and the driver's settings (see
    [`eqx_ppo.DriverConfig`][]: `eval`, `video`, `seed`, `n_seeds`,
    `checkpoint_every_steps`, `log_every_steps`, `progress`).
    """

    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)

    def __post_init__(self):
        check_config_types(self, ppo=PPOConfig)
        super().__post_init__()
