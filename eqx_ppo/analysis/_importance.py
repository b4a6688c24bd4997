"""Unit importance: every single-unit lesion of a layer, in one vmapped program."""

from collections.abc import Callable, Mapping
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree

from .._typecheck import checked
from ..nn._module import AbstractLayerWrapper, AbstractStatefulModule
from ..ppo import eval_rollout
from ._lesion import ablate, n_units_of, population_spec, selected

_PROBE = "__unit_count_probe__"


class _OutputProbe(AbstractLayerWrapper):
    """Puts its layer's output in the metrics, for counting the layer's units;
    the layer's own metrics are dropped (a container's have integer keys)."""

    layer: AbstractStatefulModule

    def wrap_output(self, out):
        return out._replace(metrics={_PROBE: out.output})


def _is_probe(metrics: Any) -> bool:
    return isinstance(metrics, Mapping) and _PROBE in metrics


def _output_units(
    env: Any, network: AbstractStatefulModule, where: Callable[[PyTree], Any]
) -> int:
    """The number of output units of the layer `where` selects, from shapes."""
    probed = eqx.tree_at(where, network, replace_fn=_OutputProbe)
    key = jax.random.key(0)
    out = jax.eval_shape(
        lambda: probed(probed.initial_state(), env.reset(key).obs, key=key)
    )
    leaves = jax.tree.leaves(out.metrics, is_leaf=_is_probe)
    found = next((m[_PROBE] for m in leaves if _is_probe(m)), None)
    return n_units_of(where(network), "output", found)


@eqx.filter_jit
@checked
def unit_importance(
    env: Any,
    network: AbstractStatefulModule,
    where: Callable[[PyTree], Any],
    *,
    n_envs: int,
    max_episode_length: int,
    key: PRNGKeyArray,
    site: Literal["output", "carry"] = "output",
    population: str | None = None,
) -> Float[Array, " units"]:
    """How much the mean deterministic return drops when each unit alone is ablated.

    For each unit `i` of the layer `where` selects (as in
    [`eqx_ppo.analysis.ablate`][]), the return of `network` minus that of
    `ablate(network, where, [i])` on the same episodes of
    [`eqx_ppo.eval_rollout`][]: positive means the unit helps. All `units + 1`
    evaluations are one `jax.vmap` over masks, held in memory at once.
    """

    def mean_return(mask: Bool[Array, " units"]) -> Float[Array, ""]:
        lesioned = ablate(network, where, mask, site=site, population=population)
        metrics = eval_rollout(
            env,
            eqx.nn.inference_mode(lesioned),
            key,
            n_envs=n_envs,
            max_episode_length=max_episode_length,
        )
        return metrics["eval/episode_reward/mean"]

    layer = selected(network, where, site, population)
    if population is not None:
        n_units = population_spec(layer, population).size
    elif site == "carry":
        n_units = n_units_of(layer, site, jax.eval_shape(layer.initial_state))
    else:
        n_units = _output_units(env, network, where)
    # The intact network first, then one unit lesioned per row.
    masks = jnp.eye(n_units + 1, n_units, k=-1, dtype=jnp.bool_)
    returns = jax.vmap(mean_return)(masks)
    return returns[0] - returns[1:]
