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

**Sequences.** `replay_sequence` replays one env's whole length-`T` rollout
(leaves `[T, ...]`); the loss replays a minibatch of `M` envs with
`replay_envs` (leaves `[T, M, ...]`). By default a layer without a carry runs
once over all `T x M` steps, and a layer with a carry is scanned over time,
env by env; containers replay child by child, so only their recurrent
children are scanned, and a recurrence with a parallel form (an associative
scan) may override both.
"""

import abc
import dataclasses
import math
import reprlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Key, PRNGKeyArray, PyTree

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
    """What [`eqx_ppo.nn.AbstractStatefulModule.replay_sequence`][] returns.

    **Fields:**

    - `last_state`: the carry after the last step (reset if that step was done).
    - `output`: the outputs of every step, leaves `[T, ...]`.
    - `regularization_loss`: `Float[Array, "time"]`, one value per step.
    """

    last_state: State
    output: Any
    regularization_loss: Float[Array, " time"]


class AbstractStatefulModule(eqx.Module):
    """Base class of every layer and container.

    Subclasses implement `__call__`; layers with a carry override
    `initial_state`; layers that keep running statistics override
    `update_statistics`; containers (and recurrences with a parallel form)
    override `replay_sequence`, or subclass `AbstractReplayEnvs` and override
    `replay_envs`. See the module docstring for the batching convention.
    """

    @abc.abstractmethod
    def __call__(
        self,
        state: State,
        x: Any,
        extras: Any = None,
        *,
        key: PRNGKeyArray | None = None,
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

    @property
    def uses_key(self) -> bool:
        """Whether a call may draw randomness from `key`.

        Containers hand keys only to the children that use one (see
        [`eqx_ppo.nn.route_keys`][]), so deterministic layers cost no key
        split. `True` is always safe and is the default; deterministic layers
        override it with `False`.
        """
        return True

    def replay_sequence(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, " time"] | None,
        done: Bool[Array, " time"],
    ) -> SequenceOutput:
        """Replay one env's length-`T` sequence, as `T` calls of `__call__` would.

        **Arguments:**

        - `state0`: the carry before the first step.
        - `xs`, `extras`: the inputs and the rollout's extras, leaves `[T, ...]`
          (`extras=None` acts afresh at every step).
        - `keys`: one key per step, `[T]`, or `None`.
        - `done`: `[T]`; after a step with `done`, the carry is reset with
          `reset_state`, exactly as the rollout reset it.

        The default runs a module without a carry once over all `T` steps (one
        batched call) and scans `__call__` over time otherwise. An override
        must give the step-by-step values (to float rounding) and route keys
        and extras exactly as `__call__` does; see the custom layer guide.
        """
        if not jax.tree.leaves(state0):
            out = jax.vmap(lambda x, e, k: self(state0, x, e, key=k))(xs, extras, keys)
            return SequenceOutput(state0, out.output, out.regularization_loss)
        return scan_sequence(self, state0, xs, extras, keys, done)

    def replay_envs(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        """Replay `M` envs' length-`T` sequences at once: what the loss calls.

        The arguments and results are `replay_sequence`'s with an env axis:
        carries `[M, ...]`, every other leaf `[T, M, ...]`.

        The default replays a module without a carry as one sequence of all
        `T x M` steps, since each step stands alone: XLA runs the matmuls of
        one `[T x M, ...]` batch, and their weight gradients above all,
        faster than those of a `[T, M, ...]` one. A module with a carry has
        `replay_sequence` vmapped over the envs. Containers override it to
        replay child by child, so each child chooses for itself.
        """
        check_env_batch(type(self).__name__, xs, extras, keys, done)
        if jax.tree.leaves(state0):
            return jax.vmap(
                self.replay_sequence,
                in_axes=(0, 1, 1, 1, 1),
                out_axes=SequenceOutput(0, 1, 1),
            )(state0, xs, extras, keys, done)
        n_envs = jnp.shape(done)[1]
        out = self.replay_sequence(state0, *merge_envs((xs, extras, keys, done)))
        return SequenceOutput(state0, *split_envs(out[1:], n_envs))

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
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(
                f"{type(self).__name__}.initialize_state(batch_size={batch_size!r}): "
                "expected an int (the number of envs) or None."
            )
        if batch_size < 0:
            raise ValueError(
                f"{type(self).__name__}.initialize_state(batch_size={batch_size}): "
                "the number of envs must be >= 0."
            )
        return jax.tree.map(
            lambda s: jnp.broadcast_to(s, (batch_size, *jnp.shape(s))), state
        )


class AbstractDeterministicModule(AbstractStatefulModule):
    """A module that never draws randomness: `uses_key` is `False`.

    Containers hand it no key, so it costs no key split.
    """

    @property
    def uses_key(self) -> bool:
        return False


class AbstractStatelessLayer(AbstractDeterministicModule):
    """A deterministic layer without carry, loss or metrics: implement `forward`.

    `__call__` ignores `state`, `extras` and `key` and returns `forward(x)`
    with carry `()`, zero regularisation and no metrics; `uses_key` is
    `False`, so containers hand it no key.
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
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        """`forward(x)`, with carry `()`."""
        del state, extras, key
        return StatefulModuleOutput((), self.forward(x), zero_loss(), {}, None)


class AbstractLayerWrapper(AbstractStatefulModule):
    """Runs one `layer` and rewrites each step's output with `wrap_output`.

    Everything else is `layer`'s: its key use, carry, resets and statistics
    (`update_statistics` returns the wrapper around the updated layer), and
    its own (possibly parallel) `replay_sequence` and `replay_envs`. A replay
    returns neither metrics nor extras, so `wrap_output` may change only
    those two.
    """

    layer: eqx.AbstractVar[AbstractStatefulModule]

    def __check_init__(self):
        if not isinstance(self.layer, AbstractStatefulModule):
            raise TypeError(
                f"`{type(self).__name__}(layer=...)` must be an "
                f"AbstractStatefulModule, got {type(self.layer).__name__}; wrap "
                "plain functions in a layer."
            )

    @abc.abstractmethod
    def wrap_output(self, out: StatefulModuleOutput) -> StatefulModuleOutput:
        """This step's output, given what `layer` returned."""

    @property
    def uses_key(self) -> bool:
        return self.layer.uses_key

    def __call__(
        self,
        state: State,
        x: Any,
        extras: Any = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        return self.wrap_output(self.layer(state, x, extras, key=key))

    def replay_sequence(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, " time"] | None,
        done: Bool[Array, " time"],
    ) -> SequenceOutput:
        return self.layer.replay_sequence(state0, xs, extras, keys, done)

    def replay_envs(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        return self.layer.replay_envs(state0, xs, extras, keys, done)

    def initial_state(self) -> State:
        return self.layer.initial_state()

    def reset_state(self, prev_state: State) -> State:
        return self.layer.reset_state(prev_state)

    def update_statistics(self, extras: Any) -> "AbstractLayerWrapper":
        return eqx.tree_at(
            lambda wrapper: wrapper.layer, self, self.layer.update_statistics(extras)
        )


class AbstractStatistics(eqx.Module):
    """Marks arrays that are never trained (e.g. a normaliser's running moments).

    [`eqx_ppo.nn.trainable`][] excludes every array inside a subclass, so the
    optimiser, gradient norms and weight logging skip them.
    """


def _is_statistics(node: Any) -> bool:
    return isinstance(node, AbstractStatistics)


def coefficient(**kwargs: Any) -> Any:
    """A field for a layer's coefficient, e.g. an entropy or KL weight.

    The value is stored as a float32 array: a pytree leaf, so changing it
    does not recompile and a sweep can `vmap` over it, but
    [`eqx_ppo.nn.trainable`][] leaves it out, so the optimiser never moves it.
    `eqx.tree_at` skips the conversion: replace it with an array,
    `jnp.float32(0.02)`, not a Python float (which `eqx.filter_jit` would
    treat as a static value, compiling once per value).
    A concrete value stays concrete even when the layer is built inside a
    trace (a factory under `eqx.filter_jit`), so it is still checked there.
    """
    return eqx.field(
        converter=_concrete_float32,
        metadata={"coefficient": True},
        **kwargs,
    )


def _concrete_float32(x: Any) -> Array:
    """`jnp.asarray(x, float32)`, evaluated now unless `x` is itself traced."""
    with jax.ensure_compile_time_eval():
        return jnp.asarray(x, jnp.float32)


def check_coefficient(where: str, value: Any) -> None:
    """Raise if a concrete coefficient is negative, infinite or NaN (traced
    values pass)."""
    if not isinstance(value, jax.core.Tracer) and not 0 <= float(value) < math.inf:
        raise ValueError(f"`{where}={value}` must be finite and >= 0.")


def coefficient_names(node: Any) -> tuple[str, ...]:
    """The names of a module's `coefficient` fields; `()` for anything else."""
    if not isinstance(node, eqx.Module):
        return ()
    fields = dataclasses.fields(node)
    return tuple(f.name for f in fields if f.metadata.get("coefficient", False))


def trainable(model: PyTree) -> PyTree[bool]:
    """A filter spec selecting the trainable leaves of `model`.

    Trainable means: a floating-point array not inside an
    [`eqx_ppo.nn.AbstractStatistics`][] and not a
    [`coefficient`][eqx_ppo.nn.coefficient] field. Use it with `eqx.partition`:

    ```python
    params, static = eqx.partition(model, eqx_ppo.nn.trainable(model))
    ```
    """

    def special(node: Any) -> bool:
        return _is_statistics(node) or bool(coefficient_names(node))

    def mark(node: Any) -> Any:
        if _is_statistics(node):
            return jax.tree.map(lambda _: False, node)
        names = coefficient_names(node)
        if names:
            spec = jax.tree.map(
                mark, node, is_leaf=lambda x: x is not node and special(x)
            )
            return eqx.tree_at(
                lambda s: [getattr(s, n) for n in names],
                spec,
                replace=[False] * len(names),
            )
        return eqx.is_inexact_array(node)

    return jax.tree.map(mark, model, is_leaf=special)


def zero_loss() -> Float[Array, ""]:
    """The regularisation loss of a layer that adds none."""
    return jnp.zeros((), jnp.float32)


def input_shape_fix(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """How to fix a layer's input of shape `got` where one env's `want` is
    expected: vmap if `got` is a batch of `want`, otherwise match the sizes."""
    if len(got) > len(want) and got[len(got) - len(want) :] == want:
        return (
            "Layers work on a single env: vmap over the env axis, or use "
            "`eqx_ppo.nn.apply_batched`."
        )
    if len(got) < len(want):
        return (
            "The input has fewer axes than one env's: vmap and `apply_batched` "
            "take the leading axis as the env axis, so give them a batch [B, ...]; "
            "otherwise build the network for one env's observation "
            "(obs_size=env.observation_size)."
        )
    return (
        "The sizes differ: build the network for one env's observation "
        "(obs_size=env.observation_size), or the layer for its input."
    )


def array_spec(x: Any) -> str:
    """`float32[8, 2]` for an array or a `jax.ShapeDtypeStruct`, else the type."""
    if eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


def tree_spec(tree: Any) -> str:
    """`{'h': 'float32[8]'}`: `tree` with each array as its `array_spec`."""
    return str(jax.tree.map(array_spec, tree))


def _carry_spec(tree: Any) -> Any:
    """What a scan's carry must keep from step to step: the structure and each
    leaf's shape and dtype (not its weak type), as `jax.ShapeDtypeStruct`s."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree
    )


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
    got, expected = _carry_spec(out.next_state), _carry_spec(state)
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


def check_key(
    where: str, key: Any, several: str = "vmap over keys to use several"
) -> None:
    """Raise a `TypeError` unless `key` is one PRNG key: a typed key
    (`jax.random.key`) or legacy raw key data (`jax.random.PRNGKey`, uint32).
    `several` tells how `where` takes more than one key."""
    if eqx.is_array(key):
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            if key.shape == ():
                return
        elif key.dtype == np.uint32 and key.shape in ((2,), (4,)):
            return
        value, seen = array_spec(key), f"a {array_spec(key)} array"
    else:
        value, seen = reprlib.repr(key), type(key).__name__
    raise TypeError(
        f"{where}(key={value}): expected a PRNG key such as jax.random.key(0), got "
        f"{seen}. Fix: pass a single key, e.g. key=jax.random.key(seed) "
        f"({several})."
    )


def split_key(key: PRNGKeyArray | None, n: int) -> list[PRNGKeyArray | None]:
    """Split `key` among `n` children; `None` stays `None` (deterministic calls)."""
    if key is None:
        return [None] * n
    return list(jax.random.split(key, n))


def route_keys(
    key: PRNGKeyArray | None, children: Sequence[AbstractStatefulModule]
) -> list[PRNGKeyArray | None]:
    """One key per child, for the children whose `uses_key` is set.

    Children that use no key get `None`. A single user gets `key` itself; more
    users get one split of it, in order. Every container routes keys this way,
    so a network with one stochastic layer (e.g. its sampler) spends no key
    splits at all.
    """
    users = [i for i, child in enumerate(children) if child.uses_key]
    keys: list[PRNGKeyArray | None] = [None] * len(children)
    if key is None or not users:
        return keys
    if len(users) == 1:
        keys[users[0]] = key
        return keys
    for i, child_key in zip(users, jax.random.split(key, len(users)), strict=True):
        keys[i] = child_key
    return keys


def route_sequence_keys(
    keys: Key[Array, "*steps"] | None, children: Sequence[AbstractStatefulModule]
) -> list[Key[Array, "*steps"] | None]:
    """[`eqx_ppo.nn.route_keys`][] applied to every key of a `[T]` sequence
    (or of a `[T, M]` batch of them).

    A container's replay uses it to hand each child the keys its `__call__`
    would have handed it, step by step.
    """
    if keys is None:
        return [None] * len(children)
    steps = jnp.shape(keys)
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        steps = steps[:-1]  # legacy uint32 key data: [*steps, 2]
    flat = keys.reshape(-1, *keys.shape[len(steps) :])
    routed = jax.vmap(lambda k: route_keys(k, children))(flat)
    return [None if k is None else k.reshape(*steps, *k.shape[1:]) for k in routed]


def scan_sequence(
    module: AbstractStatefulModule,
    state0: State,
    xs: Any,
    extras: Any,
    keys: Key[Array, " time"] | None,
    done: Bool[Array, " time"],
) -> SequenceOutput:
    """`module`'s `__call__` scanned over a `[T]` sequence, resetting on `done`.

    The reference every `replay_sequence` must agree with.
    """

    def step(carry, inputs):
        x, e, k, d = inputs
        out = module(carry, x, e, key=k)
        return reset_where(module, d, out.next_state), (
            out.output,
            out.regularization_loss,
        )

    last, (outputs, regularization) = jax.lax.scan(
        step, state0, (xs, extras, keys, done)
    )
    return SequenceOutput(last, outputs, regularization)


def check_env_batch(where: str, xs: Any, extras: Any, keys: Any, done: Any) -> None:
    """Raise at trace time unless `done` is a bool `[T, M]` array and every
    leaf of `xs`, `extras` and `keys` starts with the same `[T, M]`."""
    if jnp.ndim(done) != 2 or jnp.result_type(done) != jnp.bool_:
        raise ValueError(
            f"{where}.replay_envs(done={array_spec(done)}): expected a bool "
            "[T, M] array, time first, then the envs. Fix: add the env axis "
            "(`done[:, None]` for one env), or call `replay_sequence` for one "
            "env's [T] sequence."
        )
    for name, tree in (("xs", xs), ("extras", extras), ("keys", keys)):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            if jnp.shape(leaf)[:2] != jnp.shape(done):
                raise ValueError(
                    f"{where}.replay_envs({name}{jax.tree_util.keystr(path)}="
                    f"{array_spec(leaf)}): every leaf must start with done's "
                    f"[T, M] = {list(jnp.shape(done))}. Fix: lay the minibatch "
                    "out time first, then envs, as the rollout stores it."
                )


def merge_envs(tree: Any) -> Any:
    """Leaves `[T, M, ...]` as one sequence `[T x M, ...]`."""
    return jax.tree.map(lambda a: a.reshape(-1, *jnp.shape(a)[2:]), tree)


def split_envs(tree: Any, n_envs: int) -> Any:
    """Leaves `[T x M, ...]` back as `[T, M, ...]`."""
    return jax.tree.map(lambda a: a.reshape(-1, n_envs, *jnp.shape(a)[1:]), tree)


class AbstractReplayEnvs(AbstractStatefulModule):
    """A module that implements `replay_envs`; its `replay_sequence` replays
    one env as a batch of one."""

    @abc.abstractmethod
    def replay_envs(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        """See [`eqx_ppo.nn.AbstractStatefulModule.replay_envs`][]."""

    def replay_sequence(
        self,
        state0: State,
        xs: Any,
        extras: Any,
        keys: Key[Array, " time"] | None,
        done: Bool[Array, " time"],
    ) -> SequenceOutput:
        """`replay_envs` of this one env."""
        one_env = jax.tree.map(lambda a: a[:, None], (xs, extras, keys, done))
        out = self.replay_envs(jax.tree.map(lambda a: a[None], state0), *one_env)
        return SequenceOutput(
            jax.tree.map(lambda a: a[0], out.last_state),
            *jax.tree.map(lambda a: a[:, 0], out[1:]),
        )


def reset_where(
    module: AbstractStatefulModule, done: Bool[Array, ""], state: State
) -> State:
    """One env's carry, reset if `done`: the rule the rollout and replay share."""
    fresh = module.reset_state(state)
    got, expected = _carry_spec(fresh), _carry_spec(state)
    if got != expected:
        raise ValueError(
            f"{type(module).__name__}.reset_state (or that of a layer inside "
            f"it) returned a carry of {tree_spec(got)}; the carry it resets is "
            f"{tree_spec(expected)}. Fix: return a carry of the same structure, "
            "shapes and dtypes (one env's, e.g. initial_state())."
        )
    return jax.tree.map(lambda f, s: jnp.where(done, f, s), fresh, state)


def _batch_size(state: State, x: Any, extras: Any) -> int:
    """The leading env axis `[B]` shared by every leaf of `state`, `x` and
    `extras`; raises naming the first leaf that has none or another size."""
    first = None
    for name, tree in (("x", x), ("state", state), ("extras", extras)):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            where = f"{name}{jax.tree_util.keystr(path)}"
            shape = jnp.shape(leaf)
            if not shape or (first is not None and shape[0] != first[1]):
                seen = "is a scalar" if not shape else f"has {shape[0]}"
                expected = "" if first is None else f" ({first[0]} has {first[1]})"
                raise ValueError(
                    f"apply_batched({where}=...): every leaf of state, x and extras "
                    f"needs the same leading env axis [B]{expected}, but it {seen}. "
                    "Fix: batch them alike (the state from "
                    "module.initialize_state(B)), or call the module itself for "
                    "one env."
                )
            if first is None:
                first = (where, shape[0])
    if first is None:
        raise ValueError(
            "apply_batched(x=...): x has no array leaves (nor have state and "
            "extras), so there is no env axis."
        )
    return first[1]


def apply_batched(
    module: AbstractStatefulModule,
    state: State,
    x: Any,
    extras: Any = None,
    *,
    key: PRNGKeyArray | None = None,
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
    n = _batch_size(state, x, extras)
    keys = None if key is None else jax.random.split(key, n)
    return jax.vmap(
        lambda s, xi, e, k: module(s, xi, e, key=k),
    )(state, x, extras, keys)
