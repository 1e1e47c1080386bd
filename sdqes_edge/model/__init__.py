"""The torch model: image tower with streaming adapters, text tower, scoring."""

from .image_tower import ImageTower
from .sdqes_model import SDQESModel, probability, score
from .text_tower import TextTower

__all__ = ["ImageTower", "SDQESModel", "TextTower", "probability", "score"]
