"""Load cache-dit's built-in planners before this plugin registers its own.

cache-dit loads its built-in planners only while a registry is still empty; a plugin that registered
first would hide them. Imported first by the package's `__init__`.
"""

from cache_dit.distributed.transformers.planners import (
    _activate_cp_planners,
    _activate_tp_planners,
)

_activate_cp_planners()
_activate_tp_planners()
