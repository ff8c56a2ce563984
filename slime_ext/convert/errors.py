"""The one error type of the converters: every bad input (unknown architecture, missing file or
tensor, shape or dtype mismatch) ends as a ConvertError whose message names what was wrong."""

from __future__ import annotations

__all__ = ["ConvertError"]


class ConvertError(ValueError):
    """A checkpoint or configuration the converters cannot handle, with the reason."""
