#!/usr/bin/python3
"""multihost_test.py — ddp across two "hosts": network namespaces made by
tools/netns_cluster.sh (ddp-h1 = 10.77.0.11, ddp-h2 = 10.77.0.12 on the
bridge ddp-br0), 2 ranks on each, `toy` (configs/toy.toml, world 4, 5 steps,
SGD) on the fixture data.

Scenarios, each into an output directory of its own:
  reference   world 1 on this host (`ddp run CONFIG --set run.world_size=1`);
  mpi         `mpirun --host 10.77.0.11:2,10.77.0.12:2 ddp run CONFIG` with
              the mpi transport and no rendezvous variable: the ranks find
              their rendezvous through PMIx;
  gloo        the same with the gloo transport (its hostname "auto": one
              config serves every host);
  gloo-redis  the 4 ranks started by hand with `ip netns exec`, meeting
              through a redis-server in ddp-h1 (DDP_RENDEZVOUS=redis:...);
  each of these three writes weights equal to the reference's within 1e-6;
  linkdown-gloo-redis
              a long run (run.timeout_s = 10), its ranks started by hand as
              in gloo-redis, whose host 10.77.0.12 loses its link once rank
              0 reports progress: within timeout_s + 10 s of the link going
              down every rank exits non-zero, those on 10.77.0.11 naming
              themselves on stderr ("ddp: rank N: error: ...");
  linkdown-mpi, linkdown-gloo
              the same under mpirun, with the mpi and the gloo transport:
              mpirun must end within timeout_s + 10 s of the link going
              down, non-zero, the ranks on 10.77.0.11 naming themselves.
              mpirun runs on a head of its own (ddp-h0, 10.77.0.10), whose
              TCP gives up on a lost peer after one retransmission
              (tools/netns_cluster.sh up): Open MPI 4.1's mpirun otherwise
              waits some 15 minutes for the lost daemon once a rank has
              failed (see link_down).

Needs root, `ip netns`, mpirun (Open MPI) and the mpi and gloo plugins;
skips (exit 77, one line saying why) without them. The namespaces are
removed at the end, whatever happens. About 35 s.

usage: tests/multihost_test.py --ddp build/bin/ddp
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "tools", "netns_cluster.sh")
DATA = os.path.join(ROOT, "tests", "fixtures", "toy_data.safetensors")
HOSTS = ["10.77.0.11", "10.77.0.12"]
NAMESPACES = ["ddp-h1", "ddp-h2"]
WORLD = 4
RANKS_PER_HOST = 2
TOLERANCE = 1e-6
RUN_LIMIT_S = 40          # any one short run (they take about 2 s)
LINKDOWN_TIMEOUT_S = 10   # run.timeout_s of the link-down runs
SKIP = 77
HEAD = "ddp-h0"           # where mpirun runs (10.77.0.10), as a cluster's login node
MPIRUN = ["ip", "netns", "exec", HEAD, "mpirun"]

# configs/toy.toml on 4 ranks, the data path absolute (ranks may start elsewhere).
CONFIG = f"""[run]
world_size = {WORLD}
steps = 5
seed = 0
timeout_s = 30

[model]
name = "toy"

[data]
path = "{DATA}"
batch_size = 20          # global batch: 5 rows per rank

[optimizer]
name = "sgd"
lr = 0.1

[transport]
plugin = "gloo"

[strategy]
plugin = "naive"
"""
# Variables that would make a launched process think it is a given rank.
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DDP_RENDEZVOUS", "DDP_RUN_ID", "DDP_STATUS_FD")


class Failure(Exception):
    """A scenario's failure: what went wrong, and the output that shows it."""

    def __init__(self, message, output=""):
        super().__init__(message)
        self.output = output


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env.update(extra)
    return env


def skip_reason(ddp):
    """Why this machine cannot run the test, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) not found"
    probe = f"ddp-probe-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "`ip netns` is not usable here (no CAP_SYS_ADMIN?)"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if shutil.which("mpirun") is None:
        return "mpirun not found"
    plugins = os.environ.get("DDP_PLUGIN_DIR", os.path.join(os.path.dirname(ddp), "..", "lib", "ddp"))
    for name in ("mpi", "gloo"):
        if not os.path.exists(os.path.join(plugins, f"libddp_transport_{name}.so")):
            return f"the {name} transport plugin is not built (no libddp_transport_{name}.so in {plugins})"
    return None


# --- processes ----------------------------------------------------------------

def kill_group(proc):
    """SIGTERM to the process's group, SIGKILL after 3 s."""
    for sig, grace in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass


def kill_namespace_processes():
    """Ends whatever this test left running in the namespaces (an orted or
    ranks cut off from their mpirun): nothing else runs in them."""
    for ns in [HEAD, *NAMESPACES]:
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def run_group(cmd, limit_s, env=None):
    """Runs cmd in a session of its own; (exit code or None if it ran past
    limit_s and was killed, stdout and stderr together)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env or clean_env(), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        return None, out


# --- the cluster ------------------------------------------------------------

def cluster(*args):
    return subprocess.run([CLUSTER, *args], capture_output=True, text=True)


def cluster_up():
    """Makes the hosts; mpirun's options for 2 ranks on each."""
    r = cluster("up", str(len(HOSTS)))
    if r.returncode != 0:
        raise Failure(f"tools/netns_cluster.sh up {len(HOSTS)} failed (exit {r.returncode})", r.stderr)
    options = shlex.split(r.stdout)
    hosts = options.index("--host") + 1
    options[hosts] = ",".join(f"{h.split(':')[0]}:{RANKS_PER_HOST}" for h in options[hosts].split(","))
    return options + ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


# --- weights --------------------------------------------------------------------

def read_safetensors(path):
    """{name: (dtype, shape, values)} of a safetensors file."""
    formats = {"F32": "f", "F64": "d", "I32": "i", "I64": "q"}
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        fmt = formats[info["dtype"]]
        count = (end - begin) // struct.calcsize(fmt)
        values = struct.unpack(f"<{count}{fmt}", blob[8 + size + begin:8 + size + end])
        tensors[name] = (info["dtype"], info["shape"], values)
    return tensors


def check_outputs(out_dir, reference, transport, output):
    """The run's weights equal the reference's within TOLERANCE, and its
    summary says it ran on WORLD ranks over `transport`."""
    weights = os.path.join(out_dir, "weights.safetensors")
    if not os.path.exists(weights):
        raise Failure(f"no {weights}", output)
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    if (summary.get("world_size"), summary.get("transport")) != (WORLD, transport):
        raise Failure(f"summary.json says world {summary.get('world_size')} over {summary.get('transport')}, "
                      f"expected world {WORLD} over {transport}", output)
    mine = read_safetensors(weights)
    if sorted(mine) != sorted(reference):
        raise Failure(f"tensors {sorted(mine)}, reference has {sorted(reference)}")
    for name, (dtype, shape, values) in reference.items():
        if mine[name][:2] != (dtype, shape):
            raise Failure(f"{name}: {mine[name][:2]}, reference {(dtype, shape)}")
        worst = max((abs(a - b) for a, b in zip(mine[name][2], values)), default=0.0)
        if not worst <= TOLERANCE:  # catches NaN too
            raise Failure(f"{name} differs from the world-1 reference by {worst} (> {TOLERANCE})")
    return f"{len(reference)} tensors equal the reference within {TOLERANCE}"


# --- scenarios ------------------------------------------------------------------

class Context:
    def __init__(self, ddp, tmp, config, mpirun_options):
        self.ddp, self.tmp, self.config, self.mpirun_options = ddp, tmp, config, mpirun_options
        self.reference = None

    def out(self, name):
        return os.path.join(self.tmp, f"out-{name}")

    def ddp_run(self, name, *more):
        return [self.ddp, "run", self.config, "--set", f'run.output_dir="{self.out(name)}"', *more]


def reference(ctx):
    code, output = run_group(ctx.ddp_run("reference", "--set", "run.world_size=1"), RUN_LIMIT_S)
    if code != 0:
        raise Failure(f"world-1 run exited {code}", output)
    ctx.reference = read_safetensors(os.path.join(ctx.out("reference"), "weights.safetensors"))
    return f"{len(ctx.reference)} tensors"


def under_mpirun(ctx, transport):
    name = f"{transport}-mpirun"
    cmd = [*MPIRUN, *ctx.mpirun_options, *ctx.ddp_run(name, "--set", f'transport.plugin="{transport}"')]
    code, output = run_group(cmd, RUN_LIMIT_S)
    if code != 0:
        raise Failure(f"mpirun exited {code}" if code is not None else f"mpirun ran past {RUN_LIMIT_S} s", output)
    return check_outputs(ctx.out(name), ctx.reference, transport, output)


def wait_for_port(host, port, limit_s):
    deadline = time.monotonic() + limit_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise Failure(f"nothing listens on {host}:{port} after {limit_s} s")
            time.sleep(0.1)


def start_redis(port):
    """A redis-server in ddp-h1 on HOSTS[0]:port, once it listens; the caller
    ends it (kill_group)."""
    redis = subprocess.Popen(["ip", "netns", "exec", NAMESPACES[0], "redis-server", "--port", str(port),
                              "--bind", HOSTS[0], "--protected-mode", "no", "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port(HOSTS[0], port, 10)
    except Failure:
        kill_group(redis)
        raise
    return redis


class Rank:
    """A rank started by hand: its process, and files for its stdout and stderr."""

    def __init__(self, ctx, name, rank, env, *more):
        self.rank = rank
        self.stdout = os.path.join(ctx.tmp, f"{name}-rank{rank}.out")
        self.stderr = os.path.join(ctx.tmp, f"{name}-rank{rank}.err")
        ns = NAMESPACES[rank // RANKS_PER_HOST]
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(["ip", "netns", "exec", ns, *ctx.ddp_run(name, *more)], stdout=out,
                                         stderr=err, env=env, start_new_session=True)

    def read(self, which):
        with open(getattr(self, which)) as f:
            return f.read()

    def output(self):
        return f"--- rank {self.rank} stdout\n{self.read('stdout')}--- rank {self.rank} stderr\n{self.read('stderr')}"


def start_ranks_by_hand(ctx, name, rendezvous, *more):
    """The WORLD ranks in the namespaces, RANKS_PER_HOST to a host, under a
    run id of their own; `more`: more arguments to `ddp run`."""
    run_id = f"multihost-{os.getpid()}-{time.time_ns()}"
    return [Rank(ctx, name, rank, clean_env(RANK=str(rank), WORLD_SIZE=str(WORLD),
                                            LOCAL_RANK=str(rank % RANKS_PER_HOST),
                                            DDP_RENDEZVOUS=rendezvous, DDP_RUN_ID=run_id), *more)
            for rank in range(WORLD)]


def wait_ranks(ranks, limit_s):
    """Waits for every rank (killing all past limit_s); the failures, and
    every rank's output."""
    deadline = time.monotonic() + limit_s
    failures = []
    for r in ranks:
        try:
            code = r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(r.proc)
            code = None
        if code != 0:
            failures.append(f"rank {r.rank} " + (f"exited {code}" if code is not None else f"ran past {limit_s} s"))
    return failures, "".join(r.output() for r in ranks)


def gloo_redis(ctx):
    name, port = "gloo-redis", 6379
    redis = start_redis(port)
    try:
        ranks = start_ranks_by_hand(ctx, name, f"redis:{HOSTS[0]}:{port}")
        failures, output = wait_ranks(ranks, RUN_LIMIT_S)
    finally:
        kill_group(redis)
    if failures:
        raise Failure("; ".join(failures), output)
    return check_outputs(ctx.out(name), ctx.reference, "gloo", output)


# --- a host cut off -------------------------------------------------------------
#
# Long runs (LINKDOWN_STEPS steps, run.timeout_s = LINKDOWN_TIMEOUT_S) whose
# host 10.77.0.12 loses its link once rank 0 reports progress; whatever must
# end does so within LINKDOWN_LIMIT_S of the link going down.

LINKDOWN_STEPS = 1000000
LINKDOWN_LIMIT_S = LINKDOWN_TIMEOUT_S + 10
PROGRESS = re.compile(r"step \d+/\d+")


def long_run(transport):
    return ["--set", f'transport.plugin="{transport}"', "--set", f"run.steps={LINKDOWN_STEPS}",
            "--set", "run.log_every=50", "--set", f"run.timeout_s={LINKDOWN_TIMEOUT_S}"]


def wait_for(condition, still_running, limit_s, what):
    """Polls condition() until it holds; Failure if still_running() turns
    false or limit_s passes first."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if not still_running():
            raise Failure(f"{what}: the run ended first")
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not within {limit_s} s")
        time.sleep(0.2)


def cut_off_host():
    """Takes 10.77.0.12's link down (a second after training started); the
    time it went down."""
    time.sleep(1)
    r = cluster("link", HOSTS[1], "down")
    if r.returncode != 0:
        raise Failure(f"tools/netns_cluster.sh link {HOSTS[1]} down failed", r.stderr)
    return time.monotonic()


def restore_host():
    cluster("link", HOSTS[1], "up")
    kill_namespace_processes()


def linkdown_gloo_redis(ctx):
    """The ranks started by hand: every rank, on either host, fails on its
    own within the limit; those on 10.77.0.11 name themselves."""
    name, port = "linkdown-gloo-redis", 6380
    redis, ranks = start_redis(port), []
    try:
        ranks = start_ranks_by_hand(ctx, name, f"redis:{HOSTS[0]}:{port}", *long_run("gloo"))
        wait_for(lambda: PROGRESS.search(ranks[0].read("stdout")),
                 lambda: all(r.proc.poll() is None for r in ranks), RUN_LIMIT_S, "rank 0 reporting progress")
        down_at = cut_off_host()
        ended = wait_all(ranks, down_at + LINKDOWN_LIMIT_S)
        return judge_ranks(ranks, ended, down_at)
    finally:
        for r in ranks:
            kill_group(r.proc)
        kill_group(redis)
        restore_host()


def wait_all(ranks, deadline):
    """{rank: time it ended} for the ranks that end by deadline."""
    ended = {}
    while len(ended) < len(ranks) and time.monotonic() < deadline:
        for r in ranks:
            if r.rank not in ended and r.proc.poll() is not None:
                ended[r.rank] = time.monotonic()
        time.sleep(0.1)
    return ended


def judge_ranks(ranks, ended, down_at):
    failures, seen, named = [], [], {}
    for r in ranks:
        if r.rank not in ended:
            failures.append(f"rank {r.rank} still running {LINKDOWN_LIMIT_S} s after the link went down "
                            f"(run.timeout_s = {LINKDOWN_TIMEOUT_S})")
            continue
        took, code = ended[r.rank] - down_at, r.proc.returncode
        named[r.rank] = re.search(r"ddp: rank \d.*", r.read("stderr"))
        if code == 0:
            failures.append(f"rank {r.rank} exited 0")
        elif r.rank < RANKS_PER_HOST and not named[r.rank]:
            failures.append(f"rank {r.rank} exited {code} {took:.1f} s after the link went down, "
                            "its stderr naming no rank")
        seen.append(f"rank {r.rank} exited {code} after {took:.1f} s" + ("" if named[r.rank] else " (unnamed)"))
    if failures:
        raise Failure("; ".join(failures), "".join(r.output() for r in ranks))
    return f"{', '.join(seen)}; rank 0: {named[0].group(0)[:110]}"


class LineWatcher(threading.Thread):
    """Collects a process's output; `started` is set at its first progress line."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.lines, self.started = stream, [], threading.Event()

    def run(self):
        for line in self.stream:
            self.lines.append(line)
            if PROGRESS.match(line):
                self.started.set()

    def text(self):
        return "".join(self.lines)


def link_down(ctx, transport):
    """A long run under mpirun: mpirun ends, non-zero, the ranks of
    10.77.0.11 naming themselves ("ddp: rank N: error: ...").

    Those ranks find their collectives stuck after run.timeout_s (plus the
    engine's grace where the transport has no timeout of its own: mpi's
    blocking calls) and report it; the run then ends as mpirun gives up on
    the lost daemon. Open MPI 4.1's mpirun has no check of its own for a
    lost host: it sends the kill to every daemon and waits until TCP gives
    up on the lost one, which by default takes some 15 minutes (here, with
    net.ipv4.tcp_retries2 = 1 on the head, about 2 s). TCP keepalive on
    mpirun's links (--mca oob_tcp_keepalive_*) would end it sooner, naming
    the host but no rank, and only if it fires before a rank fails: the
    kill then pending keeps keepalive from going out.
    """
    name = f"linkdown-{transport}"
    cmd = [*MPIRUN, *ctx.mpirun_options, *ctx.ddp_run(name, *long_run(transport))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(),
                            start_new_session=True)
    watcher = LineWatcher(proc.stdout)
    watcher.start()
    try:
        try:
            wait_for(watcher.started.is_set, lambda: proc.poll() is None, RUN_LIMIT_S, "training")
        except Failure as e:
            raise Failure(str(e), watcher.text()) from None
        down_at = cut_off_host()
        try:
            code = proc.wait(timeout=LINKDOWN_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise Failure(f"mpirun still running {LINKDOWN_LIMIT_S} s after the link went down "
                          f"(run.timeout_s = {LINKDOWN_TIMEOUT_S})", watcher.text()) from None
        took = time.monotonic() - down_at
        watcher.join(timeout=5)
        return judge_link_down(code, took, watcher.text())
    finally:
        kill_group(proc)
        restore_host()


def judge_link_down(code, took, output):
    if code == 0:
        raise Failure(f"mpirun exited 0 {took:.1f} s after the link went down", output)
    named = re.search(r"ddp: rank \d", output)
    if not named:
        raise Failure(f"mpirun exited {code} {took:.1f} s after the link went down, naming no rank", output)
    line = next(l for l in output.splitlines() if named.group(0) in l)
    return f"mpirun exited {code} {took:.1f} s after the link went down: {line.strip()}"


# --- main -------------------------------------------------------------------------

def tail(text, lines=40):
    return "\n".join("    " + l for l in text.rstrip().splitlines()[-lines:])


def run_scenario(name, fn, *args):
    start = time.monotonic()
    try:
        detail, ok = fn(*args), True
    except Failure as e:
        detail, ok = str(e) + (f"\n{tail(e.output)}" if e.output else ""), False
    print(f"{'PASS' if ok else 'FAIL'}  {name:<19} {time.monotonic() - start:5.1f} s  {detail}", flush=True)
    return ok


def scenarios(ctx):
    if not run_scenario("reference", reference, ctx):
        return False
    results = [run_scenario("mpi", under_mpirun, ctx, "mpi"),
               run_scenario("gloo", under_mpirun, ctx, "gloo")]
    if shutil.which("redis-server"):
        results.append(run_scenario("gloo-redis", gloo_redis, ctx))
    else:
        print("SKIP  gloo-redis      redis-server not found", flush=True)
    if shutil.which("redis-server"):
        results.append(run_scenario("linkdown-gloo-redis", linkdown_gloo_redis, ctx))
    else:
        print("SKIP  linkdown-gloo-redis redis-server not found", flush=True)
    results.append(run_scenario("linkdown-mpi", link_down, ctx, "mpi"))
    results.append(run_scenario("linkdown-gloo", link_down, ctx, "gloo"))
    return all(results)


def start(doc, name, skip_reason):
    """The command line (--ddp) and the checks every such test starts with:
    exits 1 if --ddp is no executable, SKIP saying why if this machine
    cannot run it; else (ddp, a fresh output directory, the 4-rank config
    written in it, the start time)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--ddp", required=True, help="the ddp executable (build/bin/ddp)")
    ddp = os.path.abspath(parser.parse_args().ddp)
    if not os.access(ddp, os.X_OK):
        print(f"FAIL: {ddp} is not an executable", flush=True)
        sys.exit(1)
    reason = skip_reason(ddp)
    if reason:
        print(f"SKIP: {reason}", flush=True)
        sys.exit(SKIP)
    tmp = tempfile.mkdtemp(prefix=f"ddp-{name}-")
    config = os.path.join(tmp, "toy4.toml")
    with open(config, "w") as f:
        f.write(CONFIG)
    return ddp, tmp, config, time.monotonic()


def finish(name, ok, tmp, started):
    """Says how it went; removes the outputs of a passing run. The exit code."""
    print(f"{'PASS' if ok else 'FAIL'}: {name}, {time.monotonic() - started:.0f} s (outputs in {tmp})", flush=True)
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def main():
    ddp, tmp, config, started = start(__doc__, "multihost", skip_reason)
    try:
        cluster("down")
        ok = scenarios(Context(ddp, tmp, config, cluster_up()))
    except Failure as e:
        print(f"FAIL  {e}\n{tail(e.output)}", flush=True)
        ok = False
    finally:
        kill_namespace_processes()
        cluster("down")
    return finish("multihost", ok, tmp, started)


if __name__ == "__main__":
    sys.exit(main())
