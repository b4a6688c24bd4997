"""Are the cart-pole "collapses" real? Each checkpoint, evaluated both ways.

    python -m benchmarks.dips [--seeds 16]

`stability.py` counts a seed as collapsed when its deterministic eval return
fell below the collapse level after once reaching the success level. On the
built-in `cartpole` about a quarter of the seeds do, whatever the PPO
setting. This trains the stability case's `cartpole` (same network and
settings, 16 seeds in one vmapped program), keeps the networks at every
102,400 steps, and evaluates each one twice with the same key: in inference
mode (the mean action, as `stability.py` and every eval do) and stochastically
(sampling actions, the policy PPO trains). A dip that the stochastic policy
does not share is the deterministic controller's luck, not a learned policy
falling apart.

Writes `results/dips_cartpole.{json,md}`.
"""

import argparse

import numpy as np

from ._common import machine, publish


def run(n_seeds: int, checkpoint_every: int = 102_400) -> dict:
    import equinox as eqx
    import jax

    import eqx_ppo
    from eqx_ppo import envs
    from eqx_ppo.ppo import eval_rollout

    from .stability import CASES, collapsed_seeds

    case = CASES["cartpole_side_by_side"]
    env = case.make_env()
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(total_steps=case.total_steps, **case.learner),
        eval=eqx_ppo.EvalConfig(enabled=False),
        seed=0,
        n_seeds=n_seeds,
        checkpoint_every_steps=checkpoint_every,
        progress=False,
    )
    kept = []

    def keep(state, step):
        # The run reuses the state's buffers: keep a host copy.
        kept.append((step, jax.device_get(state.network)))

    @eqx.filter_jit
    def evaluate(network, key):
        metrics = eval_rollout(
            env, network, key, n_envs=32, max_episode_length=case.eval_length
        )
        return metrics["eval/episode_reward/mean"]

    with jax.numpy_dtype_promotion("standard"):
        eqx_ppo.train(
            envs.RewardScalingWrapper(env, case.reward_scaling),
            lambda k: case.network(env, k),
            config,
            checkpoint_fn=keep,
        )
        returns = {"deterministic": [], "stochastic": []}
        for i, (_, networks) in enumerate(kept):
            key = jax.random.key(1000 + i)
            per_seed = [eqx_ppo.select_seed(networks, s) for s in range(n_seeds)]
            returns["deterministic"].append(
                [float(evaluate(eqx.nn.inference_mode(n), key)) for n in per_seed]
            )
            returns["stochastic"].append([float(evaluate(n, key)) for n in per_seed])
    collapsed = {
        how: collapsed_seeds(np.array(r), case.reached, case.collapsed)
        for how, r in returns.items()
    }
    return {
        "env": case.name,
        "seeds": n_seeds,
        "steps": [step for step, _ in kept],
        "returns": returns,
        "collapsed": collapsed,
        "reached_level": case.reached,
        "collapsed_level": case.collapsed,
        "settings": case.learner,
    }


def markdown(result: dict) -> str:
    steps = result["steps"]
    lines = [
        f"### Cart-pole dips, deterministic vs stochastic eval "
        f"({result['seeds']} seeds)",
        "",
        f"Each seed's eval return (32 envs) at every checkpoint, as "
        f"deterministic / stochastic, same key. Collapsed (fell below "
        f"{result['collapsed_level']:g} after reaching "
        f"{result['reached_level']:g}): deterministic "
        f"{result['collapsed']['deterministic']}/{result['seeds']}, stochastic "
        f"{result['collapsed']['stochastic']}/{result['seeds']}.",
        "",
        "| seed | " + " | ".join(f"{s // 1000}k" for s in steps) + " |",
        "|---|" + "---|" * len(steps),
    ]
    det = np.array(result["returns"]["deterministic"]).T
    sto = np.array(result["returns"]["stochastic"]).T
    for seed, (d, s) in enumerate(zip(det, sto, strict=True)):
        cells = [f"{a:.0f} / {b:.0f}" for a, b in zip(d, s, strict=True)]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--name", default="dips_cartpole", help="results file stem")
    args = parser.parse_args(argv)
    started = machine()
    publish(args.name, run(args.seeds), markdown, started)


if __name__ == "__main__":
    main()
