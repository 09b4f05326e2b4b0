"""`anybit bench`: recipes of layer shapes and schemes, timed on every backend and peer in one run."""

from anybit.bench.models import shapes_from_config
from anybit.bench.recipe import Recipe, Shape, load_recipe

__all__ = ["Recipe", "Shape", "load_recipe", "shapes_from_config"]
