"""Would another multi-seed layout pay? The two places the seed `vmap` loses.

    python -m benchmarks.layout [--seeds 16] [--envs-per-seed 64] [--rounds 100]

The profile of 16 seeds x 64 envs against one 1024-env run (`benchmarks/
README.md`, "Where eqx_ppo's time goes") puts most of the multi-seed loss in
the network's matmuls, which the seed `vmap` turns into batched GEMMs, and
some in the env step, batched over seeds as well as envs. This times each
against its alternatives, alternated per round:

- **GEMMs**: one Dense layer's forward and backward (`swish(x @ W)`, 4x32
  widths) on one minibatch per seed, `[S, rows, 32] x [S, 32, 32]`: as the
  batched GEMM the seed `vmap` makes, as a loop over seeds (`lax.map`), as
  `S` unrolled GEMMs, and, as a floor, one plain `[S * rows, 32] x [32, 32]`
  GEMM of the same FLOPs (what folding seeds into the rows would cost if
  every seed had the same weights, which they do not).
- **Env step**: 20 steps of Brax `inverted_pendulum` for `S x E` envs, as the
  nested `vmap` (seeds, then envs) and as one flat `vmap` over `S * E`
  (folding the seed axis into the env axis for the parameter-free env).
"""

import argparse

from ._common import alternated_medians_us, cores, eqx_env, machine, publish


def gemm_forms(seeds: int, rows: int, width: int = 32) -> dict:
    import jax
    import jax.numpy as jnp

    x_key, w_key = jax.random.split(jax.random.key(0))
    x = jax.random.normal(x_key, (seeds, rows, width))
    w = jax.random.normal(w_key, (seeds, width, width)) / width**0.5

    def layer(x, w):
        return jax.nn.swish(x @ w)

    def batched(w, x):
        return jnp.sum(jax.vmap(layer)(x, w) ** 2)

    def mapped(w, x):
        return jnp.sum(jax.lax.map(lambda xw: layer(*xw), (x, w)) ** 2)

    def unrolled(w, x):
        return sum(jnp.sum(layer(x[s], w[s]) ** 2) for s in range(seeds))

    def one_gemm(w, x):
        return jnp.sum(layer(x.reshape(seeds * rows, width), w[0]) ** 2)

    forms = {
        "batched GEMM (the seed vmap)": batched,
        "loop over seeds (lax.map)": mapped,
        "unrolled per-seed GEMMs": unrolled,
        "one GEMM, same FLOPs (floor)": one_gemm,
    }
    grads = {n: jax.jit(jax.grad(f, argnums=(0, 1))) for n, f in forms.items()}
    reference = grads["batched GEMM (the seed vmap)"](w, x)
    agree = {
        n: bool(jnp.allclose(g(w, x)[0], reference[0], rtol=1e-4, atol=1e-4))
        for n, g in grads.items()
        if n != "one GEMM, same FLOPs (floor)"
    }
    return {"fns": {n: (g, (w, x)) for n, g in grads.items()}, "agree": agree}


def env_forms(seeds: int, envs_per_seed: int, steps: int = 20) -> dict:
    import jax
    import jax.numpy as jnp

    env = eqx_env("inverted_pendulum")
    n = seeds * envs_per_seed
    flat_state = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), n))
    nested_state = jax.tree.map(
        lambda x: x.reshape((seeds, envs_per_seed) + x.shape[1:]), flat_state
    )
    action = jnp.full((n, env.action_size), 0.1)

    def run(step, state, action):
        def body(s, _):
            s = step(s, action)
            return s, jnp.sum(s.obs)

        return jax.lax.scan(body, state, None, length=steps)[1]

    flat = jax.jit(lambda s, a: run(jax.vmap(env.step), s, a))
    nested = jax.jit(lambda s, a: run(jax.vmap(jax.vmap(env.step)), s, a))
    nested_action = action.reshape(seeds, envs_per_seed, -1)
    same = bool(
        jnp.allclose(
            flat(flat_state, action), nested(nested_state, nested_action), rtol=1e-5
        )
    )
    return {
        "fns": {
            f"flat vmap over {n} envs": (flat, (flat_state, action)),
            f"nested vmap, {seeds} x {envs_per_seed}": (
                nested,
                (nested_state, nested_action),
            ),
        },
        "same": same,
    }


def run(seeds: int, envs_per_seed: int, rows: int, rounds: int) -> dict:
    gemm = gemm_forms(seeds, rows)
    env = env_forms(seeds, envs_per_seed)
    return {
        "seeds": seeds,
        "envs_per_seed": envs_per_seed,
        "rows": rows,
        "rounds": rounds,
        "gemm_us": alternated_medians_us(gemm["fns"], rounds),
        "gemm_gradients_agree": gemm["agree"],
        "env_us": alternated_medians_us(env["fns"], rounds),
        "env_results_agree": env["same"],
    }


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"### Multi-seed layouts: {result['seeds']} seeds",
        "",
        f"Median of {result['rounds']} alternated rounds, {m['backend']} ({cores(m)}).",
        "",
        f"One 32x32 swish Dense layer, forward + backward, {result['rows']} rows "
        "per seed:",
        "",
        "| form | us | vs the batched GEMM |",
        "|---|---|---|",
    ]
    gemm = result["gemm_us"]
    base = gemm["batched GEMM (the seed vmap)"]
    lines += [f"| {n} | {us:.0f} | {base / us:.2f}x |" for n, us in gemm.items()]
    lines += [
        "",
        f"20 steps of Brax `inverted_pendulum`, {result['envs_per_seed']} envs "
        "per seed:",
        "",
        "| form | ms |",
        "|---|---|",
    ]
    lines += [f"| {n} | {us / 1e3:.2f} |" for n, us in result["env_us"].items()]
    agree = all(result["gemm_gradients_agree"].values()) and result["env_results_agree"]
    lines += ["", f"Same results across forms: {'yes' if agree else 'NO'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--envs-per-seed", type=int, default=64)
    parser.add_argument(
        "--rows", type=int, default=160, help="minibatch rows per seed (64 x 20 / 8)"
    )
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--name", default="layout")
    args = parser.parse_args(argv)
    started = machine()
    result = run(args.seeds, args.envs_per_seed, args.rows, args.rounds)
    publish(args.name, result, markdown, started)


if __name__ == "__main__":
    main()
