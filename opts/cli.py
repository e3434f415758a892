"""Command-line pieces every CLI of the project shares (`opts`, `ablations.workload`, the vLLM backend)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn


def int_at_least(low: int, valid: str | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`; the error names the text and `valid` (default "an integer >= low")."""
    valid = valid or f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not {valid}")
        return value

    return parse


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, `error: ... (see PROG --help)`, with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
