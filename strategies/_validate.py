"""Argument validation in Hypothesis's style: bad arguments raise
``InvalidArgument`` naming the argument, eagerly, when the strategy is built."""

from __future__ import annotations

from typing import Any

from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy


def check_int(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be an integer")
    if value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name}={value!r} must be at most {maximum}")
    return value


def check_strategy(name: str, value: Any) -> SearchStrategy:
    if not isinstance(value, SearchStrategy):
        raise InvalidArgument(
            f"{name}={value!r} must be a SearchStrategy (wrap a fixed value in st.just(...))")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be True or False")
    return value


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidArgument(f"{name}={value!r} must be one of {', '.join(map(repr, choices))}")
    return value
