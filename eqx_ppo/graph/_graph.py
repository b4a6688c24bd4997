"""PopulationGraph: named populations joined by (possibly delayed) connections."""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Key

from .._activation_key import ACTIVATION_KEY
from ..nn._keys import child_key
from ..nn._module import (
    AbstractStatefulModule,
    State,
    StatefulModuleOutput,
    zero_loss,
)

Role = Literal["input", "hidden", "output"]

RingBuffer = tuple[Float[Array, "length size"], Int[Array, ""]]
"""A population's last `length` activities and the slot the next one goes to."""

GraphState = dict[str, dict[str, Any]]
"""A graph's carry: `{"buffers": {population: ring buffer}, "transforms":
{connection: carry}}`."""


@dataclasses.dataclass(frozen=True)
class PopulationSpec:
    """One population's static description (built by `PopulationGraphBuilder`).

    **Fields:**

    - `name`: unique name; also its key in recorded activations.
    - `size`: number of units.
    - `activation`: applied once to the summed input.
    - `role`: `"input"` (adds an observation), `"output"` (exposed in the
        graph's output) or `"hidden"`.
    - `input_from`: for inputs, the observation key read, or `None` for the
        whole observation.
    - `output_to`: for outputs, the key in the graph's output dict.
    - `buffer_length`: the largest delay of its outgoing connections; the
        length of its ring buffer (0: no buffer).
    """

    name: str
    size: int
    activation: Callable[[Array], Array]
    role: Role
    input_from: str | None
    output_to: str | None
    buffer_length: int


@dataclasses.dataclass(frozen=True)
class ConnectionSpec:
    """One connection's static description: `src` feeds `dst`, `delay` steps late.

    `name` keys its transform, carry, extras and metrics inside the graph.
    """

    name: str
    src: str
    dst: str
    delay: int


class PopulationGraph(AbstractStatefulModule):
    """An immutable graph of populations, built with `PopulationGraphBuilder`.

    Each call (one env, one step) visits the populations in a topological
    order of the delay-0 connections. A population sums its external input
    (input populations: the observation, or `obs[input_from]`) and the outputs
    of its incoming connection transforms, then applies its activation once.
    A connection with delay 0 reads its source's activity of this step; one
    with delay `k >= 1` reads the activity of exactly `k` steps ago from the
    source's ring buffer (zeros until that many steps have run since the last
    reset). The buffer lives in the carry, so `reset_state` empties it.

    **Output:** a dict `{output_to: activity}` over the output populations
    (`output_to` defaults to the population's name), always a dict even with
    one output, as in nnx-ppo.

    **Carry:** `{"buffers": {population: (buffer [length, size], write index)},
    "transforms": {connection: carry}}`; only populations read with a delay
    have a buffer.

    **Regularisation** is the sum of the connection transforms' losses for
    this env (a scalar; the library averages over envs). **Metrics** are each
    transform's metrics under its connection's name, plus, when `record` is
    set, `{ACTIVATION_KEY: {population: activity}}` for every population.
    **Extras** are `{connection: extras}`, or `None` when no transform has any.
    **Keys**: the transform of connection `name` gets
    `jax.random.fold_in(key, crc32(name))`, as a named container's child
    does, so each gets the same noise eagerly, under `jit` and in the loss
    replay, whatever the other connections are.

    Do not construct it directly: call `PopulationGraphBuilder.finalize`.

    Differences from nnx-ppo's `PopulationGraph`, on purpose:

    1. Building and running are split: a mutable `PopulationGraphBuilder`
       takes the `add_*`/`connect` calls, and `finalize(key=...)` returns this
       immutable module.
    2. The regularisation loss is per env; nnx-ppo sums it over the batch, so
       its scale grew with the number of envs.
    3. Connections have names, and their transforms' metrics are kept under
       them (nnx-ppo drops them).
    4. `add_input(input_from=None)` reads a whole array observation.
    5. `finalize` rejects graphs without outputs, outputs that no input
       reaches, and transforms whose output size does not match their
       destination.
    """

    transforms: dict[str, AbstractStatefulModule]
    populations: tuple[PopulationSpec, ...] = eqx.field(static=True)
    connections: tuple[ConnectionSpec, ...] = eqx.field(static=True)
    order: tuple[str, ...] = eqx.field(static=True)
    record: bool = eqx.field(static=True, default=False)

    def _empty_buffers(self) -> dict[str, RingBuffer]:
        """An empty ring buffer for every population read with a delay."""
        return {
            pop.name: _empty_buffer(pop)
            for pop in self.populations
            if pop.buffer_length > 0
        }

    def initial_state(self) -> GraphState:
        """Empty ring buffers and each transform's initial carry."""
        return {
            "buffers": self._empty_buffers(),
            "transforms": {
                name: transform.initial_state()
                for name, transform in self.transforms.items()
            },
        }

    def reset_state(self, prev_state: GraphState) -> GraphState:
        """Empty ring buffers; each transform resets its own carry."""
        return {
            "buffers": self._empty_buffers(),
            "transforms": {
                name: transform.reset_state(prev_state["transforms"][name])
                for name, transform in self.transforms.items()
            },
        }

    def update_statistics(self, extras: Any) -> "PopulationGraph":
        """A new graph whose transforms folded in their share of `extras`."""
        transforms = {
            name: transform.update_statistics(None if extras is None else extras[name])
            for name, transform in self.transforms.items()
        }
        return dataclasses.replace(self, transforms=transforms)

    def __call__(
        self,
        state: GraphState,
        x: Any,
        extras: dict[str, Any] | None = None,
        *,
        key: Key[Array, ""] | None = None,
    ) -> StatefulModuleOutput:
        """Run every population once for one env.

        `x` is the observation: an array when an input population reads the
        whole observation, else a dict holding each input's `input_from` key.
        """
        populations = {pop.name: pop for pop in self.populations}
        buffers = state["buffers"]
        activity: dict[str, Float[Array, " size"]] = {}
        next_transform_state: dict[str, State] = {}
        transform_extras: dict[str, Any] = {}
        metrics: dict[str, Any] = {}
        regularization = zero_loss()
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
                else:
                    source = _read_buffer(buffers[conn.src], conn.delay)
                out = self.transforms[conn.name](
                    state["transforms"][conn.name],
                    source,
                    None if extras is None else extras[conn.name],
                    key=child_key(key, (conn.name,)),
                )
                next_transform_state[conn.name] = out.next_state
                transform_extras[conn.name] = out.extras
                if out.metrics:
                    metrics[conn.name] = out.metrics
                regularization = regularization + out.regularization_loss
                total = total + out.output
            activity[pop_name] = pop.activation(total)

        next_state = {
            "buffers": {
                name: _write_buffer(buffer, activity[name])
                for name, buffer in buffers.items()
            },
            "transforms": next_transform_state,
        }
        output = {
            pop.output_to: activity[pop.name]
            for pop in self.populations
            if pop.role == "output"
        }
        if self.record:
            metrics[ACTIVATION_KEY] = {
                pop.name: activity[pop.name] for pop in self.populations
            }
        if all(e is None for e in transform_extras.values()):
            transform_extras = None
        return StatefulModuleOutput(
            next_state, output, regularization, metrics, transform_extras
        )


def _empty_buffer(pop: PopulationSpec) -> RingBuffer:
    return (
        jnp.zeros((pop.buffer_length, pop.size), jnp.float32),
        jnp.zeros((), jnp.int32),
    )


def _read_buffer(buffer: RingBuffer, delay: int) -> Float[Array, " size"]:
    # The slot before the write index holds last step's activity, so the one
    # `delay` slots back holds the activity of `delay` steps ago.
    values, index = buffer
    return values[(index - delay) % values.shape[0]]


def _write_buffer(buffer: RingBuffer, activity: Float[Array, " size"]) -> RingBuffer:
    values, index = buffer
    return values.at[index].set(activity), (index + 1) % values.shape[0]


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
