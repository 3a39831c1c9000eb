"""The primitives. Each op's module registers its rules on its own; they live here, below
those modules, because the rules bind one another: gather's transpose is the scatter-add,
and the scatter-add's transpose is gather."""
from __future__ import annotations

from . import _compat, _names

select_p = _compat.Primitive(_names.SELECT.primitive)
gather_p = _compat.Primitive(_names.GATHER.primitive)
scatter_add_p = _compat.Primitive(_names.SCATTER_ADD.primitive)
update_rows_p = _compat.Primitive(_names.UPDATE_ROWS.primitive)
update_rows_p.multiple_results = True  # the table, then each leaf of its state
