"""`faultline broker`: run one reference broker in the foreground.

In: command-line arguments. Out: a broker serving until SIGTERM/SIGINT, with
one log line per event on stderr; exit status 0 after a clean shutdown, 2 for
a bad setting.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from .config import ConfigError, describe_settings, load_config

DESCRIPTION = """\
Run one faultline reference broker in the foreground: a Kafka-wire-compatible
broker that real Kafka clients (librdkafka, kafka-python, aiokafka, Java) use
unchanged. It stores each partition as Kafka does (segments and offset
indexes under --data-dir), recovers a torn log tail on start, and stops
cleanly on SIGTERM or Ctrl-C (flushes, closes segments, writes its recovery
checkpoint). Settings use Kafka's names; see --list-settings.
"""

EPILOG = """\
examples:
  faultline broker --node-id 1 --listen 127.0.0.1:9092 --data-dir /tmp/b1
  faultline broker --node-id 1 --listen 127.0.0.1:9092 --data-dir /tmp/b1 \\
      --set log.flush.interval.messages=1 --set num.partitions=3
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", type=int, help="this broker's id (Kafka's broker.id), e.g. 1")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to serve on, e.g. 127.0.0.1:9092")
    parser.add_argument("--data-dir", metavar="DIR", help="where partition logs live (Kafka's log.dirs)")
    parser.add_argument("--config", metavar="FILE", help="a server.properties file with Kafka settings")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="a setting, overriding --config; repeat for several")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="least severe event logged (default INFO)")
    parser.add_argument("--list-settings", action="store_true",
                        help="print every setting this broker implements, with its default, and exit")


class _UTCFormatter(logging.Formatter):
    converter = time.gmtime

    def formatTime(self, record, datefmt=None):  # noqa: N802 (logging's name)
        return time.strftime("%Y-%m-%dT%H:%M:%S", self.converter(record.created)) + f".{int(record.msecs):03d}Z"


def setup_logging(level: str, node_id: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_UTCFormatter(f"%(asctime)s %(levelname)s broker-{node_id} %(name)s: %(message)s"))
    root = logging.getLogger("faultline.broker")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def run(args: argparse.Namespace) -> int:
    if args.list_settings:
        print(describe_settings())
        return 0
    missing = [flag for flag, value in (("--node-id", args.node_id), ("--listen", args.listen),
                                        ("--data-dir", args.data_dir)) if value is None]
    if missing:
        print(f"faultline broker: {', '.join(missing)} required; see faultline broker --help", file=sys.stderr)
        return 2
    try:
        config = load_config(args.node_id, args.listen, args.data_dir, args.config, args.set)
    except ConfigError as exc:
        print(f"faultline broker: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.node_id)
    from .server import run as serve

    try:
        return serve(config)
    except OSError as exc:
        logging.getLogger("faultline.broker").error("cannot serve on %s:%d: %s", config.host, config.port, exc)
        return 1
    except RuntimeError as exc:  # cannot join the cluster, e.g. ZooKeeper unreachable; the message says why
        logging.getLogger("faultline.broker").error("%s", exc)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="faultline broker", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    status = main()
    # End now: executor threads stuck in a ZooKeeper call would otherwise hold the interpreter's exit.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
