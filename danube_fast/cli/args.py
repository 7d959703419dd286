"""Argument types shared by the `danube-fast` commands: argparse reports their message as a usage error."""

from __future__ import annotations

import argparse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def count(text: str) -> int:
    """A whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def positive_int(text: str) -> int:
    """A whole number, 1 or more."""
    value = count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more, not 0")
    return value
