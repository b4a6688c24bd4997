"""Configuration of a PPO run: algorithm, evaluation, video and the driver."""

import dataclasses
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..checkpoint import register_config
from ..logging import LoggingLevel
from ._validate import (
    check_config_types,
    check_finite_value,
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


@register_config
class PPOConfig(eqx.Module):
    """The PPO algorithm's settings.

    Structural fields (sizes, counts, flags) are static: they fix array shapes
    and the compiled program. Coefficients (`learning_rate`, `clip_range`,
    `discounting_factor`, `gae_lambda`, `critic_loss_weight`, and `target_kl`
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
    - `normalize_advantages`: standardise advantages per minibatch.
    - `combine_advantages`: sum per-reward-key advantages into one advantage
      for every action log-likelihood (multi-head rewards).
    - `gradient_clipping`: global-norm clip (default 0.5, as in CleanRL and
      Stable-Baselines3), or `None` for none.
    - `target_kl`: stop the epoch loop early once a minibatch's approximate
      KL divergence from the rollout policy (`mean((r - 1) - log r)`, `r` the
      probability ratio) exceeds `1.5 * target_kl`: that minibatch and every
      later one of the iteration skip their update (Stable-Baselines3's rule).
      `None` (default) never stops. The fraction of skipped updates is logged
      as `losses/kl_stopped`.
    - `value_clip_range`: clip the value loss as CleanRL's `clip_vloss`:
      `max((V - t)^2, (V_old + clip(V - V_old, -c, c) - t)^2)`, with `V_old`
      the rollout's value. `None` (default) for the plain squared error.
    - `weight_decay`: AdamW decoupled weight decay, or `None` for Adam.
    - `lr_schedule`: `"constant"`, `"linear"` (to 0 at `total_steps`) or
      `"cosine"` (to 0 at `total_steps`).
    - `truncation`: `"drop"` zeroes the advantage of a time-limit step
      (nnx-ppo and Brax behaviour); `"bootstrap"` bootstraps it from the value
      of the terminal observation.
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

    n_envs: int = eqx.field(static=True, default=256)
    rollout_length: int = eqx.field(static=True, default=20)
    total_steps: int = eqx.field(static=True, default=512_000)
    n_epochs: int = eqx.field(static=True, default=4)
    n_minibatches: int = eqx.field(static=True, default=4)
    normalize_advantages: bool = eqx.field(static=True, default=True)
    combine_advantages: bool = eqx.field(static=True, default=False)
    gradient_clipping: float | None = eqx.field(static=True, default=0.5)
    weight_decay: float | None = eqx.field(static=True, default=None)
    lr_schedule: Literal["constant", "linear", "cosine"] = eqx.field(
        static=True, default="constant"
    )
    truncation: Literal["drop", "bootstrap"] = eqx.field(static=True, default="drop")
    reset_mode: Literal["cached", "fresh"] = eqx.field(static=True, default="cached")
    check_finite: bool = eqx.field(static=True, default=True)
    logging_level: LoggingLevel = eqx.field(static=True, default=LoggingLevel.LOSSES)
    logging_percentiles: tuple[int | float, ...] | None = eqx.field(
        static=True, default=None
    )
    learning_rate: Float[Array, ""] = _coefficient()
    clip_range: Float[Array, ""] = _coefficient()
    discounting_factor: Float[Array, ""] = _coefficient()
    gae_lambda: Float[Array, ""] = _coefficient()
    critic_loss_weight: Float[Array, ""] = _coefficient()
    target_kl: Float[Array, ""] | None = _optional_coefficient()
    value_clip_range: Float[Array, ""] | None = _optional_coefficient()

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
        weight_decay: float | None = None,
        lr_schedule: Literal["constant", "linear", "cosine"] = "constant",
        truncation: Literal["drop", "bootstrap"] = "drop",
        reset_mode: Literal["cached", "fresh"] = "cached",
        check_finite: bool = True,
        logging_level: LoggingLevel = LoggingLevel.LOSSES,
        logging_percentiles: tuple[int | float, ...] | None = None,
        target_kl: float | Array | None = None,
        value_clip_range: float | Array | None = None,
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
        self.logging_percentiles = (
            None if logging_percentiles is None else tuple(logging_percentiles)
        )
        self.learning_rate = learning_rate
        self.clip_range = clip_range
        self.discounting_factor = discounting_factor
        self.gae_lambda = gae_lambda
        self.critic_loss_weight = critic_loss_weight
        self.target_kl = target_kl
        self.value_clip_range = value_clip_range

    def __check_init__(self):
        check_iteration_settings(self)
        _check_choice("truncation", self.truncation, ("drop", "bootstrap"))
        check_percentiles("PPOConfig", self.logging_percentiles)
        bounds = {
            "learning_rate": (0.0, None),
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

    @property
    def steps_per_iteration(self) -> int:
        """Env steps taken by one iteration: `n_envs * rollout_length`."""
        return self.n_envs * self.rollout_length

    @property
    def n_iterations(self) -> int:
        """Iterations needed to reach `total_steps` (rounded up)."""
        return -(-self.total_steps // self.steps_per_iteration)

    def free_on_resume(self) -> frozenset[str]:
        """The fields a resumed run may change (see `load_checkpoint(config=)`)."""
        return iteration_free_on_resume(self)


def iteration_free_on_resume(config: Any) -> frozenset[str]:
    """What `PPOConfig` and `DistillationConfig` let a resumed run change:
    logging and the finite check, and `total_steps` under a constant learning
    rate (a decaying schedule's every rate depends on it)."""
    free = {"logging_level", "logging_percentiles", "check_finite"}
    if config.lr_schedule == "constant":
        free.add("total_steps")
    return frozenset(free)


DRIVER_FREE_ON_RESUME = frozenset(
    {"eval", "video", "seed", "checkpoint_every_steps", "log_every_steps", "progress"}
)
"""The driver settings a resumed run may change: all but `n_seeds`."""


def check_coefficient(
    config: Any, name: str, low: float, high: float | None = None
) -> None:
    """A concrete coefficient must be a finite scalar in `[low, high]`; traced
    values (configs built inside `jax.vmap`) are not checked."""
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
    if v < low or (high is not None and v > high):
        upper = "" if high is None else f" and <= {high}"
        raise ValueError(f"{kind}({name}={v}): must be >= {low}{upper}.")


def _check_choice(
    name: str, value: Any, choices: tuple[str, ...], config: str = "PPOConfig"
) -> None:
    if value not in choices:
        raise ValueError(f"{config}({name}={value!r}): expected one of {choices}.")


def check_iteration_settings(config: Any) -> None:
    """The checks `PPOConfig` and `DistillationConfig` share: positive int
    sizes, env minibatches that divide `n_envs`, a known schedule and reset
    mode, and non-negative optional clipping and weight decay."""
    kind = type(config).__name__
    check_positive_ints(
        config, "n_envs", "rollout_length", "total_steps", "n_epochs", "n_minibatches"
    )
    if config.n_envs % config.n_minibatches:
        raise ValueError(
            f"{kind}(n_envs={config.n_envs}, n_minibatches={config.n_minibatches}): "
            "n_envs must be divisible by n_minibatches because minibatches split "
            "the env axis. Choose e.g. n_envs="
            f"{config.n_minibatches * max(1, config.n_envs // config.n_minibatches)}."
        )
    choices = {
        "lr_schedule": ("constant", "linear", "cosine"),
        "reset_mode": ("cached", "fresh"),
    }
    for name, allowed in choices.items():
        _check_choice(name, getattr(config, name), allowed, kind)
    for name in ("gradient_clipping", "weight_decay"):
        value = getattr(config, name)
        if value is None:
            continue
        check_finite_value(kind, name, value)
        if value < 0:
            raise ValueError(f"{kind}({name}={value}): must be >= 0 or None.")


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
        check_positive_ints(self, "every_steps", "n_envs", "max_episode_length")
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


@register_config
@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything `train_ppo` needs besides the env and the network.

    **Arguments:**

    - `ppo`, `eval`, `video`: the sub-configs.
    - `seed`: the run's seed, used when `train_ppo` gets no `key`; with
      `n_seeds > 1`, seeds `seed .. seed+n_seeds-1` are trained together by
      one vmapped program.
    - `checkpoint_every_steps`: cadence of `checkpoint_fn` calls.
    - `log_every_steps`: cadence of host-side logging and progress; the driver
      compiles this many steps' iterations into one `lax.scan` chunk.
    - `progress`: show a progress bar.
    """

    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    video: VideoConfig = dataclasses.field(default_factory=VideoConfig)
    seed: int = 17
    n_seeds: int = 1
    checkpoint_every_steps: int = 500_000
    log_every_steps: int | None = None
    progress: bool = True

    def free_on_resume(self) -> frozenset[str]:
        """The fields a resumed run may change; `ppo` is checked field by field."""
        return DRIVER_FREE_ON_RESUME

    def __post_init__(self):
        check_config_types(self, ppo=PPOConfig, eval=EvalConfig, video=VideoConfig)
        check_positive_ints(self, "n_seeds", "checkpoint_every_steps")
        if self.log_every_steps is not None:
            check_positive_ints(self, "log_every_steps")
