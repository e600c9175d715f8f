#!/usr/bin/python3
"""slurm_test.py — ranks started by SLURM's srun: a one-node SLURM cluster of
this machine (its own slurmctld, slurmd and munged, on ports and in a
directory of their own, stopped at the end), `toy` on 4 ranks
(tests/multihost_test.py's configuration), no rendezvous variable.

Scenarios, each into an output directory of its own:
  reference   world 1 (`ddp run CONFIG --set run.world_size=1`);
  gloo        `srun -n 4 ddp run CONFIG`: the ranks from SLURM's variables,
              meeting in a file store named by the job (all on one node);
  mpi         `srun --mpi=pmix -n 4 ddp run CONFIG` with the mpi transport;
  each writes weights equal to the reference's within 1e-6;
  mpi-no-pmi  `srun --mpi=none` with the mpi transport: every rank exits
              non-zero, naming itself and saying to use srun --mpi=pmix
              (Open MPI cannot start without a process-management interface).

Needs root (the daemons), slurmctld, slurmd, srun, munged (Debian: slurmctld
slurmd slurm-client munge) and the mpi and gloo plugins; skips (exit 77, one
line saying why) without them. About 20 s.

usage: tests/slurm_test.py --ddp build/bin/ddp
"""
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multihost_test as mh  # noqa: E402  (its configuration, weights check and scenario runner)

SKIP = 77
RUN_LIMIT_S = 60
PORTS = (16817, 16818)  # slurmctld, slurmd: not SLURM's defaults, so that a real one is left alone
NO_PMI = ("srun started this rank without PMIx (srun --mpi=none): start the ranks with srun --mpi=pmix "
          "(or set MpiDefault=pmix in slurm.conf) for the mpi transport")


def skip_reason(ddp):
    if os.geteuid() != 0:
        return "needs root (slurmd)"
    for tool in ("slurmctld", "slurmd", "srun", "sinfo", "munged"):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian: slurmctld slurmd slurm-client munge)"
    plugins = os.environ.get("DDP_PLUGIN_DIR", os.path.join(os.path.dirname(ddp), "..", "lib", "ddp"))
    for name in ("mpi", "gloo"):
        if not os.path.exists(os.path.join(plugins, f"libddp_transport_{name}.so")):
            return f"the {name} transport plugin is not built (no libddp_transport_{name}.so in {plugins})"
    return None


class Cluster:
    """slurmctld, slurmd and munged of a one-node cluster in `tmp`."""

    def __init__(self, tmp):
        self.tmp, self.procs = tmp, []
        self.node = socket.gethostname().split(".")[0]
        self.conf = os.path.join(tmp, "slurm.conf")
        self.socket = os.path.join(tmp, "munge.socket")
        self.env = mh.clean_env(SLURM_CONF=self.conf)

    def write_config(self):
        for d in ("state", "spool", "munge"):
            os.makedirs(os.path.join(self.tmp, d), exist_ok=True)
        key = os.path.join(self.tmp, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        os.chmod(os.path.join(self.tmp, "munge"), 0o700)
        t = self.tmp
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=ddptest
SlurmctldHost={self.node}
SlurmctldPort={PORTS[0]}
SlurmdPort={PORTS[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation={t}/state
SlurmdSpoolDir={t}/spool
SlurmctldPidFile={t}/slurmctld.pid
SlurmdPidFile={t}/slurmd.pid
SlurmctldLogFile={t}/slurmctld.log
SlurmdLogFile={t}/slurmd.log
NodeName={self.node} CPUs=8 State=UNKNOWN
PartitionName=ddp Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        return key

    def start(self):
        key = self.write_config()
        t = self.tmp
        r = subprocess.run(["munged", "--force", f"--socket={self.socket}", f"--key-file={key}",
                            f"--pid-file={t}/munge/munged.pid", f"--log-file={t}/munge/munged.log",
                            f"--seed-file={t}/munge/munged.seed"], capture_output=True, text=True)
        if r.returncode != 0:
            raise mh.Failure(f"munged exited {r.returncode}", r.stdout + r.stderr)
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            self.procs.append(subprocess.Popen([*daemon, "-f", self.conf], stdout=subprocess.DEVNULL,
                                               stderr=subprocess.STDOUT, env=self.env, start_new_session=True))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env)
            if r.returncode == 0 and r.stdout.strip() == "idle":
                return f"node {self.node} idle"
            time.sleep(0.5)
        raise mh.Failure("the SLURM node is not idle after 30 s", self.logs())

    def logs(self):
        text = ""
        for name in ("slurmctld.log", "slurmd.log", "munge/munged.log"):
            path = os.path.join(self.tmp, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text += f"--- {name}\n" + "".join(f.readlines()[-15:])
        return text

    def stop(self):
        for p in self.procs:
            mh.kill_group(p)
        pid_file = os.path.join(self.tmp, "munge", "munged.pid")
        if os.path.exists(pid_file):
            with open(pid_file) as f:
                try:
                    os.kill(int(f.read().strip()), 15)
                except (ProcessLookupError, ValueError):
                    pass


def srun(cluster, ctx, name, transport, mpi):
    cmd = ["srun", f"--mpi={mpi}", "-n", str(mh.WORLD), "--time=2",
           *ctx.ddp_run(name, "--set", f'transport.plugin="{transport}"')]
    return mh.run_group(cmd, RUN_LIMIT_S, env=cluster.env)


def trains(cluster, ctx, transport, mpi):
    code, output = srun(cluster, ctx, transport, transport, mpi)
    if code != 0:
        raise mh.Failure(f"srun exited {code}" if code is not None else f"srun ran past {RUN_LIMIT_S} s", output)
    return mh.check_outputs(ctx.out(transport), ctx.reference, transport, output)


def refused_without_pmi(cluster, ctx):
    code, output = srun(cluster, ctx, "mpi-no-pmi", "mpi", "none")
    if code in (0, None):
        raise mh.Failure(f"srun exited {code}, expected a refusal", output)
    missing = [r for r in range(mh.WORLD)
               if f"ddp: rank {r}: error: transport plugin 'mpi': init: {NO_PMI}" not in output]
    if missing:
        raise mh.Failure(f"ranks {missing} did not say why", output)
    return f"srun exited {code}, every rank saying: {NO_PMI[:60]}..."


def main():
    ddp, tmp, config, started = mh.start(__doc__, "slurm", skip_reason)
    ctx = mh.Context(ddp, tmp, config, [])
    cluster = Cluster(tmp)
    try:
        ok = (mh.run_scenario("slurm", cluster.start) and mh.run_scenario("reference", mh.reference, ctx))
        if ok:
            ok = all([mh.run_scenario("gloo", trains, cluster, ctx, "gloo", "none"),
                      mh.run_scenario("mpi", trains, cluster, ctx, "mpi", "pmix"),
                      mh.run_scenario("mpi-no-pmi", refused_without_pmi, cluster, ctx)])
        if not ok:
            print(mh.tail(cluster.logs()), flush=True)
    finally:
        cluster.stop()
    return mh.finish("slurm", ok, tmp, started)


if __name__ == "__main__":
    sys.exit(main())
