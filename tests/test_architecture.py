"""The engine's seams, checked on the source: storage knows no algorithm, and no
engine code dispatches on a concrete container type."""

import ast
import dataclasses
import pathlib
import re

import pytest

import eqx_ppo
from eqx_ppo.checkpoint import (
    CheckpointError,
    config_from_dict,
    config_to_dict,
    register_config,
)
from eqx_ppo.checkpoint._codec import config_differences

PACKAGE = pathlib.Path(eqx_ppo.__file__).parent
ALGORITHMS = ("eqx_ppo.ppo", "eqx_ppo.distill", "eqx_ppo.nn", "eqx_ppo.envs")
CONTAINERS = {"Sequential", "Parallel", "Map", "Concat", "Merge", "PPOAdapter"}


def imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute names of every module `path` imports, at any depth."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                names.add(".".join(base + ([node.module] if node.module else [])))
            else:
                names.add(node.module)
    return names


def test_checkpointing_imports_no_algorithm():
    files = sorted((PACKAGE / "checkpoint").glob("*.py"))
    assert files
    for path in files:
        bad = [
            name
            for name in imported_modules(path)
            if name.startswith(ALGORITHMS) or name == "eqx_ppo.logging"
        ]
        assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGE / "ppo").glob("*.py")) + [PACKAGE / "distill.py"],
    ids=lambda p: p.name,
)
def test_engine_does_not_dispatch_on_container_types(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
            "isinstance",
            "type",
        ):
            assert not names & CONTAINERS, f"{path.name}:{node.lineno}"
        if isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Is | ast.IsNot) for op in node.ops
        ):
            assert not names & CONTAINERS, f"{path.name}:{node.lineno}"


@register_config
@dataclasses.dataclass(frozen=True)
class _ThirdPartyConfig:
    """A config of an algorithm the storage has never heard of."""

    steps: int = 10
    temperature: float = 1.0
    label: str = "x"

    def free_on_resume(self):
        return frozenset({"label"})


def test_a_registered_config_round_trips_and_checks_resume():
    config = _ThirdPartyConfig(steps=3, temperature=0.5)
    assert config_from_dict(config_to_dict(config)) == config
    changed = _ThirdPartyConfig(steps=4, temperature=0.5, label="y")
    assert config_differences(config, changed) == ["steps: saved 3, given 4"]


def test_registering_two_classes_of_one_name_is_refused():
    with pytest.raises(ValueError, match="_ThirdPartyConfig.*rename one"):

        @register_config
        @dataclasses.dataclass(frozen=True)
        class _ThirdPartyConfig:
            pass


def test_an_unknown_config_type_in_a_header_is_named():
    with pytest.raises(CheckpointError, match="config: unknown config type 'Nope'"):
        config_from_dict({"_type": "Nope"})


@pytest.mark.parametrize(
    "data, seen",
    [({"ppo": {}}, "got a dict without one"), (None, "got NoneType")],
    ids=["no-type", "none"],
)
def test_config_from_dict_needs_a_typed_dict(unchecked, data, seen):
    # Without the check, a hand-written dict came back as a plain dict.
    with pytest.raises(
        CheckpointError,
        match=rf"config_from_dict\(data=\.\.\.\): expected what config_to_dict "
        rf"returns, a dict with the config's '_type'; {seen}",
    ):
        config_from_dict(data)


@pytest.mark.parametrize(
    "thing, name",
    [(int, "int"), (lambda: 0, "<function>"), (eqx_ppo.TrainConfig(), "<TrainConfig>")],
    ids=["int", "function", "instance"],
)
def test_register_config_takes_a_dataclass_or_flag_class(unchecked, thing, name):
    with pytest.raises(
        TypeError,
        match=rf"register_config\({re.escape(name)}\): expected a dataclass or an "
        r"enum\.Flag class\.",
    ):
        register_config(thing)
