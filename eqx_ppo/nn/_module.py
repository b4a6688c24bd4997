"""The stateful module contract every eqx_ppo layer follows.

**Batching convention.** A layer is written for *one* environment, as in
Equinox: `x` has no batch axis, `state` is one env's carry, the regularisation
loss is a scalar and every metric is one env's value. The library supplies the
env axis with `jax.vmap`, giving each env its own PRNG key. We chose this over
nnx-ppo's leading-batch-axis convention because

1. per-env keys make every stochastic layer reproducible on any subset of
   envs, so a minibatch replay of envs `[3, 7]` sees exactly the noise envs 3
   and 7 saw in the rollout;
2. the same layer runs unchanged over `[B]`, `[T, B]` or `[seeds, B]` by
   stacking `vmap`s, which is how the loss replays feed-forward networks over
   all time steps at once;
3. layers are shorter: no `axis=-1` bookkeeping, no batch-size arguments.

For interactive use, `initialize_state(batch_size)` builds a `[B, ...]` state
and [`eqx_ppo.nn.apply_batched`][] calls a network once on a batch, so the
nnx-ppo recording workflow keeps its length.

**Shapes** of one call (single env):

- `state`: the layer's carry pytree, `()` for stateless layers.
- `x`: the layer's input pytree, e.g. `Float[Array, "features"]`.
- `extras`: `None` to act afresh (rollout, inference); the `extras` this layer
  emitted in the rollout to replay that step (loss replay).
- `output.next_state`: same structure as `state`.
- `output.regularization_loss`: `Float[Array, ""]`, added to the PPO loss.
- `output.metrics`: a dict of arrays, logged under `net/<path>/...`.
- `output.extras`: what the loss replay must get back; `None` if nothing.

**Replay.** The loss replays a minibatch of `M` envs' length-`T` rollouts
with `replay` (carries `[M, ...]`, every other leaf `[T, M, ...]`). By default
a module without a carry runs once over all `T x M` steps, and a module with
a carry has its `__call__` scanned over time, vmapped over the envs;
containers replay child by child, so only their recurrent children are
scanned, and a recurrence with a parallel form (an associative scan)
overrides it.

**Keys.** A container hands each child a key of its own, folded from its
key and the child's position or name (`_keys.py`), so a child's noise never
depends on its siblings.
"""

import abc
import math
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Key, PyTree

from .._typecheck import checked
from ._errors import carry_spec, tree_spec
from ._filters import nonnegative_coefficients

State = PyTree
"""A per-env carry: any pytree of arrays, `()` for stateless layers."""


class StatefulModuleOutput(NamedTuple):
    """What every call of an [`eqx_ppo.nn.AbstractStatefulModule`][] returns.

    **Fields:**

    - `next_state`: the carry for the next step.
    - `output`: the forward output.
    - `regularization_loss`: a scalar per env, added to the training loss.
    - `metrics`: a dict of per-env diagnostics, never differentiated.
    - `extras`: the values loss replay passes back as `extras`.
    """

    next_state: State
    output: Any
    regularization_loss: Float[Array, ""]
    metrics: dict
    extras: Any = None


class SequenceOutput(NamedTuple):
    """What [`eqx_ppo.nn.AbstractStatefulModule.replay`][] returns.

    **Fields:**

    - `last_state`: each env's carry after the last step (reset if that step
      was done), leaves `[M, ...]`.
    - `output`: the outputs of every step, leaves `[T, M, ...]`.
    - `regularization_loss`: `Float[Array, "time env"]`, one value per step.
    """

    last_state: State
    output: Any
    regularization_loss: Float[Array, "time env"]


class AbstractStatefulModule(eqx.Module):
    """Base class of every layer and container.

    Subclasses implement `__call__`; layers with a carry override
    `initial_state`; layers that keep running statistics override
    `update_statistics`; containers (and recurrences with a parallel form)
    override `replay`. See the module docstring for the batching convention.
    Every layer refuses a concrete `coefficient(nonnegative=True)` field
    (see [`eqx_ppo.nn.coefficient`][]) that is negative, infinite or NaN.
    """

    def __check_init__(self):
        for name, value in nonnegative_coefficients(self).items():
            if isinstance(value, jax.core.Tracer):
                continue
            # NumPy, not jnp: under a trace jnp would stage even a concrete value.
            if np.all((np.asarray(value) >= 0) & (np.asarray(value) < math.inf)):
                continue
            raise ValueError(
                f"`{type(self).__name__}({name}={value!s})`: {name} must be "
                "finite and >= 0."
            )

    @abc.abstractmethod
    def __call__(
        self,
        state: State,
        x: Any,
        extras: Any = None,
        *,
        key: Key[Array, ""] | None = None,
    ) -> StatefulModuleOutput:
        """Run one step for one env.

        **Arguments:**

        - `state`: this layer's carry for this env.
        - `x`: the input.
        - `extras`: `None` to act afresh, or the `extras` emitted by the rollout
          call being replayed.
        - `key`: a PRNG key; stochastic layers require it (except in inference
          mode), deterministic layers ignore it.
        """

    def replay(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        """Replay `M` envs' length-`T` sequences, as `T` calls of `__call__` would.

        **Arguments:**

        - `state0`: each env's carry before the first step, leaves `[M, ...]`.
        - `xs`, `extras`: the inputs and the rollout's extras, leaves
          `[T, M, ...]` (`extras=None` acts afresh at every step).
        - `keys`: each env's key at each step, `[T, M]`, or `None`.
        - `done`: `[T, M]`; after a step with `done`, that env's carry is reset
          with `reset_state`, exactly as the rollout reset it.

        The default runs a module without a carry once over all `T x M` steps,
        one batched call: XLA runs the matmuls of one `[T x M, ...]` batch, and
        their weight gradients above all, faster than those of a `[T, M, ...]`
        one. A module with a carry has its `__call__` scanned over time,
        vmapped over the envs, as the rollout runs it. An override must give
        these values (to float rounding) and route keys and extras exactly as
        `__call__` does; see the custom layer guide.
        """
        if jax.tree.leaves(state0):
            return _scan(self, state0, xs, extras, keys, done)
        n_envs = done.shape[1]
        steps = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), (xs, extras, keys))
        out = jax.vmap(lambda x, e, k: self(state0, x, e, key=k))(*steps)
        output, loss = jax.tree.map(
            lambda a: a.reshape(-1, n_envs, *a.shape[1:]),
            (out.output, out.regularization_loss),
        )
        return SequenceOutput(state0, output, loss)

    def initial_state(self) -> State:
        """The carry of one env at the start of an episode."""
        return ()

    def reset_state(self, prev_state: State) -> State:
        """The carry after an episode boundary, given the carry before it."""
        del prev_state
        return self.initial_state()

    def update_statistics(self, extras: Any) -> "AbstractStatefulModule":
        """Fold a rollout's `extras` (leaves `[T, B, ...]`) into running statistics.

        Returns a new module; the default has no statistics and returns `self`.
        """
        del extras
        return self

    def initialize_state(self, batch_size: int | None = None) -> State:
        """`initial_state()`, with a leading `[batch_size]` axis if given."""
        state = self.initial_state()
        if batch_size is None:
            return state
        return jax.tree.map(
            lambda s: jnp.broadcast_to(s, (batch_size, *jnp.shape(s))), state
        )


class AbstractStatelessLayer(AbstractStatefulModule):
    """A deterministic layer without carry, loss or metrics: implement `forward`.

    `__call__` ignores `state`, `extras` and `key` and returns `forward(x)`
    with carry `()`, zero regularisation and no metrics.
    """

    @abc.abstractmethod
    def forward(self, x: Any) -> Any:
        """The output for one env's input `x`."""

    def __call__(
        self,
        state: tuple[()],
        x: Any,
        extras: None = None,
        *,
        key: Key[Array, ""] | None = None,
    ) -> StatefulModuleOutput:
        """`forward(x)`, with carry `()`."""
        del state, extras, key
        return StatefulModuleOutput((), self.forward(x), zero_loss(), {}, None)


class AbstractLayerWrapper(AbstractStatefulModule):
    """Runs one `layer` and rewrites each step's output with `wrap_output`.

    Everything else is `layer`'s: its key, carry, resets and statistics
    (`update_statistics` returns the wrapper around the updated layer), and
    its own (possibly parallel) `replay`. A replay
    returns neither metrics nor extras, so `wrap_output` may change only
    those two.
    """

    layer: eqx.AbstractVar[AbstractStatefulModule]

    @abc.abstractmethod
    def wrap_output(self, out: StatefulModuleOutput) -> StatefulModuleOutput:
        """This step's output, given what `layer` returned."""

    def __call__(
        self,
        state: State,
        x: Any,
        extras: Any = None,
        *,
        key: Key[Array, ""] | None = None,
    ) -> StatefulModuleOutput:
        return self.wrap_output(self.layer(state, x, extras, key=key))

    def replay(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        return self.layer.replay(state0, xs, extras, keys, done)

    def initial_state(self) -> State:
        return self.layer.initial_state()

    def reset_state(self, prev_state: State) -> State:
        return self.layer.reset_state(prev_state)

    def update_statistics(self, extras: Any) -> "AbstractLayerWrapper":
        return eqx.tree_at(
            lambda wrapper: wrapper.layer, self, self.layer.update_statistics(extras)
        )


def zero_loss() -> Float[Array, ""]:
    """The regularisation loss of a layer that adds none."""
    return jnp.zeros((), jnp.float32)


def checked_output(layer: Any, state: Any, out: Any) -> StatefulModuleOutput:
    """`out`, the result of calling `layer` on one env's carry `state`, if it
    keeps the module contract; else an error naming the layer (at trace time),
    instead of an attribute, broadcasting or scan-carry error in the container,
    rollout or loss that reads it."""
    name = type(layer).__name__
    if not isinstance(out, StatefulModuleOutput):
        raise TypeError(
            f"{name}.__call__ returned {type(out).__name__}; a layer must return a "
            "StatefulModuleOutput(next_state, output, regularization_loss, "
            "metrics, extras)."
        )
    got, expected = carry_spec(out.next_state), carry_spec(state)
    if got != expected:
        raise ValueError(
            f"{name}.__call__ returned the next_state {tree_spec(got)} "
            f"for the carry {tree_spec(expected)}; a layer's carry must keep the "
            "structure, shapes and dtypes its initial_state gives, step after "
            "step, so that the rollout can scan it. Fix: return a next_state "
            "shaped like the state passed in."
        )
    if jnp.shape(out.regularization_loss) != ():
        raise ValueError(
            f"{name}.__call__ returned a regularization_loss of shape "
            f"{jnp.shape(out.regularization_loss)}; it must be one number per env "
            "(shape ()): sum or average it over the layer's units."
        )
    return out


def _scan(
    module: AbstractStatefulModule,
    state0: State,
    xs: Any,
    extras: Any,
    keys: Key[Array, "time env"] | None,
    done: Bool[Array, "time env"],
) -> SequenceOutput:
    """`module`'s `__call__` scanned over time and vmapped over the envs, each
    env's carry reset where it is done: the rollout's own computation."""

    def step(state, inputs):
        x, e, k, d = inputs
        out = jax.vmap(lambda s, x, e, k: module(s, x, e, key=k))(state, x, e, k)
        next_state = jax.vmap(lambda d, s: reset_where(module, d, s))(d, out.next_state)
        return next_state, (out.output, out.regularization_loss)

    last, (outputs, losses) = jax.lax.scan(step, state0, (xs, extras, keys, done))
    return SequenceOutput(last, outputs, losses)


def reset_where(
    module: AbstractStatefulModule, done: Bool[Array, ""], state: State
) -> State:
    """One env's carry, reset if `done`: the rule the rollout and replay share."""
    fresh = module.reset_state(state)
    got, expected = carry_spec(fresh), carry_spec(state)
    if got != expected:
        raise ValueError(
            f"{type(module).__name__}.reset_state (or that of a layer inside "
            f"it) returned a carry of {tree_spec(got)}; the carry it resets is "
            f"{tree_spec(expected)}. Fix: return a carry of the same structure, "
            "shapes and dtypes (one env's, e.g. initial_state())."
        )
    return jax.tree.map(lambda f, s: jnp.where(done, f, s), fresh, state)


@checked
def apply_batched(
    module: AbstractStatefulModule,
    state: State,
    x: Any,
    extras: Any = None,
    *,
    key: Key[Array, ""] | None = None,
) -> StatefulModuleOutput:
    """Call `module` once on a batch: every leaf has a leading env axis `[B]`.

    `key` is split into one key per env, in the same way the rollout does it,
    so `apply_batched` on a batch reproduces the per-env calls (to float
    rounding: a batched matmul may sum in another order).

    ```python
    state = net.initialize_state(8)
    out = eqx_ppo.nn.apply_batched(net, state, obs, key=jax.random.key(0))
    ```
    """
    n = jnp.shape(jax.tree.leaves(x)[0])[0]
    keys = None if key is None else jax.random.split(key, n)
    return jax.vmap(
        lambda s, xi, e, k: module(s, xi, e, key=k),
    )(state, x, extras, keys)
