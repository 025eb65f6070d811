"""The `faultline` command line: one subcommand per job.

In: argv. Out: the chosen subcommand's exit status.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from ..broker import main as broker_main
from ..models.spec import WORKLOADS as WORKLOAD_TRAITS
from ..nemesis import catalog as nemesis_catalog

DESCRIPTION = """\
faultline: a Jepsen-style correctness checker for Kafka-style brokers, with
its own Kafka-wire-compatible reference broker under test.

  faultline run       run a test: nodes, brokers, workload, faults, then a verdict
  faultline check     check stored histories again (no cluster needed)
  faultline repro     rerun a stored test from its test.json (same seed, same schedule)
  faultline cleanup   remove what an interrupted or killed run left behind
  faultline image     build the Docker backend's node image (docker/docker-compose.yml uses it)
  faultline broker    run one reference broker in the foreground
"""

RUN_EPILOG = """\
examples:
  faultline run                                  # 30 s, 1 node, acks=all, idempotent
  faultline run --time-limit 20 --rate 200 --seed 42
  faultline run --producer acks=0 --producer enable.idempotence=false --nemesis kill --nemesis-interval 5
  faultline run --config my-test.toml            # the same names as the flags, e.g. rate = 50
  faultline run --nodes 3 --nemesis kill-leader,partition --broker-set min.insync.replicas=2
  faultline run --db kafka --nodes 3 --nemesis partition,kill,pause --broker-set min.insync.replicas=2
  faultline run --backend docker --nodes 3 --nemesis partition,kill,pause  # a container per node
  faultline run --db kafka --kafka-version 3.9.1 --kafka-mode zookeeper --nodes 3 --nemesis kill-controller

The run's files go to store/<name>/<timestamp>/ (store/latest points at the
newest): test.json, history.jsonl, results.json, nodes/<node>/broker.log.
The exit status is the verdict's: 0 valid, 1 invalid, 2 unknown.
"""

CHECK_EPILOG = """\
examples:
  faultline check store/latest
  faultline check store/queue/*/ --model at-least-once
  faultline check path/to/history.jsonl
  faultline check path/to/history.jsonl --engine python
  faultline check store/latest --explain-model   # which anomalies the run's model forbids, and why

Writes results.json beside each history. Exit status: 0 when every history is
valid, 1 when any is invalid, 2 when any is unknown or could not be read.

Spark reads a history's side-car (history.jsonl.operations/, written by the
harness as it recorded; by a check, for a history of 64 MB or more) instead of
its JSON while the side-car matches the file byte for byte; FAULTLINE_SIDECAR=0
reads the JSON always. See docs/history-format.md.
"""


def _spec_from_args(args: argparse.Namespace):
    from ..models.spec import SpecError, load_toml, parse_settings, spec_from_fields

    fields = load_toml(args.config) if args.config else {}
    if args.workload is not None:
        fields["workload"] = args.workload
    for name, given, flag in (("producer", args.producer, "--producer"), ("consumer", args.consumer, "--consumer"),
                              ("broker_settings", args.broker_set, "--broker-set")):
        fields[name] = {**(fields.get(name) or {}), **parse_settings(given, flag)}
    for name in ("name", "nodes", "zookeeper_nodes", "time_limit", "final_time_limit", "rate", "concurrency", "seed", "topics",
                 "partitions", "replication_factor", "nemesis_interval", "store", "spark_master", "engine",
                 "model", "backend"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    if args.nemesis is not None:
        fields["nemesis"] = [n for n in args.nemesis.split(",") if n]
    offsets = {k: v for k, v in fields.pop("clock_offsets", {}).items()}
    for node, seconds in parse_settings(args.clock_offset, "--clock-offset").items():
        try:
            offsets[node] = int(seconds)
        except ValueError:
            raise SpecError(f"--clock-offset {node}={seconds}: give whole seconds, for example "
                            f"--clock-offset {node}=-30") from None
    if offsets:
        fields["clock_offsets"] = offsets
    _kafka_fields(args, fields)
    return spec_from_fields(fields)


def _kafka_fields(args: argparse.Namespace, fields: dict) -> None:
    """--db and the Apache Kafka flags into spec fields (flags over the TOML file's)."""
    from ..models.spec import parse_settings

    if args.db is not None:
        fields["broker"] = args.db
    for name in ("kafka_version", "kafka_mode", "kafka_controllers"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    features = {k: str(v) for k, v in fields.pop("kafka_features", {}).items()}
    features.update(parse_settings(args.kafka_feature, "--kafka-feature"))
    if features:
        fields["kafka_features"] = features


def cmd_run(args: argparse.Namespace) -> int:
    from ..models.spec import SpecError
    from . import testmap
    from .run import run_test

    try:
        spec = _spec_from_args(args)
        testmap.validate(spec)
    except (SpecError, TypeError) as exc:
        print(f"faultline run: {exc}", file=sys.stderr)
        return 2
    if spec.backend == "local" and os.geteuid() != 0:
        print("faultline run: the local backend makes a network namespace per node, which needs root; "
              "run it as root (for example with sudo)", file=sys.stderr)
        return 2
    status, _ = run_test(spec, show_progress=not args.no_progress, report=not args.no_report, junit=args.junit,
                         server=not args.no_server)
    return status


def cmd_repro(args: argparse.Namespace) -> int:
    import dataclasses

    from ..models.spec import SpecError, load_stored
    from . import testmap
    from .run import run_test

    try:
        spec = load_stored(args.store_dir)
        testmap.validate(spec)
    except (SpecError, TypeError, ValueError) as exc:
        print(f"faultline repro: {exc}", file=sys.stderr)
        return 2
    if args.store:
        spec = dataclasses.replace(spec, store=args.store)
    if spec.backend == "local" and os.geteuid() != 0:
        print("faultline repro: the local backend needs root (a network namespace per node); run it as root",
              file=sys.stderr)
        return 2
    print(f"faultline repro: rerunning {args.store_dir} (seed {spec.seed}): same workload and fault schedule, "
          f"timing aside")
    status, _ = run_test(spec, show_progress=not args.no_progress)
    return status


def cmd_explain_model(args: argparse.Namespace) -> int:
    from ..checker.check import locate, model_for
    from ..history_analysis.reference import operations
    from ..models.guarantees import for_history
    from ..models.history import read_history

    status = 0
    for path in args.paths:
        directory, history = locate(path)
        try:
            model, note = model_for(directory, args.model)
            if history.exists():
                # What the history shows (subscribers, operations that both send and poll) refines
                # the model exactly as the check does.
                read = read_history(history)
                model = for_history(model, operations(read.ops, read.lines)[1])
        except ValueError as exc:
            print(f"faultline check --explain-model {path}: {exc}", file=sys.stderr)
            status = 2
            continue
        print(f"{path}:")
        if note:
            print(f"note: {note}")
        print(model.explain())
    return status


def cmd_check(args: argparse.Namespace) -> int:
    from ..checker.junit import write_junit
    from ..checker.verdict import summary
    from .checking import check_with_progress

    if args.explain_model:
        return cmd_explain_model(args)

    checked = check_with_progress(args.paths, args.spark_master, args.model, not args.no_progress, args.engine,
                                  not args.no_report, server=not args.no_server)
    for c in checked:
        print(summary(c.results, str(c.directory)))
    if args.junit:
        print(f"JUnit XML: {write_junit(args.junit, [(str(c.directory), c.results) for c in checked])}")
    statuses = {c.status for c in checked}
    return 2 if 2 in statuses else 1 if 1 in statuses else 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import make_server

    try:
        server = make_server(args.store, args.host, args.port)
    except (FileNotFoundError, OSError) as exc:
        print(f"faultline serve: {exc}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"faultline serve: the runs of {args.store} at http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    from ..models.claims import ClaimError, load_claims
    from ..models.spec import SpecError
    from .claims import (QUICK_SEEDS, default_parallel, exit_status, markdown, read_asked, run_claims, system_names,
                         write_asked, write_outputs)

    if os.geteuid() != 0:
        print("faultline claims: the runs make a network namespace per node, which needs root; run it as root",
              file=sys.stderr)
        return 2
    if args.resume:
        given = [flag for flag, value in (("--db", args.db), ("--kafka-version", args.kafka_version),
                                          ("--seeds", args.seeds), ("--only", args.only),
                                          ("--quick", args.quick or None)) if value is not None]
        if given:
            print(f"faultline claims: --resume runs what {args.resume} was asked; {' and '.join(given)} cannot "
                  f"change it. Drop {' and '.join(given)}, or start a new claims run without --resume",
                  file=sys.stderr)
            return 2
        out = Path(args.resume)
        try:
            asked = read_asked(out)
        except ValueError as exc:
            print(f"faultline claims: {exc}", file=sys.stderr)
            return 2
    else:
        out = Path(args.store) / "claims" / time.strftime("%Y%m%dT%H%M%S")
        asked = {"db": args.db or "reference", "kafka_versions": args.kafka_version or ["4.3.1"],
                 "seeds": args.seeds if args.seeds is not None else QUICK_SEEDS if args.quick else 20,
                 "quick": args.quick, "only": args.only}
    try:
        claims = load_claims(only=asked["only"])
    except (ClaimError, SpecError) as exc:
        print(f"faultline claims: {exc}", file=sys.stderr)
        return 2
    seeds = asked["seeds"]
    parallel = args.parallel if args.parallel is not None else default_parallel()
    if seeds < 1 or parallel < 1:
        print(f"faultline claims: --seeds and --parallel must be 1 or more, not {min(seeds, parallel)}",
              file=sys.stderr)
        return 2
    systems = system_names(asked["db"], asked["kafka_versions"])
    if not args.resume:
        write_asked(out, asked)
    print(f"faultline claims: {len(claims)} claim(s) on {', '.join(s if v is None else f'kafka {v}' for s, v in systems)}, "
          f"{seeds} seed(s) each{' (quick)' if asked['quick'] else ''}, {parallel} run(s) at once; results in {out}",
          flush=True)
    rows = run_claims(claims, systems, seeds, asked["quick"], out, say=lambda text: print(text, flush=True),
                      parallel=parallel, resume=bool(args.resume))
    write_outputs(rows, seeds, out)
    print(markdown(rows, seeds))
    print(f"tables: {out / 'claims.md'}, {out / 'claims.html'}")
    if any(r.interrupted for r in rows):
        print(f"resume with: faultline claims --resume {out}")
    return exit_status(rows)


def cmd_cleanup(args: argparse.Namespace) -> int:
    from ..control.cleanup import cleanup
    from . import check_server

    found = cleanup(dry_run=args.dry_run, include_live=args.include_live)
    print(found.describe())
    # A run's own check server ends with its harness; one killed while it started leaves its
    # socket folder.
    for folder in check_server.RunServer.stale_folders():
        print(f"{'would remove' if args.dry_run else 'removed'} the socket folder of a run's check server "
              f"that no longer runs: {folder}")
        if not args.dry_run:
            shutil.rmtree(folder, ignore_errors=True)
    server = check_server.ask({"op": "status"})
    if server is not None:
        if args.include_live and not args.dry_run:
            check_server.stop()
        else:
            print(f"a check server runs (pid {server['pid']}, {check_server.socket_path()}): "
                  f"{'cleanup --include-live would stop it' if args.include_live else 'left alone'}; "
                  "it stops by itself when idle, or with `faultline check-server stop`")
    return 1 if found.errors else 0


def cmd_check_server(args: argparse.Namespace) -> int:
    from . import check_server

    if args.action == "start":
        if args.idle_timeout <= 0:
            print("faultline check-server: --idle-timeout must be above 0 seconds", file=sys.stderr)
            return 2
        if args.foreground:
            return check_server.serve_foreground(args.spark_master, args.idle_timeout, not args.no_warm_up,
                                                 args.background)
        return check_server.start(args.spark_master, args.idle_timeout, not args.no_warm_up)
    return {"stop": check_server.stop, "status": check_server.status}[args.action]()


def cmd_image(args: argparse.Namespace) -> int:
    from ..control.docker_cluster import DockerUnavailable, connect
    from ..control.docker_image import ImageError, ensure_image

    try:
        print(ensure_image(connect()))
    except (DockerUnavailable, ImageError) as exc:
        print(f"faultline image: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run a test end to end and print its verdict",
                         description="Bring up nodes (network namespaces on this machine, or containers with "
                                     "--backend docker), start a broker on "
                                     "each, drive them with Kafka clients while the nemesis injects faults, "
                                     "record the history, and check it.",
                         epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", metavar="FILE", help="a TOML file of spec fields (flags override it)")
    run.add_argument("--workload", choices=sorted(WORKLOAD_TRAITS),
                     help="what the clients do (default queue): " + "; ".join(
                         f"{k}: {v.summary}" for k, v in WORKLOAD_TRAITS.items()))
    run.add_argument("--name", help="test name, the store subfolder (default: the workload's name)")
    run.add_argument("--db", metavar="NAME", help="the system under test: reference (default: faultline's own "
                     "broker) or kafka (Apache Kafka from its own jars, resolved once per version from Maven "
                     "Central into ~/.cache/faultline/kafka/)")
    run.add_argument("--backend", choices=("local", "docker"),
                     help="where nodes run: local (default), a network namespace per node on this machine; or "
                          "docker, a container per node on the Docker daemon DOCKER_HOST names (else the default "
                          "socket), from an image faultline builds offline on first use (docker/README.md)")
    run.add_argument("--nodes", type=int, help="broker nodes (default 1: one standalone broker; with more, "
                     "the brokers form a replicated cluster through ZooKeeper, or with --db kafka through "
                     "KRaft)")
    run.add_argument("--zookeeper-nodes", type=int, metavar="N",
                     help="ZooKeeper servers, each on its own node (default 1 when --nodes > 1, else 0); "
                     "3 or 5 form an ensemble")
    kafka = run.add_argument_group("Apache Kafka (--db kafka)")
    kafka.add_argument("--kafka-version", metavar="VERSION",
                       help="Kafka version as Maven Central serves org.apache.kafka:kafka_2.13 (default 4.3.1; "
                            "tested 4.3.1 and 3.9.1); resolved on first use with mvn, then cached")
    kafka.add_argument("--kafka-mode", choices=("kraft", "zookeeper"),
                       help="kraft (default): the metadata in Kafka's own controller quorum; zookeeper (Kafka "
                            "3.x only): the brokers on the run's ZooKeeper (--zookeeper-nodes, default 1)")
    kafka.add_argument("--kafka-controllers", type=int, metavar="N",
                       help="KRaft: N controller-only nodes c1..cN (default 0: the first 3 brokers, or 1 when "
                            "fewer than 3, are combined controller+broker nodes)")
    kafka.add_argument("--kafka-feature", action="append", default=[], metavar="NAME=LEVEL",
                       help="KRaft: a feature level given to Kafka's storage tool at format time, e.g. "
                            "eligible.leader.replicas.version=0 or transaction.version=1 (repeatable; "
                            "recorded in test.json)")
    run.add_argument("--time-limit", type=float, metavar="S", help="seconds of the main phase (default 30)")
    run.add_argument("--final-time-limit", type=float, metavar="S",
                     help="seconds the final reads may take (default 30)")
    run.add_argument("--rate", type=float, help="client operations per second, all workers together (default 100)")
    run.add_argument("--concurrency", type=int, help="client workers (default 4)")
    run.add_argument("--seed", type=int, help="seed of the workload and fault schedule (default: drawn, recorded)")
    run.add_argument("--topics", type=int, help="topics (default 1)")
    run.add_argument("--partitions", type=int, help="partitions per topic; each is a key (default 3)")
    run.add_argument("--replication-factor", type=int, help="replicas per partition (default min(3, nodes))")
    run.add_argument("--producer", action="append", default=[], metavar="KEY=VALUE",
                     help="librdkafka producer setting, e.g. acks=1 (repeatable)")
    run.add_argument("--consumer", action="append", default=[], metavar="KEY=VALUE",
                     help="librdkafka consumer setting, e.g. isolation.level=read_committed (repeatable)")
    run.add_argument("--broker-set", action="append", default=[], metavar="KEY=VALUE",
                     help="broker setting, e.g. log.flush.interval.messages=1 (repeatable); with --db kafka "
                          "any Kafka server.properties setting, passed through unchanged")
    run.add_argument("--nemesis", metavar="KINDS", help="comma-separated faults (default none): " + "; ".join(
                     f"{k}: {v}" for k, v in nemesis_catalog.KINDS.items()))
    run.add_argument("--nemesis-interval", type=float, metavar="S", help="mean seconds between faults (default 10)")
    run.add_argument("--clock-offset", action="append", default=[], metavar="NODE=SECONDS",
                     help="start the broker on NODE with its wall clock SECONDS off (libfaketime), e.g. "
                          "n2=-30; the clock nemeses return it there when they heal (repeatable)")
    run.add_argument("--store", metavar="DIR", help="store folder (default ./store)")
    run.add_argument("--spark-master", metavar="URL", help="Spark master for the check (default local[2])")
    run.add_argument("--engine", choices=("spark", "python"),
                     help="the check's engine: spark (default) or python, the same analysis with no JVM to start "
                          "(the whole history in memory: for short runs)")
    run.add_argument("--model", help="guarantee model to judge by (default: from the producer, consumer and broker "
                     "settings and the nemesis; see faultline check --explain-model)")
    run.add_argument("--no-progress", action="store_true", help="no progress line")
    run.add_argument("--no-report", action="store_true", help="do not write report.html in the store folder")
    run.add_argument("--no-server", action="store_true",
                     help="check in a JVM started after the run, in this process: by default a Spark check goes "
                          "to the check server when one runs (faultline check-server), else to one of the run's "
                          "own, started before the nodes and warming up beside the run at the lowest CPU priority "
                          "(a default run's check: about 10 s instead of 17-29)")
    run.add_argument("--junit", metavar="FILE", help="also write the verdict as JUnit XML to FILE, for CI (one "
                     "test case: passing if valid, a failure naming the forbidden anomalies if invalid, an error "
                     "if unknown)")
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check", help="check stored histories and write results.json",
                           description="Analyse one or more histories with PySpark, in one Spark session "
                                       "(histories under 64 MB together, in one analysis), and give each a verdict.",
                           epilog=CHECK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("paths", nargs="+", metavar="PATH", help="store folder(s) or history.jsonl file(s)")
    check.add_argument("--model", help="judge by this model instead of the run's own "
                                       "(exactly-once, at-least-once, at-most-once, best-effort; add a promise "
                                       "with +, e.g. exactly-once+write-isolation)")
    check.add_argument("--explain-model", action="store_true",
                       help="check nothing: print the model each PATH is judged by (its test.json, or --model), "
                            "its promises and the settings they come from, and every anomaly type, forbidden "
                            "or allowed, and why")
    check.add_argument("--spark-master", default="local[2]", metavar="URL",
                       help="Spark master (default local[2]; e.g. spark://host:7077)")
    check.add_argument("--engine", choices=("spark", "python"), default="spark",
                       help="spark (default): PySpark, for histories of any size; python: the same "
                            "analysis in plain Python, in memory, quicker to start on small histories")
    check.add_argument("--no-progress", action="store_true", help="no progress line")
    check.add_argument("--no-report", action="store_true",
                       help="do not write report.html beside each results.json")
    check.add_argument("--junit", metavar="FILE", help="also write the verdicts as JUnit XML to FILE, for CI (a "
                       "test case per PATH: passing if valid, a failure naming the forbidden anomalies if invalid, "
                       "an error if unknown)")
    check.add_argument("--no-server", action="store_true",
                       help="check in this process even when a check server runs (see faultline check-server)")
    check.set_defaults(func=cmd_check)

    server = sub.add_parser(
        "check-server", help="keep a warm Spark session that checks faster (start, stop, status)",
        description="A check server keeps one Spark session running, warmed up, for every `faultline check` and "
                    "`faultline run` on this machine (same user) while it runs. A check in a fresh process pays for "
                    "a cold JVM: most of a small history's check goes to Spark planning and compiling in it. With "
                    "a server, `faultline check` sends the paths to it, shows its progress and prints the same "
                    "verdicts; the server writes results.json and report.html as the check would. Without a server, "
                    "with another --spark-master, with `check --no-server`, or when the server goes away during a "
                    "check, the check runs in its own process as before.",
        epilog="examples:\n"
               "  faultline check-server start              # background; ready when this returns\n"
               "  faultline check store/latest              # now checked by the server\n"
               "  faultline check-server status\n"
               "  faultline check-server stop\n\n"
               "The socket is ~/.cache/faultline/check-server/socket (set FAULTLINE_CHECK_SERVER to a path to "
               "use another), its log beside it (socket.log). The server stops by itself after --idle-timeout "
               "seconds without a request; `faultline cleanup --include-live` stops it too.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    server.add_argument("action", choices=("start", "stop", "status"),
                        help="start: in the background, returning once it answers; stop; status: whether one "
                             "runs (exit 0) or not (exit 1), and what it has served")
    server.add_argument("--spark-master", default="local[2]", metavar="URL",
                        help="the server's Spark master (default local[2]); checks asking another run in "
                             "their own process")
    server.add_argument("--idle-timeout", type=float, default=900.0, metavar="SECONDS",
                        help="stop after this long without a request (default 900)")
    server.add_argument("--no-warm-up", action="store_true",
                        help="without the three warm-up checks of synthetic histories (the first checks then run "
                             "at a cold JVM's pace); with them, a check that comes meanwhile waits only for the "
                             "warm-up check under way, and ends the warm-up")
    server.add_argument("--foreground", action="store_true",
                        help="serve in this process (logging to the terminal) until stopped or idle")
    server.add_argument("--background", action="store_true",
                        help="with --foreground: run at the lowest CPU priority (nice 19, and its session's "
                             "scheduling group too), as `faultline run` runs its own server beside the cluster "
                             "under test, so the warm-up takes only CPU nothing else wants")
    server.set_defaults(func=cmd_check_server)

    repro = sub.add_parser("repro", help="rerun a stored test from its test.json",
                           description="Run a stored test again: the same spec, seed included, so the same "
                                       "workload and nemesis schedule (timing aside). The new run gets its own "
                                       "store folder beside the old one.",
                           epilog="example:\n  faultline repro store/queue/20261122T120459.770\n"
                                  "  faultline repro store/latest --store /tmp/again",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    repro.add_argument("store_dir", metavar="STORE_DIR", help="a run's store folder (it holds test.json)")
    repro.add_argument("--store", metavar="DIR", help="store the new run here instead (default: the old spec's)")
    repro.add_argument("--no-progress", action="store_true", help="no progress line")
    repro.set_defaults(func=cmd_repro)

    serve = sub.add_parser("serve", help="browse the store's runs and their reports in a web browser",
                           description="Serve the store over HTTP: an index of every run (newest first, with "
                                       "its verdict, anomaly types and seed; filter with ?verdict=invalid), "
                                       "each run's report.html and its files. Only files inside the store are "
                                       "served.",
                           epilog="example:\n  faultline serve\n  faultline serve --store /tmp/runs --port 9000\n"
                                  "then open http://127.0.0.1:8080/",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--store", default="store", metavar="DIR", help="the store folder (default ./store)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 shares the store "
                            "with the network)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.set_defaults(func=cmd_serve)

    claims = sub.add_parser("claims", help="run the documented claims about Kafka's reliability as experiments",
                            description="Each claim (models/claims/*.toml) is an experiment: an unsafe configuration "
                                        "expected to show an anomaly, a safe one expected not to, a fault schedule. "
                                        "Each configuration runs over N seeds on each system; the table says, per "
                                        "claim and system, CONFIRMED (reproduced and held), CONTRADICTED (the safe "
                                        "side showed the anomaly) or UNDECIDED, with the first witness run.",
                            epilog="examples:\n  faultline claims --quick\n"
                                   "  faultline claims --db both --kafka-version 3.9.1 --kafka-version 4.3.1\n"
                                   "  faultline claims --only acks-1-loses-on-leader-death --seeds 5\n"
                                   "  faultline claims --resume store/claims/20261127T031500\n\n"
                                   "Writes store/claims/<timestamp>/claims.md, claims.html and claims.json; every "
                                   "run is a normal store folder below it (runs/), with its output in logs/. "
                                   "Ctrl-C stops the runs under way (each cleans up and checks what it "
                                   "recorded) and tables what finished; --resume with that folder later runs "
                                   "the rest (a run cut short by the stop runs again) and tables them all.\n\nExit status: 1 when a claim is "
                                   "contradicted; 130 when interrupted; 0 otherwise.",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    claims.add_argument("--db", choices=("reference", "kafka", "both"),
                        help="the systems to run on (default reference: faultline's own broker)")
    claims.add_argument("--kafka-version", action="append", metavar="V",
                        help="Apache Kafka version(s) for --db kafka/both (repeat for several; default 4.3.1)")
    claims.add_argument("--seeds", type=int, metavar="N", help="seeds per configuration (default 20; 1 with --quick)")
    claims.add_argument("--only", action="append", metavar="NAME", help="run only this claim (repeatable)")
    claims.add_argument("--quick", action="store_true",
                        help="shorter runs (each claim's [quick] settings) and one seed: for CI")
    claims.add_argument("--parallel", type=int, metavar="N",
                        help="runs at once (default: one per 2 cores and 6 GiB of memory, so 1 on a 2-core "
                             "machine); each has its own cluster, but runs sharing cores change each other's timing")
    claims.add_argument("--store", default="store", metavar="DIR", help="the store folder (default ./store)")
    claims.add_argument("--resume", metavar="DIR",
                        help="go on with the claims run in DIR (store/claims/<timestamp>), stopped or killed "
                             "before it finished: its finished runs are kept, the rest run, and the tables cover "
                             "all of them; it runs what DIR was asked (no --db, --seeds, --only, --quick)")
    claims.set_defaults(func=cmd_claims)

    clean = sub.add_parser("cleanup", help="remove namespaces, links, mounts, containers and processes an earlier "
                                           "run left",
                           description="Find and remove what an interrupted or killed faultline run left on "
                                       "this machine: its network namespaces (and every process in them), "
                                       "veth links and bridges, its rule in the host's FORWARD chain, the mounts "
                                       "of its power-loss file system, and the containers and network of a "
                                       "Docker-backend run (label org.faultline.run; on each daemon a run "
                                       "registered, and on the one DOCKER_HOST names). Touches only faultline's "
                                       "own objects.")
    clean.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    clean.add_argument("--include-live", action="store_true",
                       help="also remove the objects of runs whose harness is still running")
    clean.set_defaults(func=cmd_cleanup)

    image = sub.add_parser("image", help="build the Docker backend's node image",
                           description="Build the node image `faultline run --backend docker` uses, on the Docker "
                                       "daemon DOCKER_HOST names (else the default socket), when it is not there "
                                       "yet: the offline Debian base first when absent (docker/build-base: "
                                       "mmdebstrap and `docker import`, no registry), then docker/Dockerfile "
                                       "with faultline's wheel built here. Prints the image's tag; the image "
                                       "is also tagged faultline-node:latest, which docker/docker-compose.yml "
                                       "starts a 3-broker cluster from.")
    image.set_defaults(func=cmd_image)

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
    if args.command in ("run", "check", "repro"):
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
