"""`python -m einjit demo moons|digits [...]`: the command-line entry point."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="einjit", description="einjit: a compiled deep-learning framework")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a demo")
    demos = demo.add_subparsers(dest="demo", required=True)
    moons = demos.add_parser("moons", help="train the half-moons MLP (one C routine per step)")
    moons.add_argument("--epochs", type=int, default=80)
    moons.add_argument("--batch-size", type=int, default=10)
    moons.add_argument("--seed", type=int, default=0)
    moons.add_argument("--plot", metavar="FILE.png", help="write the decision boundary and loss curve")
    moons.add_argument("--json", action="store_true", help="print one JSON object with the results")
    moons.add_argument("--devices", type=int, default=1, metavar="N",
                       help="train data-parallel on N multicore devices, one batch each per step")
    moons.add_argument("--mpi", action="store_true",
                       help="train data-parallel across MPI ranks (run under mpiexec -n N; needs einjit[mpi])")
    digits = demos.add_parser("digits", help="train a small convnet on scikit-learn's 8x8 digits (needs einjit[datasets])")
    digits.add_argument("--epochs", type=int, default=15)
    digits.add_argument("--batch-size", type=int, default=32)
    digits.add_argument("--seed", type=int, default=0)
    digits.add_argument("--plot", metavar="FILE.png", help="write the loss curves and the test confusion matrix")
    digits.add_argument("--json", action="store_true", help="print one JSON object with the results")
    args = parser.parse_args(argv)
    if args.demo == "digits":
        if args.epochs < 1 or args.batch_size < 1:
            parser.error("--epochs and --batch-size must be at least 1")
        from einjit.demo_digits import main_digits
        return main_digits(args)
    if args.devices < 1 or args.epochs < 1 or args.batch_size < 1:
        parser.error("--devices, --epochs and --batch-size must be at least 1")
    from einjit.demo import main_moons
    try:
        return main_moons(args)
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
