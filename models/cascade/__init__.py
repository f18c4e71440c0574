"""The embedded default voice: a full-duplex cascade of offline speech components.

`load_cascade(opt)` is what `--model cascade[:opt]` resolves to (models.registry); `opt` is a preset
name and/or `key=value` pairs (see options.py for every option and its default).
"""

from models.cascade.model import CascadeModel
from models.cascade.options import PRESETS, CascadeOptions, parse_options
from models.cascade.session import CascadeState

__all__ = ["PRESETS", "CascadeModel", "CascadeOptions", "CascadeState", "load_cascade", "parse_options"]


def load_cascade(opt: str = "") -> CascadeModel:
    return CascadeModel(parse_options(opt))
