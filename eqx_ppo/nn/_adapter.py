"""PPOAdapter: the two-port module that turns a network into a PPO policy."""

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from .._typecheck import checked
from ._containers import PerStep, Run, _AbstractContainer
from ._module import AbstractStatefulModule


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


_SAMPLER_KEYS = frozenset({"action", "log_likelihood"})


def _is_sampler_dict(node: Any) -> bool:
    return isinstance(node, Mapping) and _SAMPLER_KEYS <= node.keys()


def _squeeze_value(value: Array) -> Float[Array, ""]:
    if jnp.shape(value) not in ((), (1,)):
        raise ValueError(
            "`PPOAdapter`: the value port must output one estimate per reward key, "
            f"shaped `(1,)` or `()`, got shape {jnp.shape(value)}; end the value "
            "port with a layer of output size 1."
        )
    return jnp.reshape(value, ())


def ppo_output(samples: Any, values: Any) -> PPONetworkOutput:
    """One env's action-port and value-port outputs, packaged as `PPOAdapter` does."""
    nodes = jax.tree.leaves(samples, is_leaf=_is_sampler_dict)
    if not nodes or not all(_is_sampler_dict(node) for node in nodes):
        raise TypeError(
            "`PPOAdapter`: the action port must output a sampler dict "
            "`{'action', 'log_likelihood'}` or a pytree of them, got "
            f"{jax.tree.structure(samples)}; end the action port with a sampler."
        )
    return PPONetworkOutput(
        actions=jax.tree.map(lambda d: d["action"], samples, is_leaf=_is_sampler_dict),
        loglikelihoods=jax.tree.map(
            lambda d: d["log_likelihood"], samples, is_leaf=_is_sampler_dict
        ),
        value_estimates=jax.tree.map(_squeeze_value, values),
    )


@checked
class PPOAdapter(_AbstractContainer):
    """Two ports on the same input, packaged as a [`eqx_ppo.nn.PPONetworkOutput`][].

    The `action` port outputs a *sampler dict* `{"action", "log_likelihood"}`
    (what every sampler returns) or a pytree of them, lifted into `actions`
    and `loglikelihoods`; the `value` port an array of shape `(1,)`, squeezed
    to a scalar, or a dict of them (one per reward key). State, extras and
    metrics are dicts `{"action": ..., "value": ...}`.

    **Arguments:**

    - `action`: the actor, ending in a sampler (or a `Map` of samplers).
    - `value`: the critic, ending in a layer of output size 1 (or a dict of them).
    """

    action: AbstractStatefulModule
    value: AbstractStatefulModule

    def _children(self) -> dict[str, AbstractStatefulModule]:
        return {"action": self.action, "value": self.value}

    def _route(self, run: Run, x: Any, per_step: PerStep) -> PPONetworkOutput:
        return per_step(ppo_output)(run("action", x), run("value", x))
