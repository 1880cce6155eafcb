"""File access as sluice expressions (C++ sluice::io)."""

from ._sluice import io as _io

read_file = _io.read_file

__all__ = ["read_file"]
