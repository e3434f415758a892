"""Execute a notebook of notebooks/ in a fresh kernel (nbclient), its parameters from environment variables."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, env: dict[str, str], timeout_s: int = 240) -> nbformat.NotebookNode:
    """Run notebooks/`name` with `env` set in its kernel; a cell that raises is a CellExecutionError naming it."""
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = NotebookClient(book, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS.parent)}})
        client.execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return book


def text_of(book: nbformat.NotebookNode) -> str:
    """Everything the executed notebook printed."""
    return "\n".join(o.get("text", "") for c in book.cells if c.cell_type == "code" for o in c.get("outputs", []))


def plain(text: str) -> str:
    """`text` without the terminal colour codes of a kernel's traceback."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
