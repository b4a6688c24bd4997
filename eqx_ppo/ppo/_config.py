"""Configuration of a PPO run: algorithm, evaluation, video and the driver."""

import dataclasses
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..logging import LoggingLevel


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _coefficient() -> Any:
    return eqx.field(converter=lambda v: jnp.asarray(v, jnp.float32))


class PPOConfig(eqx.Module):
    """The PPO algorithm's settings.

    Structural fields (sizes, counts, flags) are static: they fix array shapes
    and the compiled program. Coefficients (`learning_rate`, `clip_range`,
    `discounting_factor`, `gae_lambda`, `critic_loss_weight`) are float32
    arrays, so changing one does not recompile and `jax.vmap` can sweep them.

    **Arguments:**

    - `n_envs`: parallel environments; divisible by `n_minibatches`.
    - `rollout_length`: steps per env per iteration (`T`).
    - `total_steps`: env steps to train for (`n_envs * rollout_length` per
      iteration).
    - `n_epochs`, `n_minibatches`: passes over the rollout and minibatches per
      pass; minibatches split the *env* axis, each replaying whole sequences.
    - `normalize_advantages`: standardise advantages per minibatch.
    - `combine_advantages`: sum per-reward-key advantages into one advantage
      for every action log-likelihood (multi-head rewards).
    - `gradient_clipping`: global-norm clip, or `None`.
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
    - `check_finite`: raise, naming the iteration, if a loss or observation is
      non-finite (a debug option; costs a little speed).
    - `logging_level`, `logging_percentiles`: see [`eqx_ppo.LoggingLevel`][].
    """

    n_envs: int = eqx.field(static=True, default=256)
    rollout_length: int = eqx.field(static=True, default=20)
    total_steps: int = eqx.field(static=True, default=512_000)
    n_epochs: int = eqx.field(static=True, default=4)
    n_minibatches: int = eqx.field(static=True, default=4)
    normalize_advantages: bool = eqx.field(static=True, default=True)
    combine_advantages: bool = eqx.field(static=True, default=False)
    gradient_clipping: float | None = eqx.field(static=True, default=None)
    weight_decay: float | None = eqx.field(static=True, default=None)
    lr_schedule: Literal["constant", "linear", "cosine"] = eqx.field(
        static=True, default="constant"
    )
    truncation: Literal["drop", "bootstrap"] = eqx.field(static=True, default="drop")
    reset_mode: Literal["cached", "fresh"] = eqx.field(static=True, default="cached")
    check_finite: bool = eqx.field(static=True, default=False)
    logging_level: LoggingLevel = eqx.field(static=True, default=LoggingLevel.LOSSES)
    logging_percentiles: tuple[int | float, ...] | None = eqx.field(
        static=True, default=None
    )
    learning_rate: Float[Array, ""] = _coefficient()
    clip_range: Float[Array, ""] = _coefficient()
    discounting_factor: Float[Array, ""] = _coefficient()
    gae_lambda: Float[Array, ""] = _coefficient()
    critic_loss_weight: Float[Array, ""] = _coefficient()

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
        gradient_clipping: float | None = None,
        weight_decay: float | None = None,
        lr_schedule: Literal["constant", "linear", "cosine"] = "constant",
        truncation: Literal["drop", "bootstrap"] = "drop",
        reset_mode: Literal["cached", "fresh"] = "cached",
        check_finite: bool = False,
        logging_level: LoggingLevel = LoggingLevel.LOSSES,
        logging_percentiles: tuple[int | float, ...] | None = None,
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

    def __check_init__(self):
        check_iteration_settings(self)
        _check_choice("truncation", self.truncation, ("drop", "bootstrap"))
        bounds = {
            "learning_rate": (0.0, None),
            "clip_range": (0.0, None),
            "discounting_factor": (0.0, 1.0),
            "gae_lambda": (0.0, 1.0),
            "critic_loss_weight": (0.0, None),
        }
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            if value.ndim != 0 and _is_concrete(value):
                raise ValueError(
                    f"PPOConfig({name}=array of shape {value.shape}): coefficients "
                    "are scalars. To sweep one, build configs inside `jax.vmap`."
                )
            if _is_concrete(value) and value.ndim == 0:
                v = float(value)
                if v < low or (high is not None and v > high):
                    upper = "" if high is None else f" and <= {high}"
                    raise ValueError(f"PPOConfig({name}={v}): must be >= {low}{upper}.")

    @property
    def steps_per_iteration(self) -> int:
        """Env steps taken by one iteration: `n_envs * rollout_length`."""
        return self.n_envs * self.rollout_length

    @property
    def n_iterations(self) -> int:
        """Iterations needed to reach `total_steps` (rounded up)."""
        return -(-self.total_steps // self.steps_per_iteration)


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
    for name in (
        "n_envs",
        "rollout_length",
        "total_steps",
        "n_epochs",
        "n_minibatches",
    ):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{kind}({name}={value!r}): {name} must be a positive int."
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
        if value is not None and value < 0:
            raise ValueError(f"{kind}({name}={value}): must be >= 0 or None.")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Deterministic evaluation rollouts run by the driver.

    `max_episode_length` steps are run per env without resets; returns count
    only the steps before each env's first `done`.
    """

    enabled: bool = True
    every_steps: int = 50_000
    n_envs: int = 64
    max_episode_length: int = 1000
    logging_level: LoggingLevel = LoggingLevel.NONE
    logging_percentiles: tuple[int | float, ...] | None = (0, 25, 50, 75, 100)

    def __post_init__(self):
        for name in ("every_steps", "n_envs", "max_episode_length"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"EvalConfig({name}={getattr(self, name)}): must be >= 1."
                )


@dataclasses.dataclass(frozen=True)
class VideoConfig:
    """Rendered evaluation episodes, passed to `video_fn` as `VideoData`."""

    enabled: bool = False
    every_steps: int = 200_000
    episode_length: int = 1000
    render_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"height": 240, "width": 320}
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything `train_ppo` needs besides the env and the network.

    **Arguments:**

    - `ppo`, `eval`, `video`: the sub-configs.
    - `seed`: the run's seed; with `n_seeds > 1`, seeds `seed .. seed+n_seeds-1`
      are trained together by one vmapped program.
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

    def __post_init__(self):
        if self.n_seeds < 1:
            raise ValueError(f"TrainConfig(n_seeds={self.n_seeds}): must be >= 1.")
        if self.checkpoint_every_steps < 1:
            raise ValueError(
                f"TrainConfig(checkpoint_every_steps={self.checkpoint_every_steps}): "
                "must be >= 1."
            )
        if self.log_every_steps is not None and self.log_every_steps < 1:
            raise ValueError(
                f"TrainConfig(log_every_steps={self.log_every_steps}): must be >= 1."
            )
