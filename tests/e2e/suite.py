#!/usr/bin/env python3
"""End-to-end checks: real S3 and Swift clients against a live `blindfold serve`, looped over
every engine and over HTTPS, then the extras (users, the admin listener under load, growth,
`blindfold report --quick`, the crash loop, the deploy/ folder with a live Prometheus).

Run by scripts/e2e.sh, which installs the clients and builds the binary first; by hand, with the
clients installed:

    python3 tests/e2e/suite.py --bin target/debug/blindfold
    E2E_ONLY="curious restic" python3 tests/e2e/suite.py --bin target/debug/blindfold

The targets (what `blindfold serve` runs as) and the clients each target runs:

    tao           the default engine: the full client pass (every check of every client)
    tls           tao behind `--tls self-signed`: the full client pass trusting its certificate,
                  plus the banner, plain-HTTP refusal and certificate reload on SIGHUP
    path-oram, tee, tee-enclave (the trusted component as `blindfold enclave`), oblivistore,
    curious, curious-path, nodes (two `blindfold node` behind `serve --nodes`):
                  the short pass (each client one upload, download, listing and delete,
                  compared byte for byte) and the target's own checks

Every target ends with a SIGTERM that must exit cleanly and `blindfold verify`.

One line per check, `ok - name # N s` or `FAIL - name: reason`, and a closing `N passed, M
failed` (with E2E_COUNTS_FILE set, "N M" goes to that file instead and the closing line reads
`e2e checks: N ok, M failed`). Exits non-zero if any check failed. Every process it started
is killed and the work directory removed on any exit.

Environment: BLINDFOLD_BIN (or --bin), E2E_ONLY (the targets above select the matrix's rows,
the clients aws boto3 rclone restic s3cmd git swift its columns, and the extras users versions observe
grow report crash crash-store crash-nodes disk-full deploy run only when named; naming only rows runs every client, naming only
columns every target; unset runs everything), E2E_KEEP=1 (keep the work directory), E2E_SOAK_SECONDS (45), E2E_SOAK_CLIENTS
(256), E2E_ARTEFACTS (browser screenshots), CHROMIUM, E2E_CRASH_ROUNDS (20), E2E_CRASH_SEED,
E2E_CRASH_ROTATE_EVERY (6), E2E_CRASH_GROW_EVERY (7), E2E_COUNTS_FILE, E2E_FULL (targets that
run the full pass instead of the short one, or `all`).
"""

import argparse
import atexit
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import features  # noqa: E402
from clients import CLIENTS  # noqa: E402
from gateway import Cluster, Context, Enclave, Gateway  # noqa: E402
from harness import Checks, expect, kill_all, step  # noqa: E402


class Pass:
    """One target's run: names its checks `<target>: …` and gives each client a directory."""

    def __init__(self, run, name, full=False, big=False, multipart_mib=0):
        self.run, self.name, self.full, self.big, self.multipart_mib = run, name, full, big, multipart_mib
        self.root = os.path.join(run.ctx.work, name)

    def dir(self, sub):
        d = os.path.join(self.root, sub)
        os.makedirs(d, exist_ok=True)
        return d

    def check(self, label, fn, *args, **kwargs):
        return self.run.checks.check(f"{self.name}: {label}", fn, *args, **kwargs)

    def ingest(self, name, cmd, **kw):
        self.run.checks.ingest(f"{self.name}: {name}", cmd, **kw)

    def stop_and_verify(self, gw, verify_label=""):
        rc = gw.stop()
        self.check("clean exit on SIGTERM", lambda: expect(rc == 0, f"exit status {rc}"))
        self.check(f"blindfold verify{' ' + verify_label if verify_label else ''}", gw.verify)
        self.run.show_stderr(gw)


class Target:
    """A row of the matrix: how its gateway is started and which checks are its own."""

    def __init__(self, name, what, flags=(), capacity="64MiB", full=False, big=False, multipart_mib=0,
                 tls=False, enclave=False, cluster=False, before=(), after=(), after_stop=(), verify=None):
        self.name, self.what, self.flags, self.capacity = name, what, list(flags), capacity
        self.full, self.big, self.multipart_mib, self.tls = full, big, multipart_mib, tls
        self.enclave, self.cluster = enclave, cluster
        self.before, self.after, self.after_stop, self.verify = before, after, after_stop, verify


SMALL_BLOCKS = ["--block-size", "4096", "--allow-overhead"]


def hook(label, fn):
    """A target check: `fn(pass, gateway)` run as `<target>: label`."""
    return lambda p, gw: p.check(label, fn, p, gw)


TARGETS = [
    Target("tao", "the tao engine (default): every client, every check", capacity="256MiB", full=True,
           big=True, multipart_mib=64),
    Target("tls", "HTTPS (serve --tls self-signed): every client, trusting the certificate", full=True,
           multipart_mib=17, tls=True,
           before=[hook("banner says https:// and the certificate's fingerprint; key 0600; admin over HTTPS",
                        features.tls_banner),
                   hook("plain HTTP on the HTTPS port gets a 400 saying https; untrusted clients refuse",
                        features.tls_plain_refused)],
           after=[hook("SIGHUP reloads a renewed certificate; a broken one is refused and the renewed kept",
                       features.tls_reload)]),
    Target("path-oram", "the path-oram engine (sequential Path ORAM)", flags=["--engine", "path-oram"]),
    Target("tee", "the tee engine, trusted component in the gateway", flags=["--engine", "tee", *SMALL_BLOCKS],
           after=[lambda p, gw: features.part_kill_restart(p, gw)],
           after_stop=[lambda p, gw: features.part_after_stop(p, gw)]),
    Target("tee-enclave", "the tee engine, trusted component in its own process (blindfold enclave)",
           flags=["--engine", "tee", *SMALL_BLOCKS], enclave=True,
           after_stop=[lambda p, gw: p.check(
               "rotate-key: the enclave restarted with the new TEE key, the gateway re-keys every cell, "
               "objects read back, the old key opens nothing", features.enclave_rotate, p, gw)]),
    *[Target(e, f"the {e} engine", flags=["--engine", e, *SMALL_BLOCKS],
             after=[lambda p, gw: features.part_kill_restart(p, gw)],
             after_stop=[lambda p, gw: features.part_after_stop(p, gw)])
      for e in ("oblivistore", "curious", "curious-path")],
    Target("nodes", "distributed mode (an ObliviStore and a TaoStore blindfold node behind serve --nodes)",
           capacity="32MiB", flags=["--block-size", "4096"], cluster=True,
           after=[lambda p, gw: features.nodes_after_clients(p, gw)],
           after_stop=[lambda p, gw: features.nodes_after_stop(p, gw)],
           verify=("blindfold verify through the nodes (and a clear refusal without them)", features.nodes_verify)),
]


class Run:
    def __init__(self, ctx):
        self.ctx, self.checks = ctx, Checks()
        self.verbose_failures = True  # the first failure shows its server's stderr

    def show_stderr(self, gw):
        """After the first target with a failed check, the end of its server's stderr."""
        if not self.checks.failed or not self.verbose_failures:
            return
        self.verbose_failures = False
        tail = gw.stderr().splitlines()[-40:]
        if tail:
            print(f"{gw.name}: server stderr (last 40 lines):", flush=True)
            for line in tail:
                print(f"    | {line}", flush=True)

    def pass_(self, name, what, **kw):
        step(f"e2e: {what}")
        return Pass(self, name, **kw)

    def target(self, t, clients):
        wanted = os.environ.get("E2E_FULL", "").split()
        full = t.full or t.name in wanted or "all" in wanted
        p = self.pass_(t.name, t.what + ("" if t.full or not full else " (full pass: E2E_FULL)"), full=full,
                       big=t.big, multipart_mib=t.multipart_mib or 17)
        ctx = self.ctx
        enclave = cluster = None
        gw_kw = dict(capacity=t.capacity, flags=list(t.flags), tls=t.tls)
        try:
            if t.enclave:
                enclave = Enclave(ctx, os.path.join(p.root, "enclave"))
                if not p.check("start blindfold enclave", enclave.start):
                    return
                gw_kw.update(data_dir=enclave.data_dir, flags=gw_kw["flags"] + ["--store", enclave.store])
            if t.cluster:
                cluster = Cluster(ctx, os.path.join(p.root, "nodes"))
                if not p.check("blindfold cluster-certs, start two blindfold node", cluster.start):
                    return
                gw_kw["nodes"] = cluster
            gw = Gateway(ctx, t.name, **gw_kw)
            gw.enclave = enclave
            if not p.check("start blindfold serve", gw.start):
                return
            print(f"  endpoint: {gw.endpoint}\n  data dir: {gw.data_dir}", flush=True)
            for h in t.before:
                h(p, gw)
            for c in clients:
                CLIENTS[c](p, gw)
            for h in t.after:
                h(p, gw)
            rc = gw.stop()
            p.check("clean exit on SIGTERM", lambda: expect(rc == 0, f"exit status {rc}"))
            label, fn = t.verify or ("blindfold verify", lambda p_, g: g.verify())
            p.check(label, fn, p, gw)
            for h in t.after_stop:
                h(p, gw)
            self.show_stderr(gw)
        finally:
            if cluster:
                cluster.stop()
            if enclave:
                enclave.stop()


def selection(words):
    """E2E_ONLY → (targets, clients, extras), or an error message."""
    targets = [t.name for t in TARGETS]
    known = set(targets) | set(CLIENTS) | set(features.EXTRAS)
    if not words:
        return targets, list(CLIENTS), list(features.EXTRAS), None
    unknown = [w for w in words if w not in known]
    if unknown:
        return [], [], [], f"unknown word(s) {unknown}; known: {' '.join(targets + list(CLIENTS) + list(features.EXTRAS))}"
    t = [x for x in targets if x in words]
    c = [x for x in CLIENTS if x in words]
    e = [x for x in features.EXTRAS if x in words]
    if c and not t:
        t = targets
    if t and not c:
        c = list(CLIENTS)
    return t, c, e, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bin", default=os.environ.get("BLINDFOLD_BIN"), help="the blindfold binary (BLINDFOLD_BIN)")
    ap.add_argument("--only", default=os.environ.get("E2E_ONLY", ""), help="E2E_ONLY")
    args = ap.parse_args()
    start = time.monotonic()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    checks_holder = {}

    def finish(code=None):
        checks = checks_holder.get("run").checks if "run" in checks_holder else Checks()
        print(f"\ne2e took {time.monotonic() - start:.0f} s")
        counts = os.environ.get("E2E_COUNTS_FILE")
        if counts:
            with open(counts, "w") as f:
                f.write(f"{checks.passed} {checks.failed}\n")
            print(f"e2e checks: {checks.passed} ok, {checks.failed} failed", flush=True)
        else:
            print(f"{checks.passed} passed, {checks.failed} failed", flush=True)
        return code if code is not None else (1 if checks.failed else 0)

    if not args.bin or not os.access(args.bin, os.X_OK):
        c = Checks()
        c.fail("build", f"no blindfold binary at {args.bin!r} (set BLINDFOLD_BIN or --bin)")
        checks_holder["run"] = type("R", (), {"checks": c})()
        return finish()
    targets, clients, extras, err = selection(args.only.split())
    if err:
        c = Checks()
        c.fail("E2E_ONLY", err)
        checks_holder["run"] = type("R", (), {"checks": c})()
        return finish()

    work = tempfile.mkdtemp(prefix="blindfold-e2e.", dir=os.environ.get("TMPDIR") or "/tmp")
    target_dir = os.environ.get("CARGO_TARGET_DIR") or os.path.join(root, "target")
    artefacts = os.environ.get("E2E_ARTEFACTS") or os.path.join(os.path.abspath(target_dir), "browser-artefacts")

    def cleanup():
        kill_all()
        if os.environ.get("E2E_KEEP") == "1":
            print(f"work directory kept: {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)

    atexit.register(cleanup)

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    ctx = Context(os.path.abspath(args.bin), work, root, artefacts)
    run = Run(ctx)
    checks_holder["run"] = run
    print(f"  binary: {ctx.bin}\n  work: {work}\n  targets: {' '.join(targets) or '-'}\n"
          f"  clients: {' '.join(clients) if targets else '-'}\n  extras: {' '.join(extras) or '-'}", flush=True)
    by_name = {t.name: t for t in TARGETS}
    for name in targets:
        t0 = time.monotonic()
        run.target(by_name[name], clients)
        print(f"  {name}: {time.monotonic() - t0:.0f} s", flush=True)
    for name in extras:
        t0 = time.monotonic()
        features.EXTRAS[name](run)
        print(f"  {name}: {time.monotonic() - t0:.0f} s", flush=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
