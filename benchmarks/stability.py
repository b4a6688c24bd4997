"""Stability over seeds: does training reach its target on every seed, and stay there?

For each env, trains `--seeds` seeds (16 by default) in one vmapped program at
the settings our docs and tests use, evaluates every seed deterministically at
a fixed cadence, and reports per env the median, 10th percentile and worst
final return, and the **collapse rate**: the share of seeds whose eval return
fell below `collapsed` after having reached `reached`.

    python -m benchmarks.stability [--seeds 16] [--envs move_to_center,recall]
        [--label after] [--override '{"lr_schedule": "linear"}']

Writes `results/stability_<label>.{json,md}`. The script only sets the env,
the network and the settings a user would set, so running it on an older
checkout (`PYTHONPATH=<checkout> python benchmarks/stability.py`) measures
that checkout's defaults.
"""

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

import eqx_ppo
from eqx_ppo import envs

if __package__:
    from ._common import cores, device_info, machine
else:  # run as a file, e.g. against another checkout: `_common` is beside it
    from _common import cores, device_info, machine

RESULTS = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class Case:
    """One env at one documented setting, with its success and collapse levels."""

    name: str
    make_env: Callable[[], Any]
    network: Callable[[Any, Any], Any]
    total_steps: int
    eval_every: int
    eval_length: int
    reached: float
    collapsed: float
    optimum: str
    learner: dict[str, Any]
    reward_scaling: float = 1.0


def _mlp(hidden, discrete=False):
    def network(env, key):
        actions = env.n_actions if discrete else env.action_size
        return eqx_ppo.make_mlp_actor_critic(
            env.observation_size, actions, hidden, hidden, key=key, discrete=discrete
        )

    return network


def _lstm(size, discrete=False):
    def network(env, key):
        actions = env.n_actions if discrete else env.action_size
        return eqx_ppo.make_lstm_actor_critic(
            env.observation_size, actions, size, key=key, discrete=discrete
        )

    return network


def two_arm_network(env, key):
    """`two_arm`'s dict actions and rewards: one sampler and one value head
    per arm."""
    k = iter(jax.random.split(key, 4))
    nn = eqx_ppo.nn
    return nn.Sequential(
        [
            nn.Flattener(),
            nn.Normalizer(8),
            nn.PPOAdapter(
                action=nn.Sequential(
                    [
                        nn.Dense(8, 32, key=next(k), activation="swish"),
                        nn.Dense(32, 8, key=next(k)),
                        nn.Splitter(arm1=4, arm2=4),
                        nn.Map(
                            arm1=nn.NormalTanhSampler(1e-2, min_std=0.1),
                            arm2=nn.NormalTanhSampler(1e-2, min_std=0.1),
                        ),
                    ]
                ),
                # One value head per reward key.
                value=nn.Sequential(
                    [
                        nn.Dense(8, 32, key=next(k), activation="swish"),
                        nn.Dense(32, 2, key=next(k)),
                        nn.Splitter(arm1=1, arm2=1),
                    ]
                ),
            ),
        ]
    )


def _gymnax(name, **params):
    def make():
        import gymnax

        env, default = gymnax.make(name)
        return envs.GymnaxAdapter(env, default.replace(**params))

    return make


def _cartpole(name, **ppo):
    """The built-in `cartpole` at 256 envs x 20 steps, 8 minibatches, 4x32
    swish, reward scaling 10, 1.024M steps; `ppo` sets the rest."""
    return Case(
        name,
        lambda: envs.make("cartpole"),
        _mlp([32, 32, 32, 32]),
        1_024_000,
        102_400,
        500,
        reached=400.0,
        collapsed=200.0,
        optimum="500 (random about 26)",
        learner=dict(n_envs=256, rollout_length=20, n_minibatches=8, **ppo),
        reward_scaling=10.0,
    )


CASES = {
    # docs/getting-started.md's "Training from Python" run.
    "move_to_center": Case(
        "move_to_center",
        lambda: envs.make("move_to_center"),
        _mlp([32, 32]),
        100_000,
        5_120,
        20,
        reached=-3.0,
        collapsed=-6.0,
        optimum="-2.0 (random about -20)",
        learner=dict(n_envs=64, rollout_length=20, learning_rate=3e-3),
    ),
    "parrot": Case(
        "parrot",
        lambda: envs.make("parrot"),
        _mlp([32]),
        150_000,
        12_800,
        10,
        reached=8.0,
        collapsed=6.0,
        optimum="10 (a constant action about 4)",
        learner=dict(
            n_envs=64,
            rollout_length=20,
            learning_rate=3e-3,
            gae_lambda=0.0,
            discounting_factor=0.0,
        ),
    ),
    "recall": Case(
        "recall",
        lambda: envs.make("recall"),
        _lstm(16),
        60_000,
        5_120,
        5,
        reached=4.0,
        collapsed=2.0,
        optimum="5 (feed-forward at most 1)",
        learner=dict(n_envs=64, rollout_length=10, learning_rate=1e-2),
    ),
    "two_arm": Case(
        "two_arm",
        lambda: envs.make("two_arm"),
        two_arm_network,
        120_000,
        12_800,
        20,
        reached=-2.9,
        collapsed=-6.0,
        optimum="-2.4 (random about -30)",
        learner=dict(n_envs=64, rollout_length=20, learning_rate=3e-3),
    ),
    # The setting `CartPole`'s docstring recommends.
    "cartpole": _cartpole(
        "cartpole",
        learning_rate=1e-3,
        lr_schedule="linear",
        normalize_advantages=False,
    ),
    # The side-by-side setting of benchmarks/quality.py (its discount too).
    "cartpole_side_by_side": _cartpole(
        "cartpole_side_by_side", learning_rate=3e-4, discounting_factor=0.97
    ),
    "gymnax_memory_chain": Case(
        "gymnax_memory_chain",
        _gymnax("MemoryChain-bsuite", memory_length=10),
        _lstm(32, discrete=True),
        100_000,
        5_120,
        12,
        reached=0.9,
        collapsed=0.5,
        optimum="1.0 (memoryless 0)",
        learner=dict(n_envs=64, rollout_length=16, learning_rate=3e-3),
    ),
    "gymnax_cartpole": Case(
        "gymnax_cartpole",
        _gymnax("CartPole-v1"),
        _mlp([32, 32], discrete=True),
        100_000,
        8_192,
        500,
        reached=400.0,
        collapsed=200.0,
        optimum="500 (random about 20)",
        learner=dict(n_envs=64, rollout_length=32, learning_rate=3e-3),
    ),
    "gymnax_acrobot": Case(
        "gymnax_acrobot",
        _gymnax("Acrobot-v1"),
        _mlp([32, 32], discrete=True),
        500_000,
        32_768,
        500,
        reached=-120.0,
        collapsed=-300.0,
        optimum="about -60 (random -500)",
        learner=dict(n_envs=64, rollout_length=32, learning_rate=3e-3),
    ),
}


def curves(
    case: Case, n_seeds: int, seed: int, override: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """Train `n_seeds` seeds in one program; eval steps and `[eval, seed]` returns.

    `override` replaces `PPO` settings of the case (an A/B experiment)."""
    env = case.make_env()
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            **{"total_steps": case.total_steps, **case.learner, **override}
        ),
        eval=eqx_ppo.EvalConfig(
            every_steps=case.eval_every,
            n_envs=32,
            max_episode_length=case.eval_length,
            logging_percentiles=None,
        ),
        seed=seed,
        n_seeds=n_seeds,
        progress=False,
    )
    train_env = env
    if case.reward_scaling != 1.0:
        train_env = envs.RewardScalingWrapper(env, case.reward_scaling)
    with jax.numpy_dtype_promotion("standard"):
        result = eqx_ppo.train(
            train_env, lambda k: case.network(env, k), config, eval_env=env
        )
    steps = np.array([r["step"] for r in result.eval_history])
    returns = np.array(
        [np.atleast_1d(r["eval/episode_reward/mean"]) for r in result.eval_history]
    )
    return steps, returns


def collapsed_seeds(
    returns: np.ndarray, reached: float, collapsed: float, held: int = 1
) -> int:
    """Seeds whose return fell below `collapsed` after first reaching `reached`
    in `held` evaluations in a row.

    `held=2` leaves out an early evaluation that scored far above the policy
    being trained and fell back to it (the FAQ, "Why did my run collapse?")."""
    count = 0
    for curve in returns.T:
        above = np.convolve(curve >= reached, np.ones(held), "valid") == held
        hit = np.nonzero(above)[0]
        if hit.size and np.any(curve[hit[0] + held :] < collapsed):
            count += 1
    return count


def summarise(case: Case, steps: np.ndarray, returns: np.ndarray, wall: float):
    final = returns[-1]
    return {
        "env": case.name,
        "seeds": int(final.size),
        "total_steps": int(steps[-1]),
        "median": float(np.median(final)),
        "p10": float(np.percentile(final, 10)),
        "worst": float(np.min(final)),
        "reached": int(np.sum(np.any(returns >= case.reached, axis=0))),
        "collapsed": collapsed_seeds(returns, case.reached, case.collapsed),
        "reached_level": case.reached,
        "collapsed_level": case.collapsed,
        "optimum": case.optimum,
        "settings": case.learner,
        "wall_s": wall,
        "curves": returns.T.tolist(),
        "eval_steps": steps.tolist(),
    }


def markdown(rows: list[dict[str, Any]], label: str, m: dict[str, Any]) -> str:
    """The table of `rows`, headed by the machine `m` that trained them
    (float results, and so the curves, differ from one CPU to another)."""
    lines = [
        f"## Stability over seeds ({label})",
        "",
        f"JAX {m['jax']} on {cores(m)}.",
        "",
        "| env | seeds | final median | p10 | worst | reached | collapsed "
        "| levels (reach / collapse) | optimum | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['seeds']} | {r['median']:.3g} | {r['p10']:.3g} "
            f"| {r['worst']:.3g} | {r['reached']}/{r['seeds']} "
            f"| {r['collapsed']}/{r['seeds']} "
            f"| {r['reached_level']:g} / {r['collapsed_level']:g} "
            f"| {r['optimum']} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--envs", default=",".join(CASES))
    parser.add_argument("--label", default="after")
    parser.add_argument(
        "--override",
        type=json.loads,
        default={},
        help='`PPO` settings for every env, e.g. \'{"lr_schedule": "linear"}\'',
    )
    args = parser.parse_args(argv)
    meta = {
        "label": args.label,
        "first_seed": args.seed,
        "override": args.override,
        "eqx_ppo": getattr(eqx_ppo, "__version__", "unknown"),
        "machine": {**machine(), **device_info()},
    }
    path = RESULTS / f"stability_{args.label}"
    RESULTS.mkdir(exist_ok=True)
    rows = []
    for name in args.envs.split(","):
        case = CASES[name]
        t0 = time.perf_counter()
        steps, returns = curves(case, args.seeds, args.seed, args.override)
        rows.append(summarise(case, steps, returns, time.perf_counter() - t0))
        r = rows[-1]
        print(
            f"{name}: median {r['median']:.3g} p10 {r['p10']:.3g} worst "
            f"{r['worst']:.3g} collapsed {r['collapsed']}/{r['seeds']} "
            f"({r['wall_s']:.0f} s)",
            flush=True,
        )
        # Written after every env, so a long run's finished rows are kept.
        path.with_suffix(".json").write_text(
            json.dumps({"meta": meta, "rows": rows}, indent=1)
        )
        path.with_suffix(".md").write_text(markdown(rows, args.label, meta["machine"]))
    print(markdown(rows, args.label, meta["machine"]))


if __name__ == "__main__":
    main()
