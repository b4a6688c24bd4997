"""Population graphs: named populations joined by learned, possibly delayed, maps."""

from ._builder import PopulationGraphBuilder as PopulationGraphBuilder
from ._graph import PopulationGraph as PopulationGraph
