"""A test as a map of small parts (Jepsen's test map): db, workload, nemesis, generator, checker.

In: a `TestSpec`, the run's `Remote`s by node name (`create_nodes` makes them on the spec's
backend), a work directory and (for partitions) the nodes' `Net`. Out: a `Test` naming each part, built from the registries (`db.DBS`,
`workloads.WORKLOADS`, `nemesis.catalog`); the runner knows only these interfaces, so a new
system under test or workload is one new file and one registry line.

The generator of a test is data too: the workload's client ops and the nemesis's schedule for
`time_limit` seconds, then a heal, then the workload's final reads for `final_time_limit` (a
limit the final reads keep themselves, so that they record running out of time); after a heal
that did not succeed, the workload's `final_unhealed` instead (nothing is read from a broken
cluster as if it were healed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..db import DBS
from ..db.core import DB
from ..models.spec import SpecError, TestSpec
from ..nemesis import catalog
from ..nemesis.core import Heal, Schedule
from ..workloads import WORKLOADS
from ..workloads.core import Workload
from ..workloads.generator import Phases, TimeLimit, Unfold, any_, clients, nemesis


@dataclass
class Test:
    __test__ = False  # not a pytest test class
    spec: TestSpec
    db: DB
    workload: Workload
    nemeses: dict[str, Any]  # nemesis f -> the nemesis performing it
    generator: Any


def db_class(spec: TestSpec):
    try:
        return DBS[spec.broker]
    except KeyError:
        raise SpecError(f"broker {spec.broker!r} is unknown; choose one of {', '.join(DBS)}") from None


def node_names(spec: TestSpec) -> tuple[list[str], list[str]]:
    """(system-under-test nodes, support nodes) the spec's db runs on."""
    return db_class(spec).node_names(spec)


def create_nodes(spec: TestSpec, run_id: str, workdir: Path, say=print):
    """The spec's nodes on its backend (`local`: network namespaces, `docker`: containers): a
    cluster object with `remotes` by node name and `destroy()`."""
    nodes, support = node_names(spec)
    if spec.backend == "docker":
        from ..control.docker_cluster import DockerCluster

        read_only = []
        if spec.broker == "kafka":
            # Kafka runs from the jars faultline resolved on this machine; the containers read the cache.
            from ..db.kafka_jars import cache_root

            cache_root().mkdir(parents=True, exist_ok=True)
            read_only.append(cache_root())
        return DockerCluster.create(run_id, nodes + support, workdir, read_only=read_only, say=say)
    from ..control.local_cluster import LocalCluster

    return LocalCluster.create(run_id, nodes + support, workdir)


def workload_for(spec: TestSpec, clients_dir: Path | None = None) -> Workload:
    try:
        make = WORKLOADS[spec.workload]
    except KeyError:
        raise SpecError(f"workload {spec.workload!r} is unknown; choose one of {', '.join(WORKLOADS)}") from None
    return make(spec, clients_dir=clients_dir)


def validate(spec: TestSpec) -> None:
    """Raise SpecError unless every part the spec names is in its registry."""
    db_class(spec)
    if spec.workload not in WORKLOADS:
        raise SpecError(f"workload {spec.workload!r} is unknown; choose one of {', '.join(WORKLOADS)}")
    unknown = [k for k in spec.nemesis if k not in catalog.KINDS]
    if unknown:
        raise SpecError(f"nemesis {', '.join(unknown)} is unknown; choose from {', '.join(catalog.KINDS)}")


def heal_and_final(workload: Workload) -> tuple:
    """The phases after the faults: a heal, then the workload's final reads, or its `final_unhealed`
    when the heal did not succeed (None, no final phase, when it has none)."""

    def after_heal(heal):
        error = heal.gen.error
        if error is None:
            return clients(workload.final_generator)
        if workload.final_unhealed is None:
            return None
        return clients(workload.final_unhealed(f"the heal did not succeed: {error}"))

    return nemesis(Heal()), after_heal


def generator_of(spec: TestSpec, workload: Workload, schedule: Schedule | None):
    """Main phase (client ops, and faults when there is a schedule), heal, final reads. The final
    reads keep their own time limit (`final_time_limit`, given to the workload), so that running out
    of time is recorded, not cut off; after a heal that did not succeed they read nothing from the
    broken cluster (the workload's `final_unhealed`)."""
    if schedule is None:
        return Phases((clients(TimeLimit(spec.time_limit, workload.generator)), clients(workload.final_generator)),
                      names=("main", "final"))
    # One time limit over both, as in Jepsen: it starts with the first op either gives.
    main = TimeLimit(spec.time_limit, any_(clients(workload.generator), nemesis(Unfold(schedule.step, schedule.start))))
    return Phases((main, *heal_and_final(workload)), names=("main", "heal", "final"))


def build(spec: TestSpec, remotes: dict, workdir: Path, net=None) -> Test:
    db = db_class(spec)(spec, remotes, workdir)
    # Pid files of clients that run in processes of their own, for the nemeses that kill them.
    clients_dir = workdir / "clients"
    workload = workload_for(spec, clients_dir)
    nemeses, pairs = catalog.build(spec.nemesis, db, db.nodes, spec.keys, db.support_nodes, net, clients_dir)
    schedule = Schedule(spec.seed, pairs, spec.nemesis_interval) if pairs else None
    return Test(spec, db, workload, nemeses, generator_of(spec, workload, schedule))
