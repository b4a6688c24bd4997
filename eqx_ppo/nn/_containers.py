"""Containers: compose stateful modules into one.

`state`, `extras` and `metrics` are dicts keyed like the children; `replay`
routes a `[T, M]` batch with the code a call routes one step with, so only
recurrent children are scanned. Named children are stored sorted by name, as
JAX flattens a dict, so that output layouts survive `jit` and `tree_map`.
"""

import abc
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._typecheck import checked, each
from ._keys import child_key
from ._module import (
    AbstractLayerWrapper,
    AbstractStatefulModule,
    SequenceOutput,
    State,
    StatefulModuleOutput,
    checked_output,
    zero_loss,
)

Run = Callable[[Hashable, Any], Any]
"""Runs one child, by name, on its input and returns its output."""

PerStep = Callable[[Callable], Callable]
"""Lifts a function of one step's outputs to a call's or a replay's."""


def _child(extras: Any, name: Hashable) -> Any:
    return None if extras is None else extras[name]


class _AbstractContainer(AbstractStatefulModule):
    """A module over children. A subclass names them (`_children`, in the
    order they run) and says how an input flows through them (`_route`,
    shared by call and replay).
    """

    @abc.abstractmethod
    def _children(self) -> dict[Hashable, AbstractStatefulModule]:
        """The children by name or position, in the order they run."""

    @abc.abstractmethod
    def _route(self, run: Run, x: Any, per_step: PerStep) -> Any:
        """The output for input `x`; `run(name, input)` runs each child once,
        in `_children`'s order. Code that combines one step's outputs goes
        through `per_step` (in a replay they have `[T, M]` axes)."""

    def __check_init__(self):
        if not self._children():
            raise ValueError(
                f"`{type(self).__name__}()` needs at least one child module, got none."
            )

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        return _Routed(self, ())(state, x, extras, key=key)

    def replay(self, state0, xs, extras, keys, done) -> SequenceOutput:
        return _Routed(self, ()).replay(state0, xs, extras, keys, done)

    def initial_state(self) -> dict[Hashable, State]:
        return {name: child.initial_state() for name, child in self._children().items()}

    def reset_state(self, prev_state: dict[Hashable, State]) -> dict[Hashable, State]:
        return {
            name: child.reset_state(prev_state[name])
            for name, child in self._children().items()
        }

    def update_statistics(self, extras) -> "_AbstractContainer":
        children = self._children().items()
        updated = [child.update_statistics(_child(extras, n)) for n, child in children]
        return eqx.tree_at(lambda c: list(c._children().values()), self, updated)


class _Routed(AbstractStatefulModule):
    """A container run at `path` below the one given the key: its layers
    get that key folded by their whole path."""

    container: _AbstractContainer
    path: tuple[Hashable, ...] = eqx.field(static=True)

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        children = self.container._children()
        outs: dict[Hashable, StatefulModuleOutput] = {}

        def run(name: Hashable, child_x: Any) -> Any:
            child = children[name]
            module, child_keys = _at(child, (*self.path, name), key)
            out = module(state[name], child_x, _child(extras, name), key=child_keys)
            outs[name] = checked_output(child, state[name], out)
            return out.output

        output = self.container._route(run, x, lambda f: f)
        return StatefulModuleOutput(
            next_state={name: out.next_state for name, out in outs.items()},
            output=output,
            regularization_loss=sum(
                (out.regularization_loss for out in outs.values()), zero_loss()
            ),
            metrics={name: out.metrics for name, out in outs.items()},
            extras={name: out.extras for name, out in outs.items()},
        )

    def replay(self, state0, xs, extras, keys, done) -> SequenceOutput:
        children = self.container._children()
        outs: dict[Hashable, SequenceOutput] = {}

        def run(name: Hashable, child_xs: Any) -> Any:
            module, child_keys = _at(children[name], (*self.path, name), keys)
            outs[name] = module.replay(
                state0[name], child_xs, _child(extras, name), child_keys, done
            )
            return outs[name].output

        output = self.container._route(run, xs, lambda f: jax.vmap(jax.vmap(f)))
        return SequenceOutput(
            last_state={name: out.last_state for name, out in outs.items()},
            output=output,
            regularization_loss=sum(
                (out.regularization_loss for out in outs.values()),
                jnp.zeros(done.shape, jnp.float32),
            ),
        )

    def initial_state(self) -> State:
        return self.container.initial_state()

    def reset_state(self, prev_state: State) -> State:
        return self.container.reset_state(prev_state)


def _at(child: AbstractStatefulModule, path: tuple[Hashable, ...], key: Any):
    """What runs `child` at `path`, and its key(s): a container (or a wrapper
    of one) takes its parent's and routes the path on; a layer gets its own."""
    routed = _routed(child, path)
    if routed is not None:
        return routed, key
    return child, None if child.ignores_key else child_key(key, path)


def _routed(child: AbstractStatefulModule, path: tuple[Hashable, ...]) -> Any:
    """`child` routed at `path` if it is a container or wraps one (around
    the routed container); `None` for a layer."""
    if isinstance(child, _AbstractContainer):
        return _Routed(child, path)
    if isinstance(child, AbstractLayerWrapper):
        inner = _routed(child.layer, path)
        if inner is not None:
            return eqx.tree_at(lambda wrapper: wrapper.layer, child, inner)
    return None


class _AbstractNamedContainer(_AbstractContainer):
    """Children by name, given as a dict or as keywords, stored sorted."""

    modules: dict[str, AbstractStatefulModule]

    def __init__(
        self,
        modules: each(Mapping, AbstractStatefulModule) | None = None,
        /,
        **kwargs: AbstractStatefulModule,
    ):
        if modules is not None and kwargs:
            name = type(self).__name__
            raise ValueError(
                f"`{name}(...)` got both a positional dict and keyword arguments; "
                f"pass the children one way, e.g. `{name}(a=module_a, b=module_b)` "
                f'or `{name}({{"a": module_a, "b": module_b}})`.'
            )
        children = kwargs if modules is None else modules
        self.modules = {name: children[name] for name in sorted(children)}

    def __getitem__(self, name: str) -> AbstractStatefulModule:
        return self.modules[name]

    def _children(self) -> dict[str, AbstractStatefulModule]:
        return self.modules


def _dispatch(container: "Map | Concat", x: Any, run: Run) -> dict[str, Any]:
    """Each child `k` run on the entry `x[k]`: a per-key container's outputs."""
    names = list(container.modules)
    if not isinstance(x, Mapping) or any(name not in x for name in names):
        seen = f"keys {sorted(x)}" if isinstance(x, Mapping) else type(x).__name__
        raise ValueError(
            f"`{type(container).__name__}` feeds child `k` the entry `x[k]` of a "
            f"dict input, so it needs a dict with keys {names}; got {seen}. Rename "
            "the children or the input keys so they match."
        )
    return {name: run(name, x[name]) for name in names}


@checked
class Sequential(_AbstractContainer):
    """Chains layers: the output of layer `i` is the input of layer `i + 1`.

    State, extras and metrics are dicts keyed by position: `{0: ..., 1: ...}`.

    **Arguments:**

    - `layers`: a non-empty sequence of stateful modules.
    """

    layers: tuple[AbstractStatefulModule, ...]

    def __init__(self, layers: each(Sequence, AbstractStatefulModule)):
        self.layers = tuple(layers)

    def __getitem__(self, index: int) -> AbstractStatefulModule:
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    def _children(self) -> dict[int, AbstractStatefulModule]:
        return dict(enumerate(self.layers))

    def _route(self, run: Run, x: Any, per_step: PerStep) -> Any:
        for i in range(len(self.layers)):
            x = run(i, x)
        return x


@checked
class Parallel(_AbstractNamedContainer):
    """Runs every child on the same input; the output is a dict keyed by name.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children (the dict
      form for names that are not Python identifiers).
    """

    def _route(self, run: Run, x: Any, per_step: PerStep) -> dict[str, Any]:
        return {name: run(name, x) for name in self.modules}


@checked
class Map(_AbstractNamedContainer):
    """Per-key dispatch: child `k` maps `x[k]` to `output[k]`.

    Other entries of the dict input are dropped. E.g. one sampler per action
    key: `Map(arm=NormalTanhSampler(...), gripper=CategoricalSampler(...))`.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children.
    """

    def _route(self, run: Run, x: Any, per_step: PerStep) -> dict[str, Any]:
        return _dispatch(self, x, run)


@checked
class Concat(_AbstractNamedContainer):
    """Per-key dispatch, then concatenation along the last axis.

    Child `k` sees `x[k]` (other entries are dropped); the outputs are
    concatenated in **sorted key order** (`Concat(vision=..., proprio=...)`
    puts `proprio` first).

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children.
    """

    def _route(self, run: Run, x: Any, per_step: PerStep) -> Array:
        outputs = _dispatch(self, x, run)
        return per_step(lambda out: jnp.concatenate(list(out.values()), -1))(outputs)


def _merge(outputs: dict[str, Any]) -> dict[Any, Any]:
    producer: dict[Any, str] = {}
    for name, out in outputs.items():
        for out_key in out:
            if out_key in producer:
                raise ValueError(
                    f"`Merge`: children {producer[out_key]!r} and {name!r} both "
                    f"produce the key {out_key!r}; rename one of the outputs."
                )
            producer[out_key] = name
    return {out_key: outputs[name][out_key] for out_key, name in producer.items()}


@checked
class Merge(_AbstractNamedContainer):
    """Runs every child on the same input and merges their dict outputs into
    one flat dict; two children producing the same key is an error.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children.
    """

    def _route(self, run: Run, x: Any, per_step: PerStep) -> dict[Any, Any]:
        return per_step(_merge)({name: run(name, x) for name in self.modules})
