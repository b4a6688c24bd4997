"""Loading checkpoints written in an older layout.

When the training state's layout changes, the format version is bumped and
the state's owner registers a migration for the old version: how to turn
today's template into the saved layout (so the saved file is checked and
read as written) and how to turn the state read that way into today's. A
checkpoint whose layout matches no migration (e.g. a user's own pytree) is
loaded as is.
"""

from collections.abc import Callable
from typing import Any, NamedTuple


class Migration(NamedTuple):
    format_version: int
    root: str
    to_saved: Callable[[Any, str], Any]
    from_saved: Callable[[Any], Any]


_MIGRATIONS: list[Migration] = []


def register_migration(
    format_version: int,
    *,
    root: str,
    to_saved: Callable[[Any, str], Any],
    from_saved: Callable[[Any], Any],
) -> None:
    """Load format-`format_version` checkpoints whose state is a `root` (the
    class name at the root of the saved pytree) into today's layout.

    `to_saved(template, saved_treedef)` gives today's template in the saved
    layout (`saved_treedef`, the saved pytree definition, supplies static
    values today's template holds as leaves) and `from_saved(state)` today's
    state from one read in the saved layout; both work on arrays and on
    shape templates.
    """
    _MIGRATIONS.append(Migration(format_version, root, to_saved, from_saved))


def find_migration(format_version: int, treedef: str) -> Migration | None:
    """The migration for a checkpoint of `format_version` with `treedef`."""
    for migration in _MIGRATIONS:
        if migration.format_version == format_version and treedef.startswith(
            f"PyTreeDef(CustomNode({migration.root}["
        ):
            return migration
    return None
