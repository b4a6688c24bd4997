"""PPOAdapter: the two-port module that turns a network into a PPO policy."""

from typing import NamedTuple

from jaxtyping import Array, Float, PyTree


class PPONetworkOutput(NamedTuple):
    """The `output` of a PPO network for one env.

    **Fields:**

    - `actions`: the action pytree sent to the env.
    - `loglikelihoods`: one scalar per sampler, same structure as the samplers.
    - `value_estimates`: a scalar, or a dict of scalars (one per reward key).
    """

    actions: PyTree[Array]
    loglikelihoods: PyTree[Float[Array, ""]]
    value_estimates: PyTree[Float[Array, ""]]
