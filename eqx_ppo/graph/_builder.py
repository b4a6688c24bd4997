"""PopulationGraphBuilder: the mutable description a PopulationGraph is built from."""

import dataclasses
import graphlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Key

from .._typecheck import checked
from ..nn._dense import Activation, Dense, get_activation
from ..nn._module import AbstractStatefulModule
from ._graph import ACTIVATION_KEY, ConnectionSpec, PopulationGraph, PopulationSpec


@checked
class PopulationGraphBuilder:
    """Describe a population graph step by step, then `finalize` it.

    `finalize(key=...)` validates the description and returns an immutable
    [`eqx_ppo.graph.PopulationGraph`][]; after it the builder refuses further
    changes. Every method returns the builder, so calls can be chained (see the
    population graph guide for an example).
    """

    def __init__(self):
        self._populations: dict[str, PopulationSpec] = {}
        self._connections: list[ConnectionSpec] = []
        # Each connection's transform by name, `None` for a default (Dense) one.
        self._transforms: dict[str, AbstractStatefulModule | None] = {}
        self._finalized = False

    @checked
    def add_population(
        self, name: str, size: int, *, activation: Activation | None = None
    ) -> "PopulationGraphBuilder":
        """Add a hidden population of `size` units (the size every incoming
        transform must output) under a unique `name`; `activation` (`None`, a
        callable or a name) is applied to its summed input."""
        return self._add(name, size, activation, "hidden")

    @checked
    def add_input(
        self,
        name: str,
        size: int,
        *,
        input_from: str | None = None,
        activation: Activation | None = None,
    ) -> "PopulationGraphBuilder":
        """Add a population that sums the observation into its input: the key
        `input_from` of a dict observation, or with `None` the whole (array)
        observation. `name`, `size` and `activation` are as in `add_population`."""
        return self._add(name, size, activation, "input", input_from)

    @checked
    def add_output(
        self,
        name: str,
        size: int,
        *,
        output_to: str | None = None,
        activation: Activation | None = None,
    ) -> "PopulationGraphBuilder":
        """Add a population whose activity appears in the graph's output dict,
        under the key `output_to` (by default `name`). `name`, `size` and
        `activation` are as in `add_population`."""
        key = name if output_to is None else output_to
        taken = [p.name for p in self._populations.values() if p.output_to == key]
        if taken:
            raise ValueError(
                f"add_output({name!r}, output_to={key!r}): population {taken[0]!r} "
                "already writes that output key; pick another output_to."
            )
        return self._add(name, size, activation, "output", None, key)

    @checked
    def connect(
        self,
        src: str,
        dst: str,
        *,
        transform: AbstractStatefulModule | None = None,
        delay: int = 0,
        reciprocal: bool = False,
        name: str | None = None,
    ) -> "PopulationGraphBuilder":
        """Feed `src`'s activity into `dst`'s summed input.

        **Arguments:**

        - `src`, `dst`: names of populations added before.
        - `transform`: a stateful module mapping `(src size,)` to `(dst size,)`;
            `None` creates a learned linear map at `finalize`.
        - `delay`: `0` reads `src`'s activity of this step, `k` that of `k`
            steps ago.
        - `reciprocal`: also connect `dst` to `src` (needs `transform=None`).
        - `name`: the connection's name; defaults to `"src->dst"`, plus `"@k"`
            for a delay `k`.
        """
        pending = [self._pending(src, dst, transform, delay, name, reciprocal, [])]
        if reciprocal:
            pending.append(
                self._pending(dst, src, None, delay, None, reciprocal, pending)
            )
        # Checked in full before either is added: a failed call adds nothing.
        self._connections.extend(pending)
        self._transforms.update({spec.name: transform for spec in pending})
        return self

    @checked
    def finalize(self, *, key: Key[Array, ""]) -> PopulationGraph:
        """Validate the description and build the immutable graph; `key`
        initialises the default (learned linear) transforms."""
        self._check_open()
        pops = self._populations
        names = [*pops, *self._transforms]
        inputs = [p for p in pops.values() if p.role == "input"]
        whole = [p.name for p in inputs if p.input_from is None]
        keyed = [p.name for p in inputs if p.input_from is not None]
        problems = [
            (
                ACTIVATION_KEY in names,
                f"the name {ACTIVATION_KEY!r} is reserved for recorded "
                "activations; rename that population or connection.",
            ),
            (
                all(p.role != "output" for p in pops.values()),
                "the graph has no output population, so its output would be "
                "empty; add one with add_output.",
            ),
            (
                whole and keyed,
                f"inputs {whole} read the whole observation while {keyed} read "
                "dict keys; an observation cannot be both. Give every input an "
                "input_from key (dict observations) or none (array observations).",
            ),
        ]
        for found, problem in problems:
            if found:
                raise ValueError(f"PopulationGraphBuilder.finalize(): {problem}")
        specs = self._connections
        order = _topological_order(pops, specs)
        reached = {name for name, p in pops.items() if p.role == "input"}
        for _ in pops:  # a path visits each population at most once
            reached |= {conn.dst for conn in specs if conn.src in reached}
        unreached = [n for n in pops if pops[n].role == "output" and n not in reached]
        if unreached:
            what, it = (
                (f"population {unreached[0]!r} is", "it")
                if len(unreached) == 1
                else (f"populations {', '.join(map(repr, unreached))} are", "them")
            )
            first = "" if inputs else " (add one with add_input first)"
            raise ValueError(
                f"PopulationGraphBuilder.finalize(): output {what} not reached from "
                "any input through connections (of any delay): the observation "
                f"never affects {it}; connect an input{first} to {it}, directly or "
                "through other populations."
            )
        keys = jax.random.split(key, len(specs))
        transforms = {
            spec.name: self._build_transform(spec, k)
            for spec, k in zip(specs, keys, strict=True)
        }
        # Sorted by name, the order JAX flattens dicts in: the graph iterates
        # its transforms the same way before and after `jit` or `tree_map`.
        transforms = {name: transforms[name] for name in sorted(transforms)}
        # A population's ring buffer holds as many steps as its longest delay.
        populations = tuple(
            dataclasses.replace(
                p, buffer_length=max((s.delay for s in specs if s.src == n), default=0)
            )
            for n, p in pops.items()
        )
        self._finalized = True
        return PopulationGraph(
            transforms=transforms,
            populations=populations,
            connections=tuple(specs),
            order=order,
        )

    def _add(
        self, name: str, size: int, activation: Activation | None, *rest: Any
    ) -> "PopulationGraphBuilder":
        spec = PopulationSpec(name, size, get_activation(activation), *rest)
        method = "add_population" if spec.role == "hidden" else f"add_{spec.role}"
        self._check_open()
        if name in self._populations:
            raise ValueError(
                f"{method}({name!r}, ...): a population named {name!r} already "
                "exists; population names must be unique."
            )
        self._populations[name] = spec
        return self

    def _pending(
        self,
        src: str,
        dst: str,
        transform: AbstractStatefulModule | None,
        delay: int,
        name: str | None,
        reciprocal: bool,
        pending: list[ConnectionSpec],
    ) -> ConnectionSpec:
        """The connection `src -> dst`, checked against the builder's and the
        `pending` ones of the same call, not added."""
        self._check_open()
        known = list(self._populations)
        if name is None:
            name = f"{src}->{dst}" + (f"@{delay}" if delay else "")
        problems = [
            (
                reciprocal and transform is not None,
                "reciprocal=True needs transform=None: a module maps one "
                "direction only. Call connect twice, once per direction, to use "
                "custom transforms.",
            ),
            (
                src not in known,
                f"unknown source population {src!r}; known populations are "
                f"{known}. Add it first.",
            ),
            (
                dst not in known,
                f"unknown destination population {dst!r}; known populations are "
                f"{known}. Add it first.",
            ),
            (
                delay < 0,
                f"delay must be >= 0 (0 = same step, k = k steps ago); got {delay}.",
            ),
            (
                any(c.name == name for c in [*self._connections, *pending]),
                f"a connection named {name!r} already exists; pass name=... to "
                "tell parallel connections apart, or connect each direction with "
                "a call of its own.",
            ),
        ]
        for found, problem in problems:
            if found:
                raise ValueError(f"connect({src!r}, {dst!r}): {problem}")
        return ConnectionSpec(name, src, dst, delay)

    def _build_transform(
        self, spec: ConnectionSpec, key: Key[Array, ""]
    ) -> AbstractStatefulModule:
        src, dst = self._populations[spec.src], self._populations[spec.dst]
        transform = self._transforms[spec.name]
        if transform is None:
            return Dense(src.size, dst.size, key=key)
        out = eqx.filter_eval_shape(
            lambda t: t(t.initial_state(), jnp.zeros(src.size), key=jax.random.key(0)),
            transform,
        ).output
        if not isinstance(out, jax.ShapeDtypeStruct) or out.shape != (dst.size,):
            got = out.shape if isinstance(out, jax.ShapeDtypeStruct) else out
            raise ValueError(
                f"PopulationGraphBuilder.finalize(): connection {spec.name!r} "
                f"({src.name!r}, size {src.size} -> {dst.name!r}, size {dst.size}): "
                f"its transform must output shape ({dst.size},) for one env, but "
                f"outputs {got}. Use a transform sized {src.size} -> {dst.size}."
            )
        return transform

    def _check_open(self) -> None:
        if self._finalized:
            raise RuntimeError(
                "PopulationGraphBuilder: the builder was already finalized; start "
                "a new PopulationGraphBuilder to build another graph."
            )


def _topological_order(
    populations: dict[str, Any], connections: list[ConnectionSpec]
) -> tuple[str, ...]:
    """The populations ordered along the delay-0 connections, ties broken by
    insertion order; a delay-0 cycle is refused, named in order."""
    sorter = graphlib.TopologicalSorter({name: [] for name in populations})
    for conn in connections:
        if conn.delay == 0:
            sorter.add(conn.dst, conn.src)
    try:
        return tuple(sorter.static_order())
    except graphlib.CycleError as e:
        raise ValueError(
            "PopulationGraphBuilder.finalize(): delay-0 cycle "
            f"{' -> '.join(e.args[1])}; a population cannot depend on its own "
            "activity in the same step. Give one of these connections delay >= 1."
        ) from None
