"""`python -m einjit demo moons|digits [...]`: the command-line entry point.

Demos are rows of `DEMOS`: each adds its own arguments, checks them before anything trains
(so a bad `--plot` path fails in a second, not after training), and runs. Every error names
the flag it is about and exits with argparse's usage error (status 2).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from dataclasses import dataclass
from typing import Callable

from einjit.demos.cli import MOONS_POINTS, ArgumentProblem, at_least, check_batch_size, check_plot_path


@dataclass(frozen=True)
class Demo:
    """One `einjit demo NAME` subcommand."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    check: Callable[[argparse.Namespace], None]
    run: Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------- moons


def _moons_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=80, help="training epochs")
    p.add_argument("--batch-size", type=int, default=10,
                   help=f"points per batch; it must divide the {MOONS_POINTS} points (per device)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data set and of the initial parameters")
    p.add_argument("--plot", metavar="FILE.png", help="write the decision boundary and loss curve (needs einjit[plot])")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results")
    p.add_argument("--devices", type=int, default=1, metavar="N",
                   help="train data-parallel on N multicore devices, one batch each per step")
    p.add_argument("--mpi", action="store_true",
                   help="train data-parallel across MPI ranks (run under mpiexec -n N; needs einjit[mpi])")


def _moons_check(args: argparse.Namespace) -> None:
    at_least("--epochs", args.epochs, 1)
    at_least("--batch-size", args.batch_size, 1)
    at_least("--devices", args.devices, 1)
    at_least("--seed", args.seed, 0)
    if args.mpi and args.devices > 1:
        raise ArgumentProblem("--mpi and --devices are exclusive: one device per MPI rank")
    if not args.mpi:
        check_batch_size(args.batch_size, args.devices, MOONS_POINTS)
    check_plot_path(args.plot)


def _moons_run(args: argparse.Namespace) -> int:
    from einjit.demos.moons import main_moons
    return main_moons(args)


# ---------------------------------------------------------------- digits


def _digits_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=25, help="training epochs")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffles, dropout and initial parameters")
    p.add_argument("--plot", metavar="FILE.png",
                   help="write the loss curves and the test confusion matrix (needs einjit[plot])")
    p.add_argument("--json", action="store_true", help="print one JSON object with the results")


def _digits_check(args: argparse.Namespace) -> None:
    at_least("--epochs", args.epochs, 1)
    at_least("--batch-size", args.batch_size, 1)
    at_least("--seed", args.seed, 0)
    check_plot_path(args.plot)


def _digits_run(args: argparse.Namespace) -> int:
    from einjit.demos.digits import main_digits
    return main_digits(args)


DEMOS: dict[str, Demo] = {
    "moons": Demo("train the half-moons MLP (one C routine per step)", _moons_arguments, _moons_check, _moons_run),
    "digits": Demo("train a small convnet on scikit-learn's 8x8 digits (needs einjit[datasets])", _digits_arguments,
                   _digits_check, _digits_run),
}
"""The demos of `einjit demo`; add a row to add one."""


def _version() -> str:
    try:
        return importlib.metadata.version("einjit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="einjit", description="einjit: a compiled deep-learning framework",
                                     formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"einjit {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a demo", formatter_class=fmt)
    demos = demo.add_subparsers(dest="demo", required=True, metavar="{" + ",".join(DEMOS) + "}")
    parsers = {}
    for name, spec in DEMOS.items():
        parsers[name] = demos.add_parser(name, help=spec.help, description=spec.help, formatter_class=fmt)
        spec.add_arguments(parsers[name])
    args = parser.parse_args(argv)
    spec, own = DEMOS[args.demo], parsers[args.demo]
    try:
        spec.check(args)
        return spec.run(args)
    except ArgumentProblem as e:
        own.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
