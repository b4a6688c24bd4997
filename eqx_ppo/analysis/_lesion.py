"""Lesions: hold some units of one layer at fixed values, or shift them.

The units are data (an array leaf), not a static field, so one compiled program
serves every choice of units: that is what lets `unit_importance` lesion every
unit in one `vmap`.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PyTree

from .._typecheck import Number, checked, each
from ..graph import PopulationGraph
from ..nn._filters import coefficient
from ..nn._module import (
    AbstractLayerWrapper,
    AbstractStatefulModule,
    SequenceOutput,
    StatefulModuleOutput,
)

Site = Literal["output", "carry", "input"]

Units = Int[ArrayLike, " k"] | Bool[ArrayLike, " units"] | each(Sequence, int)
"""Which units: an index array (or list) of them, or a boolean mask over all."""

Values = Float[ArrayLike, "..."] | each(Sequence, Number)
"""The values to hold the units at, or to add: one, or one per entry of `units`."""


class Intervention(AbstractLayerWrapper):
    """Runs `layer` with some units held at `values` (`mode="clamp"`) or shifted
    by them (`mode="add"`), at its output, carry or input (`site`); the rest is
    the layer's, so a lesioned network also trains as one. Build it with
    [`eqx_ppo.analysis.ablate`][], [`eqx_ppo.analysis.clamp`][] or
    [`eqx_ppo.analysis.perturb`][].

    **Fields:**

    - `layer`: the wrapped layer.
    - `units`: an integer index array, or a boolean mask over all units.
    - `values`: a scalar, one per index, or one per unit for a mask (never trained).
    - `mode`: `"clamp"` or `"add"`.
    - `site`: `"output"`, `"carry"` or `"input"` (a graph population's readers).
    - `entry`: the key of a dict output (or input) to act on, or `None`.
    """

    layer: AbstractStatefulModule
    units: Int[Array, " k"] | Bool[Array, " units"]
    values: Float[Array, "..."] = coefficient()
    mode: Literal["clamp", "add"] = eqx.field(static=True, default="clamp")
    site: Site = eqx.field(static=True, default="output")
    entry: str | None = eqx.field(static=True, default=None)

    def _at(self, site: Site, y: Any) -> Any:
        """`y`, at `site`, with the selected units held or shifted if acted on there."""
        if site != self.site:
            return y
        if site == "carry":
            return jax.tree.map(self._units_of, y)
        if self.entry is not None:
            return {**y, self.entry: self._units_of(y[self.entry])}
        return self._units_of(y)

    def _units_of(self, y: Any) -> Array:
        n = n_units_of(self.layer, self.site, y)
        if self.units.dtype == jnp.bool_:
            if self.units.shape != (n,):
                raise ValueError(
                    f"Intervention(layer={type(self.layer).__name__}): a mask of "
                    f"{self.units.shape[0]} units for a {self.site} of {n} units. "
                    f"Fix: pass a boolean mask of length {n}, or unit indices."
                )
            mask = self.units
            values = jnp.broadcast_to(self.values, (n,))
        else:
            index = eqx.error_if(
                self.units,
                (self.units < -n) | (self.units >= n),
                f"Intervention: a unit index outside the layer's {n} units.",
            )
            mask = jnp.zeros(n, jnp.bool_).at[index].set(True)
            held = jnp.broadcast_to(self.values, index.shape)
            values = jnp.zeros(n, jnp.float32).at[index].set(held)
        values = values.astype(y.dtype)
        return jnp.where(mask, values if self.mode == "clamp" else y + values, y)

    def wrap_output(self, out: Any) -> Any:
        """A step's (or a replay's) output, held at `site="output"`."""
        return out._replace(output=self._at("output", out.output))

    def __call__(self, state, x, *args, **kwargs) -> StatefulModuleOutput:
        """The wrapped step, from the held carry and input."""
        return super().__call__(
            self._at("carry", state), self._at("input", x), *args, **kwargs
        )

    def replay(self, state0, xs, *args, **kwargs) -> SequenceOutput:
        if self.site == "carry":
            # Every step's carry is held: the default replay scans `__call__`.
            return AbstractStatefulModule.replay(self, state0, xs, *args, **kwargs)
        xs = self._at("input", xs)
        return self.wrap_output(self.layer.replay(state0, xs, *args, **kwargs))


@checked
def ablate(
    network: PyTree,
    where: Callable[[PyTree], Any],
    units: Units,
    *,
    site: Literal["output", "carry"] = "output",
    population: str | None = None,
) -> PyTree:
    """A copy of `network` whose selected units of one layer are held at zero.

    **Arguments:**

    - `network`: any network (or a tree holding one); it is left untouched.
    - `where`: a function from `network` to the layer, as for `eqx.tree_at`.
    - `units`: unit indices, or a boolean mask over all the units.
    - `site`: `"output"` (what the rest of the network reads) or `"carry"`.
    - `population`: with a [`eqx_ppo.graph.PopulationGraph`][], the population.

    ```python
    actor_lstm = lambda net: net.layers[1].action.layers[0]
    silenced = ablate(net, actor_lstm, [3, 7])  # units 3 and 7 read as 0
    amnesic = ablate(net, actor_lstm, jnp.ones(16, bool), site="carry")
    ```
    """
    return _intervene(network, where, units, 0.0, "clamp", site, population)


@checked
def clamp(
    network: PyTree,
    where: Callable[[PyTree], Any],
    units: Units,
    values: Values,
    *,
    site: Literal["output", "carry"] = "output",
    population: str | None = None,
) -> PyTree:
    """As [`eqx_ppo.analysis.ablate`][], the units held at `values`: one, or one
    per entry of `units`."""
    return _intervene(network, where, units, values, "clamp", site, population)


@checked
def perturb(
    network: PyTree,
    where: Callable[[PyTree], Any],
    units: Units,
    delta: Values,
    *,
    site: Literal["output", "carry"] = "output",
    population: str | None = None,
) -> PyTree:
    """As [`eqx_ppo.analysis.clamp`][], `delta` added to the units at every step
    (e.g. along a direction [`eqx_ppo.analysis.pca`][] found)."""
    return _intervene(network, where, units, delta, "add", site, population)


def _intervene(
    network: PyTree,
    where: Callable[[PyTree], Any],
    units: Any,
    values: Any,
    mode: Literal["clamp", "add"],
    site: Literal["output", "carry"],
    population: str | None,
) -> PyTree:
    units = jnp.asarray(units)
    if units.size == 0:
        units = units.astype(jnp.int32)
    values = jnp.asarray(values, jnp.float32)
    if values.shape not in ((), units.shape):
        raise ValueError(
            f"values (or delta) of shape {values.shape} for units of shape "
            f"{units.shape}. Fix: pass one value, or one per entry of `units`."
        )
    target = selected(network, where, site, population)
    if population is None:
        wrapped = Intervention(target, units, values, mode, site)
    else:
        wrapped = _intervene_population(target, population, units, values, mode)
    return eqx.tree_at(where, network, wrapped)


def selected(
    network: PyTree,
    where: Callable[[PyTree], Any],
    site: Literal["output", "carry"],
    population: str | None,
) -> Any:
    """The layer (or graph) `where` selects, checked to have what `site` acts on."""
    target = where(network)
    kind = AbstractStatefulModule if population is None else PopulationGraph
    if not isinstance(target, kind):
        raise TypeError(
            f"where=...: `where` selected a {type(target).__name__}, not a "
            f"{'layer' if population is None else 'PopulationGraph'}. Fix: return "
            "a layer, e.g. `lambda net: net.layers[1]`; with `population=`, the "
            "graph holding the population."
        )
    if site == "carry" and (
        population is not None or not jax.tree.leaves(target.initial_state())
    ):
        what = f"population {population!r}" if population else type(target).__name__
        raise ValueError(
            f'site="carry": the selected {what} has no carry of its own. Fix: use '
            'site="output", or select a recurrent layer.'
        )
    return target


def n_units_of(layer: AbstractStatefulModule, site: Site, y: Any) -> int:
    """The number of units (the last axis) of `y`, `layer`'s array at `site`."""
    leaves = jax.tree.leaves(y) if site == "carry" else [y]
    arrays = all(eqx.is_array(a) or isinstance(a, jax.ShapeDtypeStruct) for a in leaves)
    sizes = {a.shape[-1:] for a in leaves} if arrays else set()
    if len(sizes) != 1 or () in sizes:
        fix = (
            'use site="output"'
            if site == "carry"
            else "a population with `population=`"
        )
        raise TypeError(
            f"where=...: the selected {type(layer).__name__}'s {site} is "
            f"{jax.tree.map(jnp.shape, y)}, not arrays of one number of units. "
            f"Fix: select a layer whose {site} is arrays with as many units (the "
            f"last axis), or {fix}."
        )
    return sizes.pop()[0]


def population_spec(graph: PopulationGraph, population: str) -> Any:
    """The `PopulationSpec` named `population` of `graph`."""
    specs = {pop.name: pop for pop in graph.populations}
    if population not in specs:
        raise ValueError(
            f"population={population!r}: the graph has the populations "
            f"{sorted(specs)}. Fix: pass one of them."
        )
    return specs[population]


def _intervene_population(
    graph: PopulationGraph,
    population: str,
    units: Array,
    values: Array,
    mode: Literal["clamp", "add"],
) -> AbstractStatefulModule:
    """`graph` whose connections from `population`, and output of it, if any,
    read its held activity."""
    spec = population_spec(graph, population)
    transforms = dict(graph.transforms)
    for connection in graph.connections:
        if connection.src == population:
            transforms[connection.name] = Intervention(
                transforms[connection.name], units, values, mode, site="input"
            )
    held: AbstractStatefulModule = dataclasses.replace(graph, transforms=transforms)
    if spec.role == "output":
        held = Intervention(held, units, values, mode, entry=spec.output_to)
    return held
