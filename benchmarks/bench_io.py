"""What every benchmark script shares: `--report JSON` (print its Markdown tables again) and writing the JSON."""

from __future__ import annotations

import json
import os
from typing import Any, Callable


def add_report_option(parser) -> None:
    parser.add_argument("--report", default=None, help="print the Markdown table of an existing JSON and exit")


def print_report(path: str | None, markdown: Callable[[dict], str]) -> bool:
    """Print `markdown(json at path)` and return True when `--report` was given, else return False."""
    if not path:
        return False
    with open(path, encoding="utf-8") as handle:
        print(markdown(json.load(handle)))
    return True


def write_json(path: str, result: Any) -> None:
    """Write `result` as indented JSON, creating the folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)


def save_figure(fig, path: str) -> None:
    """Lay out `fig` (a matplotlib Figure), save it as `path` at 110 dpi and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
