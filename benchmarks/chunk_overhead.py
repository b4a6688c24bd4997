"""The host's time per compiled chunk: what a run with many host events pays.

    python -m benchmarks.chunk_overhead [--env cartpole] [--n-envs 2048]
        [--hidden 32,32,32,32] [--iterations 100] [--per-chunk 1] [--reps 5]
        [--name NAME]

`train` runs compiled chunks of iterations between host events (logging,
evaluation, checkpoints). Each chunk boundary costs host work: passing the
states in and out of the program, fetching the metrics and building the log
rows; the driver does the last two while the next chunk runs, so the device
waits only for what the host cannot hide. This trains the same `--iterations`
iterations twice, as one chunk and as chunks of `--per-chunk` iterations (a
`log_fn` called every iteration), after one warm-up run of each so nothing
compiles in the timed runs. It alternates the two for `--reps` rounds. The
overhead per chunk is the difference of the median wall times divided by the
extra chunks; the rate ratio is the one chunk's time over the chunked run's (a
short run's chunks against a long run's). Run it on the accelerator whose
short runs you want to explain. Writes
`results/[<backend>_]chunk_overhead_<env>.{json,md}`.
"""

import argparse
from typing import Any

from ._common import alternated_medians_us, eqx_env, machine, publish


def run(
    env_name: str,
    n_envs: int,
    hidden: tuple[int, ...],
    iterations: int,
    reps: int,
    per_chunk: int = 1,
):
    import jax

    import eqx_ppo

    env = eqx_env(env_name)
    settings = {"n_envs": n_envs, "rollout_length": 20, "n_minibatches": 8}
    per_iteration = eqx_ppo.PPO(**settings).steps_per_iteration
    learner = eqx_ppo.PPO(**settings, total_steps=iterations * per_iteration)

    def networks(key):
        return eqx_ppo.make_mlp_actor_critic(
            env.observation_size, env.action_size, hidden, hidden, key=key
        )

    def train(chunks: int):
        config = eqx_ppo.TrainConfig(
            learner=learner,
            eval=eqx_ppo.EvalConfig(enabled=False),
            log_every_steps=learner.total_steps // chunks,
            progress=False,
        )
        result = eqx_ppo.train(
            env, networks, config, key=jax.random.key(0), log_fn=lambda m, s: None
        )
        return result.training_state

    chunks = iterations // per_chunk
    # The warm-up call of each compiles its chunk program.
    medians_us = alternated_medians_us(
        {"one": (train, (1,)), "many": (train, (chunks,))}, reps
    )
    one, many = medians_us["one"] / 1e6, medians_us["many"] / 1e6
    return {
        "env": env_name,
        "n_envs": n_envs,
        "hidden": list(hidden),
        "iterations": iterations,
        "per_chunk": per_chunk,
        "rounds": reps,
        "one_chunk_s": one,
        "chunked_s": many,
        "overhead_per_chunk_ms": 1e3 * (many - one) / (chunks - 1),
        "overhead_fraction": (many - one) / many,
        "rate_ratio": one / many,
    }


def markdown(result: dict[str, Any]) -> str:
    one, many, k = result["one_chunk_s"], result["chunked_s"], result["per_chunk"]
    return "\n".join(
        [
            f"### Host time per chunk: `{result['env']}`, {result['n_envs']} envs, "
            f"{'x'.join(map(str, result['hidden']))} MLPs",
            "",
            f"{result['iterations']} iterations as one chunk and as chunks of {k}, "
            f"{result['rounds']} alternated rounds, medians "
            f"(`python -m benchmarks.chunk_overhead --per-chunk {k}`).",
            "",
            f"| one chunk (s) | chunks of {k} (s) | host time per chunk (ms) | "
            "share of the chunked run | rate, chunked / one chunk |",
            "|---|---|---|---|---|",
            f"| {one:.3f} | {many:.3f} | {result['overhead_per_chunk_ms']:.3f} | "
            f"{100 * result['overhead_fraction']:.0f} % | "
            f"{result['rate_ratio']:.2f} |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="cartpole")
    parser.add_argument("--n-envs", type=int, default=2048)
    parser.add_argument("--hidden", default="32,32,32,32")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument(
        "--per-chunk", type=int, default=1, help="iterations per chunk, chunked run"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--name", default=None, help="results file stem")
    args = parser.parse_args(argv)
    started = machine()
    hidden = tuple(int(h) for h in args.hidden.split(","))
    if args.iterations % args.per_chunk or args.iterations == args.per_chunk:
        parser.error("--per-chunk must divide --iterations into 2 or more chunks")
    result = run(
        args.env, args.n_envs, hidden, args.iterations, args.reps, args.per_chunk
    )
    publish(args.name or f"chunk_overhead_{args.env}", result, markdown, started)


if __name__ == "__main__":
    main()
