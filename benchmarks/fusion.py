"""Would a fused actor-critic be faster? The two MLP chains, three ways.

    python -m benchmarks.fusion [--rows 640] [--hidden 32,32,32,32] [--rounds 300]

The default factories give the actor and the critic MLPs of the same hidden
shapes. Fusing them means evaluating both chains as one computation. This
times the forward and backward pass (`jax.grad` of a loss on both heads) of
exactly those two chains on one minibatch (`--rows`: 640 is one of 8
minibatches of 256 envs x 20 steps), with the weights of
`make_mlp_actor_critic`, in three forms:

- `separate`: two chains of `x @ W + b` (what the library runs);
- `stacked`: the hidden layers' weights stacked on a leading axis of 2, one
  batched matmul per layer (stored stacked, so no stacking cost is counted:
  the most favourable case);
- `block-diagonal`: one `[rows, 2h]` chain whose kernels are the two
  kernels on a block diagonal (one plain matmul per layer, twice the FLOPs).

All three are checked to give the same gradients; rounds alternate the forms,
and each form's median is reported with its ratio to `separate`. If neither
fused form is faster here, fusion cannot speed up the whole `step`, of
which these chains are a part.
"""

import argparse

from ._common import alternated_medians_us, cores, machine, publish


def _forms(obs_size: int, action_size: int, hidden: tuple[int, ...], key):
    import jax
    import jax.numpy as jnp

    import eqx_ppo

    net = eqx_ppo.make_mlp_actor_critic(
        obs_size, action_size, hidden, hidden, key=key, normalize_obs=False
    )
    ports = net.layers[0]
    actor = [(d.kernel, d.bias) for d in ports.action.layers[:-1]]
    critic = [(d.kernel, d.bias) for d in ports.value.layers]

    def chain(params, x):
        for i, (w, b) in enumerate(params):
            x = x @ w + b
            if i < len(params) - 1:
                x = jax.nn.swish(x)
        return x

    def heads_loss(actor_out, value_out):
        return jnp.sum(actor_out**2) + jnp.sum(value_out**2)

    def separate(params, x):
        actor, critic = params
        return heads_loss(chain(actor, x), chain(critic, x))

    def stacked(params, x):
        weights, biases, actor_head, critic_head = params
        h = jnp.broadcast_to(x, (2, *x.shape))
        for w, b in zip(weights, biases, strict=True):
            h = jax.nn.swish(jnp.einsum("kri,kio->kro", h, w) + b[:, None])
        return heads_loss(chain([actor_head], h[0]), chain([critic_head], h[1]))

    def block_diagonal(params, x):
        actor, critic = params
        width = actor[-1][0].shape[1]
        h = x
        for i, ((wa, ba), (wv, bv)) in enumerate(zip(actor, critic, strict=True)):
            if i == 0:
                w = jnp.concatenate([wa, wv], axis=1)
            else:
                w = jnp.block(
                    [
                        [wa, jnp.zeros((wa.shape[0], wv.shape[1]))],
                        [jnp.zeros((wv.shape[0], wa.shape[1])), wv],
                    ]
                )
            h = h @ w + jnp.concatenate([ba, bv])
            if i < len(actor) - 1:
                h = jax.nn.swish(h)
        return heads_loss(h[:, :width], h[:, width:])

    stacked_params = (
        [jnp.stack([a[0], c[0]]) for a, c in zip(actor[:-1], critic[:-1], strict=True)],
        [jnp.stack([a[1], c[1]]) for a, c in zip(actor[:-1], critic[:-1], strict=True)],
        actor[-1],
        critic[-1],
    )
    return {
        "separate": (separate, (actor, critic)),
        "stacked": (stacked, stacked_params),
        "block-diagonal": (block_diagonal, (actor, critic)),
    }


def run(rows: int, hidden: tuple[int, ...], rounds: int, obs_size: int = 4) -> dict:
    import jax
    import jax.numpy as jnp

    key, x_key = jax.random.split(jax.random.key(0))
    forms = _forms(obs_size, 1, hidden, key)
    x = jax.random.normal(x_key, (rows, obs_size))
    grads = {name: (jax.jit(jax.grad(loss)), p) for name, (loss, p) in forms.items()}
    # Each form's gradient of the first actor kernel (`g[0][0][0]` in all
    # three layouts) against `separate`'s.
    reference = jax.grad(forms["separate"][0])(forms["separate"][1], x)[0][0][0]
    agree = {
        name: bool(
            jnp.allclose(grad(params, x)[0][0][0], reference, rtol=1e-4, atol=1e-6)
        )
        for name, (grad, params) in grads.items()
    }
    median_us = alternated_medians_us(
        {name: (grad, (params, x)) for name, (grad, params) in grads.items()}, rounds
    )
    return {
        "rows": rows,
        "hidden": list(hidden),
        "rounds": rounds,
        "gradients_agree": agree,
        "median_us": median_us,
        "speed_vs_separate": {
            n: median_us["separate"] / us for n, us in median_us.items()
        },
    }


def markdown(result: dict) -> str:
    hidden = "x".join(str(h) for h in result["hidden"])
    lines = [
        f"### Fused actor-critic: two {hidden} swish chains, forward + backward",
        "",
        f"{result['rows']} rows, median of {result['rounds']} alternated rounds, "
        f"on {result['machine']['backend']} ({cores(result['machine'])}).",
        "",
        "| form | median (us) | speed vs separate | same gradients |",
        "|---|---|---|---|",
    ]
    for name, us in result["median_us"].items():
        lines.append(
            f"| {name} | {us:.0f} | {result['speed_vs_separate'][name]:.2f}x "
            f"| {'yes' if result['gradients_agree'][name] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=640)
    parser.add_argument("--hidden", default="32,32,32,32")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--name", default="fusion")
    args = parser.parse_args(argv)
    started = machine()
    hidden = tuple(int(h) for h in args.hidden.split(","))
    result = run(args.rows, hidden, args.rounds)
    publish(args.name, result, markdown, started)


if __name__ == "__main__":
    main()
