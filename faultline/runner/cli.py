"""The `faultline` command line: one subcommand per job.

In: argv. Out: the chosen subcommand's exit status.
"""

from __future__ import annotations

import argparse
import sys

from ..broker import main as broker_main

DESCRIPTION = """\
faultline: a Jepsen-style correctness checker for Kafka-style brokers, with
its own Kafka-wire-compatible reference broker under test.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    broker = sub.add_parser("broker", help="run one reference broker in the foreground",
                            description=broker_main.DESCRIPTION, epilog=broker_main.EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    broker_main.add_arguments(broker)
    broker.set_defaults(func=broker_main.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
