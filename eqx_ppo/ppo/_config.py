"""The run's configuration: the learner, evaluation, video and host cadences."""

import dataclasses
from typing import Any

from .._typecheck import Int, check_range, checked
from ..checkpoint import register_config
from ..logging import LoggingLevel
from ._learner import PPO, AbstractLearner, Percentile


@register_config
@checked
@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Deterministic evaluation rollouts run by the driver: every `every_steps`
    env steps, `n_envs` envs, one episode each (see [`eqx_ppo.eval_rollout`][]).
    """

    enabled: bool = True
    every_steps: Int = 50_000
    n_envs: Int = 64
    max_episode_length: Int = 1000
    logging_level: LoggingLevel = LoggingLevel.NONE
    logging_percentiles: tuple[Percentile, ...] | None = (0, 25, 50, 75, 100)

    def __post_init__(self):
        for name in ("every_steps", "n_envs", "max_episode_length"):
            check_range(f"EvalConfig({name}=", getattr(self, name), 1)


@register_config
@checked
@dataclasses.dataclass(frozen=True)
class VideoConfig:
    """Rendered evaluation episodes, passed to `video_fn` as `VideoData`."""

    enabled: bool = False
    every_steps: Int = 200_000
    episode_length: Int = 1000
    render_kwargs: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"height": 240, "width": 320}
    )

    def __post_init__(self):
        for name in ("every_steps", "episode_length"):
            check_range(f"VideoConfig({name}=", getattr(self, name), 1)


@register_config
@checked
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything [`eqx_ppo.train`][] needs besides the env and the network.

    **Arguments** (keyword-only):

    - `learner`: the algorithm and its settings, e.g. `eqx_ppo.PPO(...)`.
    - `eval`, `video`: [`eqx_ppo.EvalConfig`][], [`eqx_ppo.VideoConfig`][].
    - `seed`: the first seed, in `[0, 2**32)`, when `train` gets no `key`.
    - `n_seeds`: how many seeds one vmapped program trains together.
    - `checkpoint_every_steps`: cadence of `checkpoint_fn` calls.
    - `log_every_steps`: cadence of the compiled chunks, and so of the progress bar
      (default: about 50 chunks a run, of at least 5 iterations).
    - `progress`: show a progress bar.
    """

    learner: AbstractLearner = dataclasses.field(default_factory=PPO)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    video: VideoConfig = dataclasses.field(default_factory=VideoConfig)
    seed: Int = 17
    n_seeds: Int = 1
    checkpoint_every_steps: Int = 500_000
    log_every_steps: Int | None = None
    progress: bool = True

    def __post_init__(self):
        for name in ("n_seeds", "checkpoint_every_steps", "log_every_steps"):
            check_range(f"TrainConfig({name}=", getattr(self, name), 1)
        # PRNG seeds are 32-bit: `jax.random.key(2**32)` is `jax.random.key(0)`.
        check_range("TrainConfig(seed=", self.seed, 0, 2**32 - self.n_seeds)

    def free_on_resume(self) -> frozenset[str]:
        """The fields a resumed run may change: all but `n_seeds` (the
        learner is compared setting by setting)."""
        names = {f.name for f in dataclasses.fields(self)}
        return frozenset(names - {"n_seeds", "learner"})
