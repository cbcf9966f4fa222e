"""The `deploy/` folder, checked: the extra `deploy` of the suite (E2E_ONLY=deploy).

Static checks: `promtool check rules` and `promtool test rules` on deploy/prometheus (every
alert shown firing and quiet), `promtool check config` on the scrape configuration (its paths
pointed at the repository's files), `systemd-analyze verify` and `security` on
deploy/blindfold.service (its ExecStart pointed at the binary under test; any warning fails),
and the system calls of a gateway under strace against the unit's SystemCallFilter=.

Then a live check: a real Prometheus (started here on a free 127.0.0.1 port, with its storage
in the work directory, and stopped after) scrapes a live `blindfold serve` started from a
configuration file with an admin token, as deploy/README.md sets one up, and loads
deploy/prometheus/alerts.yml with every `for:` cut to seconds. It must see the target up and
the gateway's metrics; BlindfoldStoreNearlyFull must stay quiet on the empty store and fire
once boto3 has filled it until the gateway refuses uploads; BlindfoldDown must fire once the
gateway stops. The store-full part needs the gateway's `blindfold_store_blocks_*` gauges.
"""

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.parse

from clients import boto3_client, http
from gateway import Gateway
from harness import die, expect, log, read, run, spawn, forget, wait_for

ADMIN_TOKEN = "e2e-prometheus-token-0123456789"
# The test's Prometheus scrapes and evaluates every second; the rules' `for:` becomes this.
FOR = "2s"


def deploy_dir(ctx):
    return os.path.join(ctx.root, "deploy")


def promtool(*args):
    return run(["promtool", *args], timeout=120)


# ---------------------------------------------------------------------------------------------
# Static checks.
def rules_check(ctx):
    promtool("check", "rules", os.path.join(deploy_dir(ctx), "prometheus", "alerts.yml"))


def rules_test(ctx):
    out = promtool("test", "rules", os.path.join(deploy_dir(ctx), "prometheus", "alerts_test.yml")).stdout
    expect("SUCCESS" in out, f"promtool test rules did not say SUCCESS: {out[-300:]}")


def scrape_config_check(ctx, work):
    """prometheus.yml with its /etc paths replaced by real files, so that promtool can follow them."""
    os.makedirs(work, exist_ok=True)
    token = os.path.join(work, "blindfold.token")
    with open(token, "w") as f:
        f.write(ADMIN_TOKEN)
    text = read(os.path.join(deploy_dir(ctx), "prometheus", "prometheus.yml")).decode()
    for path, real in (("/etc/prometheus/blindfold-alerts.yml", os.path.join(deploy_dir(ctx), "prometheus", "alerts.yml")),
                       ("/etc/prometheus/blindfold.token", token)):
        expect(path in text, f"prometheus.yml no longer names {path}")
        text = text.replace(path, real)
    cfg = os.path.join(work, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(text)
    out = promtool("check", "config", cfg).stdout
    expect("SUCCESS" in out and "6 rules found" in out, f"promtool check config: {out[-300:]}")


def unit_copy(ctx, work):
    """deploy/blindfold.service with its ExecStart pointed at the binary under test."""
    os.makedirs(work, exist_ok=True)
    text = read(os.path.join(deploy_dir(ctx), "blindfold.service")).decode()
    expect("ExecStart=/usr/local/bin/blindfold serve " in text, "the unit's ExecStart changed: update this check")
    unit = os.path.join(work, "blindfold.service")
    with open(unit, "w") as f:
        f.write(text.replace("/usr/local/bin/blindfold", ctx.bin))
    return unit


def unit_verify(ctx, work):
    r = run(["systemd-analyze", "verify", unit_copy(ctx, work)], timeout=120, ok=False)
    # verify exits 0 on unknown keys and unparsable values, printing a warning: those fail too.
    said = (r.stdout + r.stderr).strip()
    expect(r.returncode == 0 and not said, f"systemd-analyze verify (status {r.returncode}): {said[-500:]}")


def unit_security(ctx, work):
    r = run(["systemd-analyze", "security", "--offline=true", "--threshold=20", "--no-pager",
             unit_copy(ctx, work)], timeout=120, ok=False)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
    expect(m, f"no exposure level in systemd-analyze security's output: {r.stdout[-300:]}")
    expect(float(m.group(1)) <= 2.0, f"the unit's exposure level is {m.group(1)}, more than 2.0")


def unit_command_line(ctx, work):
    """Every flag the unit gives `serve` is one `serve --help` lists."""
    text = read(os.path.join(deploy_dir(ctx), "blindfold.service")).decode()
    m = re.search(r"^ExecStart=/usr/local/bin/blindfold (.*)$", text, re.M)
    expect(m, "no ExecStart in the unit")
    args = m.group(1).split()
    expect(args[:1] == ["serve"], f"the unit does not run serve: {args}")
    flags = [a for a in args if a.startswith("--")]
    help_text = ctx.blindfold("serve", "--help").stdout
    for flag in flags:
        expect(re.search(rf"^\s+{re.escape(flag)}\b", help_text, re.M), f"serve has no flag {flag}")


def syscall_set(names):
    """The system calls a SystemCallFilter= list names (groups expanded by systemd-analyze)."""
    out = set()
    for name in names:
        if not name.startswith("@"):
            out.add(name)
            continue
        lines = run(["systemd-analyze", "syscall-filter", name], timeout=60).stdout.splitlines()[1:]
        words = [w.strip() for w in lines if w.strip() and not w.strip().startswith("#")]
        out |= syscall_set(words)
    return out


class TracedGateway(Gateway):
    """A gateway under `strace -f`: its process is strace's, signals go to the gateway itself."""

    def __init__(self, ctx, name, trace, **kw):
        super().__init__(ctx, name, **kw)
        self.trace = trace

    def serve_args(self, flags=()):
        return ["strace", "-f", "-qq", "-o", self.trace, *super().serve_args(flags)]

    def signal(self, sig):
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
            os.kill(int(f.read().split()[0]), sig)

    def stop(self, seconds=30):
        self.signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
        forget(self.proc)
        self.proc = None
        return rc


def unit_syscalls(ctx, work):
    """Every system call a gateway makes (start with TLS, S3 traffic, a SIGHUP reload, a clean
    stop) passes the unit's SystemCallFilter=."""
    text = read(os.path.join(deploy_dir(ctx), "blindfold.service")).decode()
    allow, deny = set(), set()
    for m in re.finditer(r"^SystemCallFilter=(~?)(.*)$", text, re.M):
        (deny if m.group(1) else allow).update(syscall_set(m.group(2).split()))
    expect(allow, "the unit has no SystemCallFilter= allow list")
    trace = os.path.join(work, "strace.out")
    gw = TracedGateway(ctx, "deploy-strace", trace, capacity="4MiB", tls=True)
    gw.start(timeout=120)
    try:
        s3 = boto3_client(gw)
        s3.create_bucket(Bucket="e2e-syscalls")
        for i in range(8):
            s3.put_object(Bucket="e2e-syscalls", Key=f"k{i}", Body=os.urandom(50_000))
            s3.get_object(Bucket="e2e-syscalls", Key=f"k{i}")["Body"].read()
        s3.list_objects_v2(Bucket="e2e-syscalls")
        s3.delete_object(Bucket="e2e-syscalls", Key="k0")
        gw.signal(signal.SIGHUP)
        time.sleep(0.5)
    finally:
        rc = gw.stop()
    expect(rc == 0, f"the traced gateway exited with status {rc}")
    used = set()
    for line in read(trace).decode("utf-8", "replace").splitlines():
        m = re.match(r"^\d+\s+([a-z0-9_]+)\(", line)
        if m:
            used.add(m.group(1))
    expect(len(used) > 20, f"only {len(used)} system calls in the trace: {sorted(used)}")
    refused = sorted(c for c in used if c not in allow or c in deny)
    expect(not refused, f"the unit's SystemCallFilter= refuses {refused} (the gateway made {len(used)} kinds of call)")


# ---------------------------------------------------------------------------------------------
# A live Prometheus.
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """`prometheus` on 127.0.0.1 scraping one gateway every second, with the rules given."""

    def __init__(self, work, target, rules):
        self.work, self.proc = work, None
        os.makedirs(work, exist_ok=True)
        token = os.path.join(work, "token")
        with open(token, "w") as f:
            f.write(ADMIN_TOKEN)
        self.config = os.path.join(work, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [{json.dumps(rules)}]
scrape_configs:
  - job_name: blindfold
    authorization: {{ type: Bearer, credentials_file: {json.dumps(token)} }}
    static_configs: [{{ targets: [{json.dumps(target)}] }}]
""")
        self.url = None

    def start(self):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = os.path.join(self.work, "prometheus.log")
        with open(self.log, "w") as out:
            self.proc = spawn(["prometheus", f"--config.file={self.config}",
                               f"--storage.tsdb.path={os.path.join(self.work, 'data')}",
                               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                              stdout=out, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                return "exited"
            try:
                return http(f"{self.url}/-/ready", timeout=2)[0] == 200
            except OSError:
                return False

        got = wait_for(ready, 30, 0.2)
        if got is not True:
            die(f"prometheus did not become ready ({'it exited' if got else '30 s'}): "
                f"{read(self.log).decode()[-1000:]}")
        return self

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        code, body, _ = http(url, timeout=10)
        expect(code == 200, f"GET {url}: HTTP {code} {body[:200]!r}")
        doc = json.loads(body)
        expect(doc.get("status") == "success", f"GET {url}: {doc}")
        return doc["data"]

    def query(self, q):
        return self.api("query", query=q)["result"]

    def alert_state(self, name):
        """'firing', 'pending' or None for the alert `name`."""
        states = [a["state"] for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name]
        return "firing" if "firing" in states else ("pending" if states else None)

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            forget(self.proc)
            self.proc = None


def fast_rules(ctx, work):
    """alerts.yml with every `for:` cut to FOR, so that the alerts fire within seconds."""
    text = read(os.path.join(deploy_dir(ctx), "prometheus", "alerts.yml")).decode()
    text, n = re.subn(r"^(\s+for:) \S+$", rf"\1 {FOR}", text, flags=re.M)
    expect(n >= 3, f"only {n} `for:` lines in alerts.yml")
    path = os.path.join(work, "alerts-fast.yml")
    with open(path, "w") as f:
        f.write(text)
    return path


def scraped(prom):
    def targets():
        active = prom.api("targets")["activeTargets"]
        log(json.dumps(active)[:2000])
        return [t for t in active if t["labels"].get("job") == "blindfold" and t["health"] == "up"]

    expect(wait_for(targets, 20, 0.5), "Prometheus lists no healthy blindfold target within 20 s")
    expect(wait_for(lambda: prom.query("blindfold_info"), 10, 0.5), "no blindfold_info series in Prometheus")
    up = prom.query('up{job="blindfold"}')
    expect(up and up[0]["value"][1] == "1", f"up{{job=\"blindfold\"}} is {up}")
    names = {r["metric"]["__name__"] for r in prom.query('{job="blindfold",__name__=~"blindfold_.+"}')}
    log(f"scraped: {sorted(names)}")
    for n in ("blindfold_store_requests_total", "blindfold_integrity_errors_total", "blindfold_engine_poisoned"):
        expect(n in names, f"{n} is not in what Prometheus scraped ({len(names)} blindfold_ names)")
    groups = prom.api("rules")["groups"]
    rules = [r["name"] for g in groups for r in g["rules"]]
    expect(len(rules) == 6 and "BlindfoldStoreNearlyFull" in rules, f"rules loaded: {rules}")
    for name in rules:
        if name == "BlindfoldDataDiskNearlyFull":
            # This one reads the machine's real disk: it must be active exactly when that disk
            # has less than a tenth free (a CI machine's disk may well be that full).
            v = prom.query("blindfold_data_dir_free_bytes / blindfold_data_dir_size_bytes")
            expect(v, "Prometheus has no data-disk ratio for the gateway")
            ratio = float(v[0]["value"][1])
            if abs(ratio - 0.1) < 0.002:
                continue  # at the threshold itself either state is right
            want = ratio < 0.1
            expect(wait_for(lambda: (prom.alert_state(name) is not None) == want, 10, 0.5),
                   f"{name} is {prom.alert_state(name)} with {ratio:.3f} of the data disk free")
            continue
        expect(prom.alert_state(name) is None, f"{name} is {prom.alert_state(name)} on a new, healthy gateway")


def store_fills(prom, gw):
    """boto3 uploads 64 KiB objects until the gateway refuses one; BlindfoldStoreNearlyFull was
    quiet before."""
    expect(prom.alert_state("BlindfoldStoreNearlyFull") is None, "the alert is active on an empty store")
    s3 = boto3_client(gw)
    s3.create_bucket(Bucket="e2e-fill")
    body = os.urandom(64 << 10)
    for i in range(200):
        try:
            s3.put_object(Bucket="e2e-fill", Key=f"f{i}", Body=body)
        except Exception as e:  # noqa: BLE001 - the refusal is what we wait for
            log(f"refused after {i} uploads: {e}")
            expect(i >= 4, f"the 1 MiB store refused upload {i}: {e}")
            return
    die("200 uploads of 64 KiB into the 1 MiB store were all accepted")


def store_alert(prom):
    """BlindfoldStoreNearlyFull fires on the full store (it needs the blindfold_store_blocks_* gauges)."""
    if not wait_for(lambda: prom.query("blindfold_store_blocks_capacity") and prom.query("blindfold_store_blocks_used"),
                    15, 0.5):
        die("the gateway exports no blindfold_store_blocks_used and blindfold_store_blocks_capacity: "
            "the store gauges are not in this build, so the store-full alert cannot fire")
    firing = wait_for(lambda: prom.alert_state("BlindfoldStoreNearlyFull") == "firing", 20, 0.5)
    ratio = prom.query("blindfold_store_blocks_used / blindfold_store_blocks_capacity")
    expect(firing, f"BlindfoldStoreNearlyFull is {prom.alert_state('BlindfoldStoreNearlyFull')} 20 s after "
                   f"the store filled (used / capacity: {ratio})")


def gateway_down(prom, gw):
    rc = gw.stop()
    expect(rc == 0, f"the gateway exited with status {rc}")
    expect(wait_for(lambda: prom.alert_state("BlindfoldDown") == "firing", 20, 0.5),
           f"BlindfoldDown is {prom.alert_state('BlindfoldDown')} 20 s after the gateway stopped")


def gateway_config(work):
    """The configuration file a team writes (deploy/README.md): an admin listener and a token."""
    path = os.path.join(work, "blindfold.toml")
    with open(path, "w") as f:
        f.write(f'admin-listen = "127.0.0.1:0"\nadmin-token = "{ADMIN_TOKEN}"\nlog = "warn"\n')
    os.chmod(path, 0o600)
    return path


def deploy(run_):
    p = run_.pass_("deploy", "deploy/: promtool, systemd-analyze, a live Prometheus scraping a gateway")
    ctx = run_.ctx
    work = p.dir("static")
    p.check("promtool check rules deploy/prometheus/alerts.yml", rules_check, ctx)
    p.check("promtool test rules deploy/prometheus/alerts_test.yml (each alert firing and quiet)", rules_test, ctx)
    p.check("promtool check config deploy/prometheus/prometheus.yml (its files in place)",
            scrape_config_check, ctx, work)
    p.check("systemd-analyze verify deploy/blindfold.service (ExecStart at the binary under test), no warnings",
            unit_verify, ctx, work)
    p.check("systemd-analyze security deploy/blindfold.service: exposure at most 2.0", unit_security, ctx, work)
    p.check("the unit's serve flags exist", unit_command_line, ctx, work)
    p.check("every system call of a gateway under strace (TLS start, S3 traffic, SIGHUP, stop) passes the unit's "
            "SystemCallFilter=", unit_syscalls, ctx, work)

    live = p.dir("prometheus")
    t0 = time.monotonic()
    # A tiny store: a few 64 KiB uploads fill it.
    gw = Gateway(ctx, "deploy", capacity="1MiB", flags=["--config", gateway_config(live)])
    if not p.check("start blindfold serve from a configuration file with an admin token", gw.start):
        return
    prom = Prometheus(live, gw.admin.split("://", 1)[1], fast_rules(ctx, live))
    try:
        if not p.check("start prometheus on 127.0.0.1", prom.start):
            return
        if p.check("Prometheus scrapes the gateway (/api/v1/targets, /api/v1/query) and loads the 6 rules, "
                   "none active but the data-disk alert exactly when this machine's disk has < 10 % free",
                   scraped, prom):
            if p.check("boto3 fills the 1 MiB store until the gateway refuses an upload", store_fills, prom, gw):
                p.check("BlindfoldStoreNearlyFull fires on the full store (/api/v1/alerts)", store_alert, prom)
            p.check("BlindfoldDown fires once the gateway stops", gateway_down, prom, gw)
    finally:
        prom.stop()
        if gw.running():
            gw.stop()
    print(f"  live Prometheus check: {time.monotonic() - t0:.0f} s", flush=True)
