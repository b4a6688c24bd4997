"""PopulationGraph: named populations joined by (possibly delayed) connections."""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..nn._keys import child_key
from ..nn._module import AbstractStatefulModule, State, StatefulModuleOutput, zero_loss

ACTIVATION_KEY = "__activation__"
"""Metrics key holding a recorded layer's forward output; see `extract_activations`."""

Role = Literal["input", "hidden", "output"]

GraphState = dict[str, dict[str, Any]]
"""A graph's carry: `{"buffers": {population: (activities [length, size],
write index)}, "transforms": {connection: carry}}`."""


@dataclasses.dataclass(frozen=True)
class PopulationSpec:
    """One population's static description (built by `PopulationGraphBuilder`).

    `role` is `"input"` (adds the observation, or `obs[input_from]`),
    `"output"` (exposed under `output_to`) or `"hidden"`; `buffer_length` is
    the largest delay of its outgoing connections (0: no ring buffer), set
    by `finalize`.
    """

    name: str
    size: int
    activation: Callable[[Array], Array]
    role: Role
    input_from: str | None = None
    output_to: str | None = None
    buffer_length: int = 0


@dataclasses.dataclass(frozen=True)
class ConnectionSpec:
    """One connection's static description: `src` feeds `dst`, `delay` steps
    late; `name` keys its transform, carry, extras and metrics in the graph."""

    name: str
    src: str
    dst: str
    delay: int


class PopulationGraph(AbstractStatefulModule):
    """An immutable graph of populations, built by `PopulationGraphBuilder.finalize`.

    Each call (one env, one step) visits the populations in a topological
    order of the delay-0 connections; each sums its external input and its
    incoming transforms' outputs, then applies its activation once. Delayed
    connections read ring buffers kept in the carry (see the population graph
    guide).

    - **Output:** a dict `{output_to: activity}` over the output populations.
    - **Metrics:** each transform's under its connection's name, plus, when
      `record` is set, `{ACTIVATION_KEY: {population: activity}}`.
    - **Keys:** connection `name`'s transform gets
      `jax.random.fold_in(key, crc32(name))`, as a named container's child does.
    """

    transforms: dict[str, AbstractStatefulModule]
    populations: tuple[PopulationSpec, ...] = eqx.field(static=True)
    connections: tuple[ConnectionSpec, ...] = eqx.field(static=True)
    order: tuple[str, ...] = eqx.field(static=True)
    record: bool = eqx.field(static=True, default=False)

    def _state(self, transforms: dict[str, State]) -> GraphState:
        """Empty ring buffers for the populations read with a delay."""
        buffers = {
            pop.name: (
                jnp.zeros((pop.buffer_length, pop.size), jnp.float32),
                jnp.zeros((), jnp.int32),
            )
            for pop in self.populations
            if pop.buffer_length > 0
        }
        return {"buffers": buffers, "transforms": transforms}

    def initial_state(self) -> GraphState:
        """Empty ring buffers and each transform's initial carry."""
        return self._state({n: t.initial_state() for n, t in self.transforms.items()})

    def reset_state(self, prev_state: GraphState) -> GraphState:
        """Empty ring buffers; each transform resets its own carry."""
        prev = prev_state["transforms"]
        return self._state(
            {n: t.reset_state(prev[n]) for n, t in self.transforms.items()}
        )

    def update_statistics(self, extras: Any) -> "PopulationGraph":
        """A new graph whose transforms folded in their share of `extras`."""
        transforms = {
            name: transform.update_statistics(None if extras is None else extras[name])
            for name, transform in self.transforms.items()
        }
        return dataclasses.replace(self, transforms=transforms)

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        """Run every population once for one env; `x` is the observation (an
        array, or a dict holding each input's `input_from` key)."""
        populations = {pop.name: pop for pop in self.populations}
        buffers = state["buffers"]
        activity: dict[str, Float[Array, " size"]] = {}
        outs: dict[str, StatefulModuleOutput] = {}
        for pop_name in self.order:
            pop = populations[pop_name]
            total = jnp.zeros((pop.size,), jnp.float32)
            if pop.role == "input":
                total = total + _external_input(pop, x)
            for conn in self.connections:
                if conn.dst != pop_name:
                    continue
                if conn.delay == 0:
                    source = activity[conn.src]
                else:  # The slot `delay` before the write index: `delay` steps ago.
                    values, index = buffers[conn.src]
                    source = values[(index - conn.delay) % values.shape[0]]
                outs[conn.name] = out = self.transforms[conn.name](
                    state["transforms"][conn.name],
                    source,
                    None if extras is None else extras[conn.name],
                    key=child_key(key, (conn.name,)),
                )
                total = total + out.output
            activity[pop_name] = pop.activation(total)

        next_buffers = {
            name: (values.at[index].set(activity[name]), (index + 1) % len(values))
            for name, (values, index) in buffers.items()
        }
        transforms = {name: out.next_state for name, out in outs.items()}
        next_state = {"buffers": next_buffers, "transforms": transforms}
        output = {
            pop.output_to: activity[pop.name]
            for pop in self.populations
            if pop.role == "output"
        }
        metrics = {name: out.metrics for name, out in outs.items() if out.metrics}
        if self.record:
            metrics[ACTIVATION_KEY] = {
                pop.name: activity[pop.name] for pop in self.populations
            }
        regularization = sum(
            (out.regularization_loss for out in outs.values()), zero_loss()
        )
        transform_extras = {name: out.extras for name, out in outs.items()}
        if all(e is None for e in transform_extras.values()):
            transform_extras = None
        return StatefulModuleOutput(
            next_state, output, regularization, metrics, transform_extras
        )


def _external_input(pop: PopulationSpec, x: Any) -> Float[Array, " size"]:
    """The observation part an input population adds, checked at trace time."""
    if pop.input_from is None:
        where, value = "the whole observation", x
    else:
        where = f"obs[{pop.input_from!r}]"
        value = x.get(pop.input_from) if isinstance(x, Mapping) else None
    if eqx.is_array(value) and jnp.shape(value) == (pop.size,):
        return value
    seen = (
        f"a dict with keys {sorted(x)}"
        if isinstance(x, Mapping) and not eqx.is_array(value)
        else f"shape {jnp.shape(value if eqx.is_array(value) else x)}"
    )
    raise ValueError(
        f"PopulationGraph input population {pop.name!r} reads {where}, of shape "
        f"({pop.size},) for one env; got {seen}. Fix: build the inputs with "
        "input_from=<key> for a dict observation or input_from=None for an "
        "array; layers work on one env: vmap over envs or use "
        "`eqx_ppo.nn.apply_batched`."
    )
