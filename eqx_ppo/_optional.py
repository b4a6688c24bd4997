"""Optional dependencies, imported only when a feature that needs one runs."""

import importlib
from types import ModuleType


def import_optional(module: str, needed_by: str, extra: str) -> ModuleType:
    """`module`, or an `ImportError` naming `needed_by` and the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{needed_by} needs {module}. Fix: pip install 'eqx_ppo[{extra}]'."
        ) from error
