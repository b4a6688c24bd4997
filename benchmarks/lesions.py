"""Every single-unit lesion of a layer: one vmapped program against a Python loop.

    python -m benchmarks.lesions [--units 4,8,16,32,64] [--n-envs 256] [--rounds 5]
                                 [--eager-max 16]

`eqx_ppo.analysis.unit_importance` evaluates the intact network and each of
its `U` single-unit lesions as one `jax.vmap` over a stack of masks, traced
and compiled once. The alternative a user would write is a Python loop of
`ablate` + `eval_rollout`, `U + 1` evaluations one after another, timed two
ways: as written in a notebook (`eval_rollout` called directly, which traces
and compiles its rollout at every call), and at its best, with the
evaluation under `eqx.filter_jit` so that the loop too compiles once (the
lesioned unit is an array, so every lesion reuses the program).

For an untrained LSTM actor-critic of `U` units on `recall` (5-step
episodes, `--n-envs` episodes per evaluation), the vmapped program and the
jitted loop are timed end to end: the first call (trace, compile, run) and,
as the median of `--rounds` further calls, the steady state. The eager loop
runs once, for `U <= --eager-max`. The lesions of the actor LSTM's output
are checked to give the same importances every way.
"""

import argparse
import statistics
import time

from ._common import cores, machine, publish


def _timed(fn) -> tuple[float, object]:
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - t0, out


def run(units: list[int], n_envs: int, rounds: int, eager_max: int) -> dict:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import eqx_ppo
    from eqx_ppo import analysis

    env = eqx_ppo.envs.make("recall")
    key = jax.random.key(1)
    rows = []
    for n_units in units:
        net = eqx_ppo.make_lstm_actor_critic(2, 1, n_units, key=jax.random.key(0))

        def lstm(n):
            return n.layers[1].action.layers[0]

        def vmapped(net=net):
            return analysis.unit_importance(
                env, net, lstm, n_envs=n_envs, max_episode_length=5, key=key
            )

        @eqx.filter_jit
        def mean_return(network):
            metrics = eqx_ppo.eval_rollout(
                env,
                eqx.nn.inference_mode(network),
                key,
                n_envs=n_envs,
                max_episode_length=5,
            )
            return metrics["eval/episode_reward/mean"]

        def eager_return(network):
            metrics = eqx_ppo.eval_rollout(
                env,
                eqx.nn.inference_mode(network),
                key,
                n_envs=n_envs,
                max_episode_length=5,
            )
            return metrics["eval/episode_reward/mean"]

        def loop(net=net, n_units=n_units, evaluate=mean_return):
            base = evaluate(net)
            lesioned = [
                evaluate(analysis.ablate(net, lstm, jnp.array([i])))
                for i in range(n_units)
            ]
            return base - jnp.stack(lesioned)

        first = {}
        first["vmapped"], fast = _timed(vmapped)
        first["loop"], slow = _timed(loop)
        steady = {"vmapped": [], "loop": []}
        for r in range(rounds):
            for name in ("vmapped", "loop")[r % 2 :] + ("vmapped", "loop")[: r % 2]:
                steady[name].append(_timed(vmapped if name == "vmapped" else loop)[0])
        difference = float(jnp.max(jnp.abs(fast - slow)))
        eager_s = None
        if n_units <= eager_max:
            eager_s, eager = _timed(lambda loop=loop: loop(evaluate=eager_return))
            difference = max(difference, float(jnp.max(jnp.abs(fast - eager))))
        rows.append(
            {
                "units": n_units,
                "first_s": first,
                "steady_s": {n: statistics.median(s) for n, s in steady.items()},
                "eager_loop_s": eager_s,
                "max_difference": difference,
            }
        )
        print(rows[-1], flush=True)
    return {"n_envs": n_envs, "episode_length": 5, "rounds": rounds, "rows": rows}


def markdown(result: dict) -> str:
    lines = [
        "### Unit importance: all single-unit lesions, one vmap against a loop",
        "",
        f"`recall`, untrained LSTM actor-critic, {result['n_envs']} episodes of "
        f"{result['episode_length']} steps per evaluation, U + 1 evaluations; "
        f"first call (trace + compile + run) and the median of {result['rounds']} "
        f"further calls, on {result['machine']['backend']} "
        f"({cores(result['machine'])}).",
        "",
        "| units U | eager loop (s) | jitted loop, first (s) | vmapped, first (s) "
        "| jitted loop, steady (ms) | vmapped, steady (ms) "
        "| jitted loop / vmapped, steady | max difference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        first, steady = row["first_s"], row["steady_s"]
        eager = "-" if row["eager_loop_s"] is None else f"{row['eager_loop_s']:.1f}"
        lines.append(
            f"| {row['units']} | {eager} | {first['loop']:.2f} "
            f"| {first['vmapped']:.2f} | {1e3 * steady['loop']:.1f} "
            f"| {1e3 * steady['vmapped']:.1f} "
            f"| {steady['loop'] / steady['vmapped']:.1f}x "
            f"| {row['max_difference']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", default="4,8,16,32,64")
    parser.add_argument("--n-envs", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--eager-max", type=int, default=16)
    parser.add_argument("--name", default="lesions")
    args = parser.parse_args(argv)
    started = machine()
    units = [int(u) for u in args.units.split(",")]
    result = run(units, args.n_envs, args.rounds, args.eager_max)
    publish(args.name, result, markdown, started)


if __name__ == "__main__":
    main()
