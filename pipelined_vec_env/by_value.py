"""`ByValue`: an object carried through plain pickle by cloudpickle, unpickled as itself."""

from __future__ import annotations

from typing import Any

import cloudpickle

__all__ = ["ByValue"]


class ByValue:
    """Carries ``obj`` through a plain-pickle pipe cloudpickled on its own: lambdas,
    closures and classes of modules the receiver need not import travel by value, and
    unpickling yields a fresh ``obj`` that shares nothing with the other objects of the
    same message (two env constructors that hold one space get a space each).

    Args:
        obj: Anything cloudpickle can pickle.
    """

    def __init__(self, obj: Any) -> None:
        self.data = cloudpickle.dumps(obj)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return cloudpickle.loads, (self.data,)
