"""How a benchmark script prints its rows: as JSON (`--json`, for `run.py` and other tools),
or one line a row (`name=value`, floats to four significant digits) under a line saying the
thread count and which way the ratios point."""

from __future__ import annotations

import json


def print_rows(rows: list[dict], threads: int, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    print(f"threads: {threads}; ratio = peer time / einjit time, > 1: einjit faster")
    for r in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
