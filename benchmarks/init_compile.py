"""Where the initialisation's compile time goes: its parts, each compiled alone.

    python -m benchmarks.init_compile [--env inverted_pendulum] [--n-envs 2048]
        [--quick]

`train` initialises in one program: each seed's network built by the factory,
then `init` (the envs reset, the acting carry, the optimiser state). This
compiles, each alone: the network factory (4x32 MLPs, as `compare` builds
them), `init` on that network, the envs' `reset` and, for scale, their
`step`, and ten `[32, 32]` kernels drawn as `Dense` draws them (truncated
normal) and from a plain normal. Per program: XLA's compile seconds and the
lowered module's size in lines. The kernels show what one random draw costs
the compiler on the backend, whatever the network around it.
"""

import argparse
import functools
import time
from typing import Any

from ._common import Spec, eqx_env, machine, publish


def _compile(lowered: Any) -> dict[str, Any]:
    start = time.perf_counter()
    lowered.compile()
    return {
        "xla_s": time.perf_counter() - start,
        "hlo_lines": lowered.as_text().count("\n"),
    }


def _kernels(truncated: bool, shape: tuple[int, int]):
    import jax
    import jax.numpy as jnp

    init = (
        jax.nn.initializers.lecun_normal()
        if truncated
        else jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal")
    )

    def draw(key):
        return [init(k, shape, jnp.float32) for k in jax.random.split(key, 10)]

    return jax.jit(draw).lower(jax.random.key(0))


def run(env_name: str, n_envs: int, hidden: tuple[int, ...]) -> dict[str, Any]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import eqx_ppo

    from ._worker import eqx_network

    spec = Spec(env=env_name, n_envs=n_envs, hidden=hidden)
    env = eqx_env(env_name)
    factory = functools.partial(eqx_network, spec, env)
    network = factory(key=jax.random.key(1))
    learner = eqx_ppo.PPO(n_envs=n_envs, total_steps=n_envs * 20)
    keys = jax.random.split(jax.random.key(0), n_envs)
    states = jax.eval_shape(jax.vmap(env.reset), keys)
    actions = jax.ShapeDtypeStruct((n_envs, env.action_size), jnp.float32)
    kernel = (hidden[0], hidden[0])
    lowered = {
        "network factory": eqx.filter_jit(lambda k: factory(key=k)).lower(
            jax.random.key(1)
        ),
        "init on a built network": eqx.filter_jit(eqx_ppo.init).lower(
            env, network, learner, key=jax.random.key(0)
        ),
        f"env reset, {n_envs} envs": jax.jit(jax.vmap(env.reset)).lower(keys),
        f"env step, {n_envs} envs": jax.jit(jax.vmap(env.step)).lower(states, actions),
        f"10 kernels {kernel}, truncated normal": _kernels(True, kernel),
        f"10 kernels {kernel}, normal": _kernels(False, kernel),
    }
    return {
        "env": env_name,
        "n_envs": n_envs,
        "hidden": list(hidden),
        "programs": [{"program": name, **_compile(lo)} for name, lo in lowered.items()],
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    hidden = result["hidden"]
    lines = [
        f"### The initialisation's programs: `{result['env']}`, "
        f"{result['n_envs']} envs, {len(hidden)}x{hidden[0]} MLPs",
        "",
        f"Each program compiled alone, on {m.get('backend', '?')}.",
        "",
        "| program | XLA compile (s) | lowered module (lines) |",
        "|---|---|---|",
    ]
    for row in result["programs"]:
        lines.append(
            f"| {row['program']} | {row['xla_s']:.2f} | {row['hlo_lines']:,} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env", default="inverted_pendulum", choices=["inverted_pendulum", "cartpole"]
    )
    parser.add_argument("--n-envs", type=int, default=2048)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check)")
    parser.add_argument("--name", default=None, help="results file stem")
    args = parser.parse_args(argv)
    started = machine()
    if args.quick:
        result = run("cartpole", 4, (4, 4))
    else:
        result = run(args.env, args.n_envs, (32, 32, 32, 32))
    publish(args.name or f"init_compile_{result['env']}", result, markdown, started)


if __name__ == "__main__":
    main()
