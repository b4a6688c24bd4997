"""The environment protocol, wrappers, auto-reset and built-in pure-JAX envs."""

from ._state import State as State
