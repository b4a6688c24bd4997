"""Generalised advantage estimation with separate termination and truncation."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._typecheck import checked
from ..nn._errors import array_spec


@checked
def gae(
    rewards: Float[Array, "time ..."],
    values: Float[Array, "time ..."],
    next_values: Float[Array, "time ..."],
    done: Bool[Array, "time ..."],
    truncated: Bool[Array, "time ..."],
    *,
    gamma: Float[Array, ""] | float,
    lambda_: Float[Array, ""] | float,
    bootstrap_truncation: bool = False,
) -> Float[Array, "time ..."]:
    """Advantages `A_t` by a reverse scan over time.

    `values[t]` is `V(obs_t)`; `next_values[t]` is the value the step bootstraps
    from: `V(obs_{t+1})` within an episode and, at a truncated step, the value of
    its terminal observation (only read when `bootstrap_truncation`).

    - `delta_t = r_t + gamma * (1 - terminated_t) * next_values[t] - values[t]`,
      where `terminated_t = done_t and not truncated_t`.
    - A truncated step's advantage is zeroed unless `bootstrap_truncation`.
    - `A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`: any `done`
      cuts the trace.

    `truncated` counts only where `done`; the result has no gradient.
    """
    others = dict(
        values=values, next_values=next_values, done=done, truncated=truncated
    )
    for name, x in others.items():
        if jnp.shape(x) != jnp.shape(rewards):
            raise ValueError(
                f"gae({name}={array_spec(x)}): expected the shape of rewards "
                f"{jnp.shape(rewards)}, got {jnp.shape(x)}. Fix: pass all five "
                "arrays as [time, ...] of one shape (squeeze a value head's "
                "trailing axis of size 1; do not swap the time and env axes)."
            )
    truncated = truncated & done
    terminated = done & ~truncated
    delta = rewards + gamma * jnp.where(terminated, 0.0, next_values) - values
    if not bootstrap_truncation:
        delta = jnp.where(truncated, 0.0, delta)
    discount = jnp.where(done, 0.0, gamma * lambda_)

    def backward(next_adv, inputs):
        d, disc = inputs
        adv = d + disc * next_adv
        return adv, adv

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(delta[0]), (delta, discount), reverse=True
    )
    return jax.lax.stop_gradient(advantages)
