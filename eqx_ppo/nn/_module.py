"""The stateful module contract: every layer is written for one env, as in
Equinox; `docs/concepts.md` says how the library batches and routes keys."""

import abc
import contextlib
import contextvars
import math
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Key, PyTree

from .._typecheck import checked
from ._errors import carry_spec, tree_spec
from ._filters import coefficient_names

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
    `initial_state`, layers with running statistics `update_statistics`, and
    containers (and recurrences with a parallel form) `replay`.
    """

    ignores_key: ClassVar[bool] = False
    """Whether `__call__` and `replay` never use their key: a container then
    passes `None` instead of deriving one (less to trace and compile; no other
    layer's key changes)."""

    def __check_init__(self):
        for name in coefficient_names(self, "nonnegative"):
            value = getattr(self, name)
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

        The default runs a module without a carry on all `T x M` steps at once
        (`merges_steps` says in which layout) and scans one with a carry; an
        override must give the same values, routing keys and extras as
        `__call__` does.
        """
        if jax.tree.leaves(state0):

            def step(state, inputs):
                x, e, k, d = inputs
                out = jax.vmap(lambda s, x, e, k: self(s, x, e, key=k))(state, x, e, k)
                reset = jax.vmap(lambda d, s: reset_where(self, d, s))
                return reset(d, out.next_state), (out.output, out.regularization_loss)

            last, (outputs, losses) = jax.lax.scan(
                step, state0, (xs, extras, keys, done)
            )
            return SequenceOutput(last, outputs, losses)
        step = lambda x, e, k: self(state0, x, e, key=k)  # noqa: E731
        if not merges_steps():
            out = jax.vmap(jax.vmap(step))(xs, extras, keys)
            return SequenceOutput(state0, out.output, out.regularization_loss)
        n_envs = done.shape[1]
        steps = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), (xs, extras, keys))
        out = jax.vmap(step)(*steps)
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

    ignores_key = True

    @abc.abstractmethod
    def forward(self, x: Any) -> Any:
        """The output for one env's input `x`."""

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del state, extras, key
        return StatefulModuleOutput((), self.forward(x), zero_loss(), {}, None)


class AbstractLayerWrapper(AbstractStatefulModule):
    """Runs one `layer` and rewrites each step's output with `wrap_output`.

    Everything else is `layer`'s: its key, carry, resets, statistics and
    (possibly parallel) `replay`. A replay returns neither metrics nor
    extras, so `wrap_output` may change only those two.
    """

    layer: eqx.AbstractVar[AbstractStatefulModule]

    @abc.abstractmethod
    def wrap_output(self, out: StatefulModuleOutput) -> StatefulModuleOutput:
        """This step's output, given what `layer` returned."""

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        return self.wrap_output(self.layer(state, x, extras, key=key))

    def replay(self, state0, xs, extras, keys, done) -> SequenceOutput:
        return self.layer.replay(state0, xs, extras, keys, done)

    def initial_state(self) -> State:
        return self.layer.initial_state()

    def reset_state(self, prev_state: State) -> State:
        return self.layer.reset_state(prev_state)

    def update_statistics(self, extras: Any) -> "AbstractLayerWrapper":
        return eqx.tree_at(
            lambda wrapper: wrapper.layer, self, self.layer.update_statistics(extras)
        )


_MERGED = contextvars.ContextVar("eqx_ppo_merged_steps", default=False)


def merges_steps() -> bool:
    """Whether a replay runs its carry-less work on the `T x M` steps merged
    into one axis of rows, or on `[T, M, ...]`. Merged on a CPU (XLA:CPU's
    weight gradients of 2-D matmuls are about twice as fast), on a GPU, and
    inside `merged_steps()`; `[T, M, ...]` on a TPU otherwise, where the
    merged rows' backward pass moved about twice the bytes
    (`benchmarks/results/tpu_layout.md`)."""
    return jax.default_backend() != "tpu" or _MERGED.get()


@contextlib.contextmanager
def merged_steps():
    """Programs traced in this context replay their steps merged into rows on
    every backend. Trace a `vmap` of your own over seeds or settings here:
    with the weights batched, a TPU trained at 0.56x the speed on
    `[T, M, ...]`. `TrainConfig(n_seeds=...)` does this itself. A function
    already traced outside keeps its layout."""
    token = _MERGED.set(True)
    try:
        yield
    finally:
        _MERGED.reset(token)


def zero_loss() -> Float[Array, ""]:
    """The regularisation loss of a layer that adds none."""
    return jnp.zeros((), jnp.float32)


def checked_output(layer: Any, state: Any, out: Any) -> StatefulModuleOutput:
    """`out`, what `layer` returned for one env's carry `state`, if it keeps
    the module contract; else an error naming the layer, at trace time."""
    name = type(layer).__name__
    if not isinstance(out, StatefulModuleOutput):
        raise TypeError(
            f"{name}.__call__ returned {type(out).__name__}; a layer must return a "
            "StatefulModuleOutput(next_state, output, regularization_loss, "
            "metrics, extras)."
        )
    _check_carry(f"{name}.__call__ returned the next_state", out.next_state, state)
    if jnp.shape(out.regularization_loss) != ():
        raise ValueError(
            f"{name}.__call__ returned a regularization_loss of shape "
            f"{jnp.shape(out.regularization_loss)}; it must be one number per env "
            "(shape ()): sum or average it over the layer's units."
        )
    return out


def _check_carry(call: str, got: State, expected: State) -> None:
    """Raise unless the carry `got`, which `call` returned, keeps the
    structure, shapes and dtypes of `expected`, as the rollout's scan needs."""
    got, expected = carry_spec(got), carry_spec(expected)
    if got != expected:
        raise ValueError(
            f"{call} {tree_spec(got)} for the carry {tree_spec(expected)}; a "
            "layer's carry must keep the structure, shapes and dtypes its "
            "initial_state gives, step after step, so that the rollout can scan "
            "it. Fix: return a carry shaped like the one passed in (one env's, "
            "e.g. initial_state())."
        )


def reset_where(
    module: AbstractStatefulModule, done: Bool[Array, ""], state: State
) -> State:
    """One env's carry, reset if `done`: the rule the rollout and replay share."""
    fresh = module.reset_state(state)
    call = f"{type(module).__name__}.reset_state (or that of a layer inside it)"
    _check_carry(f"{call} returned the carry", fresh, state)
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

    `key` is split into one key per env as the rollout splits it, so this
    reproduces the per-env calls (to float rounding).
    """
    n = jnp.shape(jax.tree.leaves(x)[0])[0]
    keys = None if key is None else jax.random.split(key, n)
    return jax.vmap(lambda s, xi, e, k: module(s, xi, e, key=k))(state, x, extras, keys)
