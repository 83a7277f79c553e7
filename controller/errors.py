"""Errors only the controller raises; the shared hierarchy is :mod:`contracts.errors`::

    contracts.errors.MoesloError
    └── ActuationError         an actuator failed after its retries (502)
"""

from __future__ import annotations

from contracts.errors import MoesloError


class ActuationError(MoesloError):
    """An actuator failed to carry out a decision after its retries."""
