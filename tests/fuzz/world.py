"""A quiet simulated cluster and every function served against it, for the fuzz suite.

Quiet: the VMIs run, no migration failed, nothing is paused, no device is contested. So whatever an event
claims, no function has anything to write: any create, update, patch or delete in the API server's audit
log during a fuzzed request is a function that trusted a payload. (The events' own claims are forged:
a Succeeded VMI, a Failed migration, a VMI paused on IO errors, a VM asking for a taken device.)
"""
from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from functions_framework import create_app

from catalog import declarations
from functions.device_conflict import assignment, reads
from functions.device_conflict.index import Index
from functions.migration_report import cursor
from functions.migration_report.settings import Settings as MigrationSettings
from shared import runtime
from simcluster.alertmanager import Receiver
from simcluster.apiserver import SimCluster
from simcluster.builders import devices as dev
from simcluster.builders import kubevirt as kvb
from tests.http_cases import source_of

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
# function -> (package, ServiceAccount "ns/name" or None when it has no API access), from the declarations
FUNCTIONS = {f.name: (f.package, f"vmevents/{f.account}" if f.account else None) for f in declarations()}


class FuzzWorld:
    def __init__(self):
        self.cluster = SimCluster().start()
        self.receiver = Receiver().start()
        self.lines: list[bytes] = []
        self.clients = {}
        self._saved = {name: os.environ.get(name) for name in ("KUBECONFIG", "WEBHOOK_URL", "MIGRATION_SETTLE_EVERY")}
        try:
            self._seed()
            for function, (package, account) in FUNCTIONS.items():
                os.environ["KUBECONFIG"] = self.cluster.kubeconfig(service_account=account or "vmevents/none")
                os.environ["WEBHOOK_URL"] = f"{self.receiver.url}/hook"
                os.environ["MIGRATION_SETTLE_EVERY"] = "30m"  # no settle (it stamps its time) within a fuzz run
                self.clients[function] = create_app(target="handle", source=source_of(package)).test_client()
        except BaseException:
            self.stop()
            raise

    def _seed(self):
        vm = self.cluster.create(kvb.make_vm("vm1", run_strategy="Always"))
        self.cluster.create({**kvb.make_vmi("vm1", phase="Running", owner=vm), "status": {"phase": "Running"}})
        device = dev.host_device()
        seeded = [self.cluster.create(dev.vm("vm2", device)), self.cluster.create(dev.vmi("vm2", device))]
        # device-conflict's parameter object as its re-scan leaves it: what any event then reads agrees with it,
        # so a write of it, too, would be device-conflict acting on a payload's word. Stamped as just repaired and
        # with the platform the repair records (names are devices here), so a tick is a light one, which writes
        # nothing when nothing changed (a repair always writes its stamp).
        index = Index()
        for obj in [vm, *seeded]:
            (index.add_vm if obj["kind"] == "VirtualMachine" else index.add_vmi)(obj)
        self.cluster.create({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": assignment.NAME, "namespace": "vmevents", "annotations": {
                                 reads.REPAIRED_AT: datetime.now(UTC).isoformat(),
                                 reads.DEVICE_NAMES: reads.HARVESTER}},
                             "data": assignment.data_of(assignment.entries(index.workloads()))})
        # migration-report's cursor as its ticks leave it: at the newest version and settled just now, so a tick
        # watches, sees no change and writes nothing.
        namespace, name = MigrationSettings().cursor or ("", "")
        self.cluster.create({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": name, "namespace": namespace},
                             "data": {cursor.KEY: str(self.cluster.store.resource_version),
                                      cursor.SETTLED_AT: datetime.now(UTC).isoformat()}})

    def stop(self):
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.receiver.stop()
        self.cluster.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def send(self, function: str, headers: dict[str, str], body: bytes, fault: dict | None = None):
        """POST one request, with every API request of the function failing as `fault` says (Faults.add's
        arguments) if given; returns (the response, the log lines as dicts, the writes it made)."""
        account = FUNCTIONS[function][1]
        seen = len(self.cluster.requests)
        self.lines.clear()
        if fault and account:
            self.cluster.faults.add(service_account=account, times=None, **fault)
        # The log line, as the runtime encodes it, is taken only while this request is served: the world lives for
        # the session, and every later test's function must still write to its stdout.
        emit, runtime._emit = runtime._emit, self.lines.append
        try:
            response = self.clients[function].post("/", headers=headers, data=body)
        finally:
            runtime._emit = emit
            self.cluster.faults.clear()
        writes = [r for r in self.cluster.requests[seen:] if r.verb in WRITES and account
                  and r.service_account == account]
        lines = [json.loads(line) for line in self.lines]
        return response, lines, writes
