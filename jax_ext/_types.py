"""Types used in the public signatures."""
from __future__ import annotations

from typing import Literal

# select's broadcasting modes (OpenVINO Select-1's auto_broadcast).
AutoBroadcast = Literal["numpy", "none"]
