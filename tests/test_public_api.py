"""The public names of `einjit` are listed once, in `einjit/__init__.py` (`_PUBLIC` and the
public functions of `einjit.tensor.operation`); the `TYPE_CHECKING` block that spells them out
for type checkers is held to that list here, name by name and source by source."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import einjit

INIT = Path(einjit.__file__)


def type_checking_names() -> dict[str, tuple[str, str | None]]:
    """API name -> (module, attribute or None for a module) of the `if TYPE_CHECKING:` block."""
    tree = ast.parse(INIT.read_text())
    [block] = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    names: dict[str, tuple[str, str | None]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.unparse(node)
        for a in node.names:
            full = f"{node.module}.{a.name}"
            is_module = (INIT.parent.parent / (full.replace(".", "/") + ".py")).is_file() or \
                (INIT.parent.parent / full.replace(".", "/") / "__init__.py").is_file()
            names[a.asname or a.name] = (full, None) if is_module else (node.module, a.name)
    return names


def test_type_checking_block_matches_the_public_list():
    assert type_checking_names() == einjit._public()


def test_public_list_serves_every_name():
    assert einjit.__all__ == sorted(einjit._public())
    for name in ("train", "fit", "data", "datasets", "checkpoint", "save", "load", "Tensor", "relu", "range"):
        assert name in einjit.__all__ and getattr(einjit, name) is not None, name
    from einjit.training import train
    assert einjit.train is train


def test_moved_modules_import_by_their_old_names():
    """`import einjit.train` (and `fit`, `data`, `checkpoint`, `datasets`) keeps working after
    the modules moved into `training/` and `demos/`: in a fresh interpreter, whichever spelling
    comes first, each name is the moved module itself."""
    script = textwrap.dedent("""
        import einjit.train, einjit.fit, einjit.data, einjit.checkpoint, einjit.datasets
        from einjit import train
        from einjit.demos import datasets
        from einjit.training import checkpoint, data, fit
        import einjit.training.train
        assert einjit.train is train is einjit.training.train and einjit.datasets is datasets
        assert (einjit.fit, einjit.data, einjit.checkpoint) == (fit, data, checkpoint)
        assert callable(einjit.train.forward_once)
    """)
    env = {**os.environ, "PYTHONPATH": str(INIT.parent.parent)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
