"""Checks that belong to one target (HTTPS, the partition engines, the node cluster) and the
extras that run beside the client matrix (users, the admin listener under load, growth,
`blindfold report --quick`, the crash loop).

Target hooks take the `Pass` and the running `Gateway`; extras take the `Run`
(suite.py) and start their own gateways.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import ssl
import sys
import subprocess
import threading
import time

from clients import AwsFlow, ResticFlow, aws_cmd, boto3_client, http
from deployment import deploy
from gateway import Cluster, Gateway
from harness import (die, expect, gen_tree, rand_file, read, run, same_file, same_tree, spawn, forget,
                     wait_for, watch_pid_file)


# =============================================================================================
# HTTPS (serve --tls self-signed)
def fingerprint(pem):
    der = ssl.PEM_cert_to_DER_cert(pem if isinstance(pem, str) else pem.decode())
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def tls_banner(p, gw):
    banner = gw.banner()
    expect(re.search(r"^blindfold .*serving S3 at https://", banner, re.M), "the banner does not say https")
    m = re.search(r"^  TLS: .* \(SHA-256 ([0-9A-F:]*)\)$", banner, re.M)
    want = fingerprint(read(gw.ca))
    expect(m and m.group(1) == want, f"banner fingerprint {m and m.group(1)!r}, the certificate's {want!r}")
    mode = os.stat(os.path.join(os.path.dirname(gw.ca), "key.pem")).st_mode & 0o777
    expect(mode == 0o600, f"key.pem is mode {mode:o}, not 600")
    code, body, _ = http(f"{gw.admin}/healthz", ca=gw.ca)
    expect(code == 200 and b"ok" in body, f"admin /healthz over HTTPS: {code} {body[:100]!r}")
    # The Swift example works as printed: it names the certificate to trust.
    expect(f"e.g. swift --os-cacert {gw.ca} -A https://" in banner, f"the Swift example lacks --os-cacert: {banner}")


def tls_plain_refused(p, gw):
    plain = gw.endpoint.replace("https:", "http:", 1)
    code, body, _ = http(f"{plain}/")
    expect(code == 400, f"plain HTTP on the HTTPS port got HTTP {code}, expected 400")
    expect(b"https://" in body, f"the 400 does not say to use https://: {body[:200]!r}")
    # The aws CLI shows the reason (it reads S3's XML errors), not a bare "400 Bad Request".
    r = run(["aws", "--endpoint-url", plain, "s3", "ls"], env=gw.client_env(AWS_MAX_ATTEMPTS="1"), ok=False)
    expect(r.returncode != 0 and "This port serves HTTPS" in r.stderr, f"the aws CLI does not show why: {r.stderr}")
    # Without trusting the certificate (the system's CAs only), clients refuse the gateway.
    try:
        http(f"{gw.endpoint}/", context=ssl.create_default_context())
    except (ssl.SSLError, OSError) as e:
        if "CERTIFICATE_VERIFY_FAILED" not in str(e) and "certificate" not in str(e).lower():
            die(f"refused, but not for the certificate: {e}")
    else:
        die("a client that does not trust the self-signed certificate accepted it")


def served_fingerprint(gw):
    host, port = gw.hostport.rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    import socket

    with socket.create_connection((host, int(port)), timeout=10) as s, ctx.wrap_socket(s) as t:
        return fingerprint(ssl.DER_cert_to_PEM_cert(t.getpeercert(binary_form=True)))


def tls_reload(p, gw):
    d = os.path.dirname(gw.ca)
    w = p.dir("renewal")
    rand_file(f"{w}/object", 3000)
    aws_cmd(gw, "s3", "mb", "s3://e2e-tls-reload")
    aws_cmd(gw, "s3", "cp", f"{w}/object", "s3://e2e-tls-reload/dir/object")
    # A new certificate written over the files (as a renewal would), then SIGHUP.
    run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=renewed", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", f"{w}/key.pem", "-out", f"{w}/cert.pem"])
    for name in ("key.pem", "cert.pem"):
        with open(f"{d}/{name}", "wb") as f:
            f.write(read(f"{w}/{name}"))
    new = fingerprint(read(f"{w}/cert.pem"))
    gw.signal(signal.SIGHUP)
    served = wait_for(lambda: served_fingerprint(gw) == new, 5)
    expect(served, f"after SIGHUP the server presents {served_fingerprint(gw)}, not the new {new}")
    expect("SIGHUP: reloaded the certificate" in gw.stderr(), "no reload message")

    def read_back():  # a client that trusts only the renewed certificate
        env = gw.client_env(AWS_CA_BUNDLE=f"{w}/cert.pem")
        out = run(["aws", "--ca-bundle", f"{w}/cert.pem", "--endpoint-url", gw.endpoint, "s3", "ls",
                   "s3://e2e-tls-reload/dir/"], env=env).stdout
        expect(re.search(r" 3000 object$", out, re.M), f"listing with the renewed certificate: {out}")
        run(["aws", "--ca-bundle", f"{w}/cert.pem", "--endpoint-url", gw.endpoint, "s3", "cp",
             "s3://e2e-tls-reload/dir/object", f"{w}/object.back"], env=env)
        same_file(f"{w}/object", f"{w}/object.back")

    read_back()
    # A broken file: the reload is refused and the renewed certificate stays.
    with open(f"{d}/key.pem", "w") as f:
        f.write("broken\n")
    gw.signal(signal.SIGHUP)
    expect(wait_for(lambda: "certificate not reloaded" in gw.stderr(), 5), "a broken key was not reported")
    expect(served_fingerprint(gw) == new, "the renewed certificate was not kept")
    read_back()


# =============================================================================================
# The partition engines (ObliviStore, CURIOUS over levelled and over Path ORAM partitions) and
# the tee engine: a SIGKILL after uploads, then every acknowledged object reads back; after the
# clean stop, an offline growth and a recovery from the store and the key alone.
PART_OBJECTS = range(1, 7)


def part_put(p, gw):
    d = p.dir("killed")
    aws_cmd(gw, "s3", "mb", "s3://e2e-os")
    for i in PART_OBJECTS:
        rand_file(f"{d}/o{i}", i * 70000)
        aws_cmd(gw, "s3", "cp", f"{d}/o{i}", f"s3://e2e-os/o{i}")


def part_read_back(p, gw):
    d = p.dir("killed")
    for i in PART_OBJECTS:
        aws_cmd(gw, "s3", "cp", f"s3://e2e-os/o{i}", f"{d}/o{i}.back")
        same_file(f"{d}/o{i}", f"{d}/o{i}.back")


def part_kill_restart(p, gw):
    if not p.check("uploads before a SIGKILL", part_put, p, gw):
        return
    gw.kill()
    if p.check("restart after the SIGKILL", gw.start):
        p.check("every acknowledged object reads back after the SIGKILL", part_read_back, p, gw)


def part_grow_recover(p, gw):
    out = gw.ctx.blindfold("grow", "--data-dir", gw.data_dir, "--capacity", "128MiB").stdout
    expect("grew the store from 64 MiB to 128 MiB" in out, f"grow: {out}")
    rec = gw.data_dir + "-rec"
    key = os.path.join(gw.data_dir, "key.json")
    out = gw.ctx.blindfold("recover", "--data-dir", rec, "--store", f"file://{gw.data_dir}/cells",
                           "--key-file", key).stdout
    expect(re.search(rf"OK: start it with .*--key-file {re.escape(key)}", out), f"recover: {out}")
    g2 = Gateway(gw.ctx, gw.name + "-rec", data_dir=rec, capacity="128MiB", flags=["--key-file", key])
    g2.start()
    try:
        part_read_back(p, g2)
    finally:
        rc = g2.stop()
    expect(rc == 0, f"the recovered gateway exited with status {rc} on SIGTERM")


def part_after_stop(p, gw):
    p.check("blindfold grow to 128 MiB, blindfold recover into a new directory, every object reads back",
            part_grow_recover, p, gw)


def enclave_rotate(p, gw):
    enclave = gw.enclave
    if not gw.start():
        die("the gateway did not start")
    try:
        part_put(p, gw)
    finally:
        expect(gw.stop() == 0, "the gateway did not stop cleanly")
    key = os.path.join(gw.data_dir, "key.json")
    old = open(key, "rb").read()
    out = gw.ctx.blindfold("rotate-key", "--data-dir", gw.data_dir).stdout
    expect("blindfold enclave-key --key-file" in out, f"rotate-key does not say how to re-key the enclave: {out}")
    new_tee = os.path.join(enclave.dir, "tee-next.key")
    gw.ctx.blindfold("enclave-key", "--key-file", key + ".next", "--out", new_tee)
    enclave.restart(new_tee)
    if not gw.start():
        die("the gateway did not start under the new key")
    try:
        expect(wait_for(lambda: open(key, "rb").read() != old, 120, 0.2), "the rotation did not finish")
        part_read_back(p, gw)
    finally:
        expect(gw.stop() == 0, "the gateway did not stop cleanly after the rotation")
    out = gw.verify()
    expect("OK:" in out, f"verify after the rotation: {out}")
    retired = os.path.join(enclave.dir, "retired-key.json")
    with open(retired, "wb") as f:
        f.write(old)
    os.chmod(retired, 0o600)
    r = gw.ctx.blindfold("verify", "--data-dir", gw.data_dir, "--key-file", retired, ok=False)
    expect(r.returncode != 0, f"the retired key still opens the data directory: {r.stdout}")


# =============================================================================================
# Distributed mode: two `blindfold node` processes behind `serve --nodes`.
def nodes_list(p, gw):
    d = p.dir("nodes-list")
    b = "s3://e2e-nodes"
    aws_cmd(gw, "s3", "mb", b)
    rand_file(f"{d}/obj", 50000)
    aws_cmd(gw, "s3", "cp", f"{d}/obj", f"{b}/a/one.bin")
    aws_cmd(gw, "s3", "cp", f"{d}/obj", f"{b}/a/two.bin")
    out = aws_cmd(gw, "s3", "ls", "--recursive", f"{b}/").stdout
    expect(len(re.findall(r" 50000 a/(one|two)\.bin$", out, re.M)) == 2, f"'aws s3 ls' does not list both: {out}")
    aws_cmd(gw, "s3", "cp", f"{b}/a/two.bin", f"{d}/obj.back")
    same_file(f"{d}/obj", f"{d}/obj.back")
    aws_cmd(gw, "s3", "rm", "--recursive", b)
    aws_cmd(gw, "s3", "rb", b)


def nodes_grow(p, gw):
    d = p.dir("nodes-grow")
    b = "s3://e2e-nodes-grow"
    aws_cmd(gw, "s3", "mb", b)
    rand_file(f"{d}/obj", 300000)
    aws_cmd(gw, "s3", "cp", f"{d}/obj", f"{b}/before")
    before = [node_blocks(gw, i) for i in (1, 2)]
    # The gateway is running: it grows while it serves, and its nodes grow their own trees.
    out = gw.ctx.blindfold("grow", "--data-dir", gw.data_dir, "--capacity", "64MiB").stdout
    expect("grew the store from 32 MiB to 64 MiB" in out and "in place" in out, f"grow: {out}")
    after = [node_blocks(gw, i) for i in (1, 2)]
    expect(all(a > b for a, b in zip(after, before)), f"the nodes did not grow: {before} -> {after}")
    aws_cmd(gw, "s3", "cp", f"{b}/before", f"{d}/before.back")
    same_file(f"{d}/obj", f"{d}/before.back")
    # The new capacity holds more than the old one did.
    rand_file(f"{d}/big", 40 * 1024 * 1024)
    aws_cmd(gw, "s3", "cp", f"{d}/big", f"{b}/big")
    aws_cmd(gw, "s3", "cp", f"{b}/big", f"{d}/big.back")
    same_file(f"{d}/big", f"{d}/big.back")
    aws_cmd(gw, "s3", "rm", "--recursive", b)
    aws_cmd(gw, "s3", "rb", b)


def node_blocks(gw, i):
    with open(os.path.join(gw.nodes.dir, f"n{i}", "gateway.json")) as f:
        return json.load(f)["blocks"]


def nodes_after_clients(p, gw):
    p.check("aws puts, lists and gets objects", nodes_list, p, gw)
    p.check("blindfold grow 32 → 64 MiB while serving: both nodes (ObliviStore, TaoStore) grow their "
            "own trees, a 40 MiB object fits, every object reads back", nodes_grow, p, gw)


def nodes_after_stop(p, gw):
    cluster = gw.nodes
    urls = cluster.urls
    cluster.urls = list(reversed(urls))
    try:
        if not p.check("restart with the nodes in another order", gw.start):
            return
        p.check("after the restart: aws mb, cp, ranged get, sync a tree, rm, rb", AwsFlow(p, gw).short)
        rc = gw.stop()
        p.check("clean exit on SIGTERM after the restart", lambda: expect(rc == 0, f"exit status {rc}"))
        p.check("blindfold grow of the stopped gateway, through its nodes (--nodes, --tls-dir)",
                nodes_grow_stopped, p, gw)
    finally:
        cluster.urls = urls


def nodes_grow_stopped(p, gw):
    r = gw.ctx.blindfold("grow", "--data-dir", gw.data_dir, "--capacity", "96MiB", ok=False)
    expect(r.returncode != 0 and "--nodes" in r.stdout + r.stderr,
           f"grow without --nodes: unclear error: {r.stdout} {r.stderr}")
    out = gw.ctx.blindfold("grow", "--data-dir", gw.data_dir, "--capacity", "96MiB",
                           "--nodes", ",".join(gw.nodes.urls), "--tls-dir", gw.nodes.balancer_tls).stdout
    expect("grew the store from 64 MiB to 96 MiB" in out and "in place" in out, f"grow: {out}")


def nodes_verify(p, gw):
    # Without the nodes, a clear refusal.
    r = gw.ctx.blindfold("verify", "--data-dir", gw.data_dir, ok=False)
    expect(r.returncode != 0, f"verify without --nodes succeeded: {r.stdout}")
    expect("--nodes" in r.stdout + r.stderr, f"verify without --nodes: unclear error: {r.stderr}")
    out = gw.verify()
    expect("OK: every stored cell is authentic" in out, f"verify did not say OK: {out}")


# =============================================================================================
# Extras: each starts its own gateway. `run` is the suite's Run (checks, context, work dir).
def users(run_):
    """Several users: `blindfold user` on the live server's data directory, the aws CLI as each."""
    p = run_.pass_("users", "several users (blindfold user …, the aws CLI as each)")
    gw = Gateway(run_.ctx, "users", capacity="16MiB")
    if not p.check("start blindfold serve", gw.start):
        return
    p.check("policies enforced (buckets, read-only, copy source), listings filtered, rotate and remove live",
            users_policy, p, gw)
    p.stop_and_verify(gw)


def users_policy(p, gw):
    d = p.dir("files")
    aak, ask = gw.user_add("alice", "--buckets", "e2e-team-*")
    bak, bsk = gw.user_add("bob", "--buckets", "e2e-team-shared", "--read-only")
    listing = gw.ctx.blindfold("user", "list", "--data-dir", gw.data_dir).stdout
    expect(re.search(r"^bob .*e2e-team-shared \(read only\)", listing, re.M), f"user list: {listing}")
    expect(ask not in listing, "user list shows a secret")
    time.sleep(1.2)  # the gateway looks at the users file once a second

    def as_(ak, sk, *args, ok=True):
        return aws_cmd(gw, *args, env=gw.client_env(AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk), ok=ok)

    def buckets(ak, sk):
        return [line.split()[-1] for line in as_(ak, sk, "s3", "ls").stdout.splitlines() if line.strip()]

    aws_cmd(gw, "s3", "mb", "s3://e2e-admin-only")
    rand_file(f"{d}/file", 12345)
    aws_cmd(gw, "s3", "cp", f"{d}/file", "s3://e2e-admin-only/secret")
    as_(aak, ask, "s3", "mb", "s3://e2e-team-shared")
    as_(aak, ask, "s3", "cp", f"{d}/file", "s3://e2e-team-shared/doc")
    as_(bak, bsk, "s3", "cp", "s3://e2e-team-shared/doc", f"{d}/file.back")
    same_file(f"{d}/file", f"{d}/file.back")
    # Outside a policy: AccessDenied, and nothing changes.
    r = as_(aak, ask, "s3", "cp", "s3://e2e-admin-only/secret", f"{d}/stolen", ok=False)
    expect(r.returncode != 0, "alice read a bucket outside her policy")
    expect(re.search("Forbidden|AccessDenied", r.stderr), f"alice's refusal: {r.stderr}")
    r = as_(bak, bsk, "s3", "cp", f"{d}/file", "s3://e2e-team-shared/new", ok=False)
    expect(r.returncode != 0, "read-only bob wrote")
    expect("AccessDenied" in r.stderr, f"bob's refusal: {r.stderr}")
    r = as_(aak, ask, "s3api", "copy-object", "--copy-source", "e2e-admin-only/secret", "--bucket",
            "e2e-team-shared", "--key", "stolen", ok=False)
    expect(r.returncode != 0, "alice copied from a bucket outside her policy")
    # Listings: each user sees only the buckets its policy covers.
    expect(buckets(aak, ask) == ["e2e-team-shared"], f"alice's bucket list: {buckets(aak, ask)}")
    expect(buckets(bak, bsk) == ["e2e-team-shared"], f"bob's bucket list: {buckets(bak, bsk)}")
    admin = buckets(gw.ctx.AK, gw.ctx.SK)
    expect("e2e-admin-only" in admin, f"the administrator's list: {admin}")
    # Rotation and removal take effect on the running gateway.
    out = gw.ctx.blindfold("user", "rotate", "alice", "--data-dir", gw.data_dir).stdout
    ask2 = re.search(r"^  secret key: (\S+)", out, re.M).group(1)
    gw.ctx.blindfold("user", "remove", "bob", "--data-dir", gw.data_dir)
    time.sleep(1.2)
    expect(as_(aak, ask, "s3", "ls", ok=False).returncode != 0, "alice's old secret still works")
    expect(buckets(aak, ask2) == ["e2e-team-shared"], "alice's new secret")
    r = as_(bak, bsk, "s3", "ls", ok=False)
    expect(r.returncode != 0, "removed bob still signs in")
    expect("InvalidAccessKeyId" in r.stderr, f"bob's refusal: {r.stderr}")
    as_(aak, ask2, "s3", "rm", "--recursive", "s3://e2e-team-shared")
    as_(aak, ask2, "s3", "rb", "s3://e2e-team-shared")
    aws_cmd(gw, "s3", "rb", "--force", "s3://e2e-admin-only")


def admin_probes(p, gw):
    code, body, _ = http(f"{gw.admin}/healthz")
    expect(code == 200 and b"ok" in body, f"/healthz answered {code} {body[:100]!r}")
    code, _, _ = http(f"{gw.admin}/metrics")
    expect(code == 401, f"/metrics without credentials got HTTP {code}, expected 401")
    import base64

    auth = base64.b64encode(f"{gw.ctx.AK}:{gw.ctx.SK}".encode()).decode()
    code, body, _ = http(f"{gw.admin}/metrics", headers={"Authorization": f"Basic {auth}"})
    expect(code == 200, f"/metrics with credentials got HTTP {code}")
    text = body.decode()
    expect(re.search(r"^blindfold_info\{", text, re.M), "no blindfold_info in /metrics")
    expect(re.search(r"^blindfold_store_requests_total", text, re.M), "no blindfold_store_requests_total in /metrics")


def observe(run_):
    """The admin listener under load: the soak (256 boto3 clients) with headless Chromium on
    the dashboard and the visualizer at the same time."""
    p = run_.pass_("observe", "admin listener under load (soak + browser)")
    ctx = run_.ctx
    gw = Gateway(ctx, "observe", capacity="64MiB")
    if not p.check("start blindfold serve", gw.start):
        return
    print(f"  admin: {gw.admin}", flush=True)
    run_.checks.check("admin: /healthz open, /metrics refused without credentials", admin_probes, p, gw)
    soak_out = os.path.join(p.dir("soak"), "soak.out")
    with open(soak_out, "w") as f:
        soak = spawn([sys.executable, os.path.join(ctx.root, "tests/e2e/soak.py"), "--endpoint", gw.endpoint,
                      "--admin", gw.admin, "--access-key", ctx.AK, "--secret-key", ctx.SK,
                      "--clients", os.environ.get("E2E_SOAK_CLIENTS", "256"),
                      "--seconds", os.environ.get("E2E_SOAK_SECONDS", "45"), "--max-rss-mib", "2048"],
                     stdout=f, stderr=subprocess.STDOUT, env=gw.client_env())
    time.sleep(3)
    # The soak runs for a fixed time, and the browser's last check (a live recording) may start
    # after it ended when Chromium is slow (CI on 2026-12-02: the window opened the second the
    # soak stopped and saw nothing). A trickle of our own requests lasts as long as the browser.
    trickle = Trickle(gw)
    trickle.start()
    chromium = os.environ.get("CHROMIUM") or "/usr/bin/chromium"
    try:
        run_.checks.ingest("browser", ["node", os.path.join(ctx.root, "tests/browser/check.mjs"), "--admin",
                                       gw.admin, "--user", ctx.AK, "--password", ctx.SK, "--out", ctx.artefacts,
                                       "--chromium", chromium], env=gw.client_env(), timeout=600)
    finally:
        trickle.stop.set()
        trickle.join(60)
    print(f"  browser screenshots: {ctx.artefacts}", flush=True)
    p.check(f"a trickle of PUTs and GETs beside the browser, each read checked ({trickle.requests} requests)",
            trickle.verdict)
    try:
        rc = soak.wait(int(os.environ.get("E2E_SOAK_SECONDS", "45")) + 600)
    except subprocess.TimeoutExpired:
        soak.kill()
        rc = soak.wait()
    forget(soak)
    run_.checks.ingest("soak", ["cat", soak_out])
    if rc != 0 and "\nFAIL - " not in "\n" + read(soak_out).decode("utf-8", "replace"):
        run_.checks.fail("soak", f"exited with status {rc} without reporting a failed check")
    p.stop_and_verify(gw)


class Trickle(threading.Thread):
    """One client that PUTs a small object and GETs it back every quarter second until stopped,
    checking each answer: load that lasts exactly as long as the browser's checks do."""

    def __init__(self, gw):
        super().__init__(daemon=True)
        self.gw = gw
        self.stop = threading.Event()
        self.requests = 0
        self.errors = []

    def run(self):
        s3 = boto3_client(self.gw)
        try:
            s3.create_bucket(Bucket="observe-trickle")
            n = 0
            while not self.stop.is_set():
                body = os.urandom(512 + n % 2048)
                s3.put_object(Bucket="observe-trickle", Key=f"k{n % 8}", Body=body)
                got = s3.get_object(Bucket="observe-trickle", Key=f"k{n % 8}")["Body"].read()
                self.requests += 2
                if got != body:
                    self.errors.append(f"k{n % 8}: read back {len(got)} bytes that differ from the {len(body)} written")
                n += 1
                self.stop.wait(0.25)
        except Exception as e:  # noqa: BLE001 - reported by verdict()
            self.errors.append(f"{type(e).__name__}: {e}")

    def verdict(self):
        expect(not self.is_alive(), "the trickle did not stop within 60 s")
        expect(not self.errors, "; ".join(self.errors[:3]))
        expect(self.requests > 0, "no request answered")


def grow(run_):
    """Growing the store (blindfold grow, serve --grow-at) while the aws CLI keeps using it."""
    p = run_.pass_("grow", "growing the store while it serves (blindfold grow, serve --grow-at)")
    gw = Gateway(run_.ctx, "grow", capacity="2MiB")
    if not p.check("start blindfold serve on a 2 MiB store", gw.start):
        return
    g = GrowFlow(p, gw)
    p.check("aws CLI fills a 2 MiB store; blindfold grow to 4 MiB while it serves; more uploads; all read back; "
            "shrinking refused", g.live)
    rc = gw.stop()
    p.check("clean exit on SIGTERM", lambda: expect(rc == 0, f"exit status {rc}"))
    if not p.check("restart with --grow-at 60", gw.start, ["--grow-at", "60"]):
        return
    p.check("serve --grow-at 60 grows a 4 MiB store past 60 % to 8 MiB by itself; uploads go on; all read back",
            g.auto)
    p.stop_and_verify(gw, "after the growths")


class GrowFlow:
    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("files")
        self.names = []

    def put(self, name):
        rand_file(f"{self.d}/{name}", 262144)
        r = aws_cmd(self.gw, "s3", "cp", f"{self.d}/{name}", f"s3://e2e-grow/{name}", ok=False)
        if r.returncode == 0:
            self.names.append(name)
        return r

    def all_back(self):
        for name in self.names:
            aws_cmd(self.gw, "s3", "cp", f"s3://e2e-grow/{name}", f"{self.d}/back")
            same_file(f"{self.d}/{name}", f"{self.d}/back")

    def capacity(self):
        pj = json.loads(read(os.path.join(self.gw.data_dir, "gateway.json")))
        return pj["blocks"] * pj["block_size"]

    def live(self):
        aws_cmd(self.gw, "s3", "mb", "s3://e2e-grow")
        err = ""
        for i in range(100):
            r = self.put(f"f{i}")
            if r.returncode != 0:
                err = r.stderr
                break
        n = len(self.names)
        expect(4 <= n < 100, f"the 2 MiB store took {n} files of 256 KiB before it was full")
        expect("blindfold grow" in err, f"the full store's error does not say how to grow it: {err}")
        out = self.gw.ctx.blindfold("grow", "--data-dir", self.gw.data_dir, "--capacity", "4MiB").stdout
        expect("grew the store from 2 MiB to 4 MiB" in out, f"unexpected output: {out}")
        expect(self.capacity() == 4 << 20, f"gateway.json says {self.capacity()} bytes")
        for j in range(6):
            r = self.put(f"g{j}")
            expect(r.returncode == 0, f"upload g{j} after the growth failed: {r.stderr}")
        self.all_back()
        r = self.gw.ctx.blindfold("grow", "--data-dir", self.gw.data_dir, "--capacity", "1MiB", ok=False)
        expect(r.returncode != 0, f"shrinking was accepted: {r.stdout}")
        expect("shrinking is not supported" in r.stdout + r.stderr, f"unclear refusal: {r.stderr}")

    def auto(self):
        # Restarted with --grow-at 60: already past 60 %, it grows to 8 MiB within seconds.
        expect(wait_for(lambda: "grew automatically at 60% full" in self.gw.stderr(), 20, 0.2),
               "no automatic growth within 20 s")
        expect(self.capacity() == 8 << 20, f"gateway.json says {self.capacity()} bytes")
        for j in range(8):
            r = self.put(f"h{j}")
            expect(r.returncode == 0, f"upload h{j} after the automatic growth failed: {r.stderr}")
        self.all_back()


def report(run_):
    """`blindfold report --quick`: every experiment of the thesis at toy sizes, against the
    tests' MinIO (the private cloud and the git workload) when there is one."""
    p = run_.pass_("report", "blindfold report --quick (workloads A-E in both topologies, the git workload)")
    p.check("--quick writes the Markdown report, its plots and JSON, the thesis's figures beside ours",
            report_quick, p)


def report_quick(p):
    ctx = p.run.ctx
    out = p.dir("out")
    s3 = []
    if os.environ.get("BLINDFOLD_TEST_S3_ENDPOINT"):
        s3 = ["--s3", f"s3://{os.environ['BLINDFOLD_TEST_S3_BUCKET']}/e2e-report"
                      f"?endpoint={os.environ['BLINDFOLD_TEST_S3_ENDPOINT']}"]
    # The tests' MinIO keeps its own credentials (the caller's environment, not the clients').
    env = dict(os.environ)
    run([ctx.bin, "report", "--quick", "--quiet", "--out", out, *s3], env=env, timeout=900)
    run([sys.executable, os.path.join(ctx.root, "tests/e2e/check_report.py"), out, "--git" if s3 else "--no-git"])


def crash(run_):
    """The crash loop: kill -9 under concurrent writes (crash_loop.py's docstring has the model),
    20 rounds on local files; then three loops reading ahead of the log that lose the data
    directory with every kill (`crash-store` has the other loops that do)."""
    run_.pass_("crash", "crash loop (kill -9 under concurrent writes)")
    ctx, checks = run_.ctx, run_.checks
    script = os.path.join(ctx.root, "tests/e2e/crash_loop.py")
    checks.ingest("crash-self-test", [sys.executable, script, "--self-test"], env=ctx.env)
    pid_file = os.path.join(ctx.work, "crash.pid")
    watch_pid_file(pid_file)
    seed = os.environ.get("E2E_CRASH_SEED")
    checks.ingest("crash", [sys.executable, script, "--bin", ctx.bin, "--work", os.path.join(ctx.work, "crash"),
                            "--pid-file", pid_file, "--rounds", os.environ.get("E2E_CRASH_ROUNDS", "20"),
                            "--rotate-every", os.environ.get("E2E_CRASH_ROTATE_EVERY", "6"),
                            "--grow-every", os.environ.get("E2E_CRASH_GROW_EVERY", "7"),
                            *(["--seed", seed] if seed else [])], env=ctx.env, timeout=900)
    # Reads ahead of the log: every recovery also rebuilds the tree into a new array (never
    # falling back to the old one), and the old array leaves the store.
    rounds, stores, store_env = store_crash_setup(ctx)
    ahead = {f"crash-ahead-{e}-{s[0]}": (e, s) for e, s in
             [("tao", stores[0]), ("path-oram", stores[0]), ("tao", stores[1 if len(stores) > 1 else 0])]}
    for name, (engine, (store_name, url)) in ahead.items():
        checks.ingest(name, [
            sys.executable, script, "--bin", ctx.bin, "--work", os.path.join(ctx.work, name),
            "--pid-file", pid_file, "--rounds", rounds, "--threads", "4", "--lease-ttl", "500ms",
            "--lose-data-dir", "--capacity", "32MiB", *(["--store", url(f"ahead-{engine}")] if url else []),
            "--serve-flag=--engine", f"--serve-flag={engine}", "--serve-flag=--reads-ahead-of-log",
            # On files, the rebuild gets less memory than the blocks in use: they wait on the disk.
            *(["--recover-flag=--rebuild-memory=1MiB"] if store_name == "files" else []),
            *(["--seed", seed] if seed else [])],
            env=store_env, timeout=900)


def store_crash_setup(ctx):
    """What the loops that lose the data directory share: their rounds, the stores the test
    command started (files always; MinIO and Redis when it started them), and their
    environment (the MinIO store keeps its own credentials: ctx.env holds the gateway
    clients' keys instead)."""
    rounds = os.environ.get("E2E_CRASH_STORE_ROUNDS", "3")
    stamp = int(time.time())
    stores = [("files", None)]
    if os.environ.get("BLINDFOLD_TEST_S3_ENDPOINT"):
        stores.append(("minio", lambda e: f"s3://{os.environ['BLINDFOLD_TEST_S3_BUCKET']}/crash-{e}-{stamp}"
                                          f"?endpoint={os.environ['BLINDFOLD_TEST_S3_ENDPOINT']}"))
    if os.environ.get("BLINDFOLD_TEST_REDIS_URL"):
        stores.append(("redis", lambda e: f"{os.environ['BLINDFOLD_TEST_REDIS_URL']}?prefix=crash-{e}-{stamp}"))
    store_env = dict(ctx.env)
    store_env.update({k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if k in os.environ})
    return rounds, stores, store_env


def crash_store(run_):
    """The machine lost too: after each kill the data directory goes, and `blindfold recover`
    rebuilds it from the store alone (--durability store, checked against an --anchor); nothing
    acknowledged may be lost. Every engine on files, MinIO and Redis (when the test command
    started them), a few rounds each; the full matrix (20 rounds of every engine on every
    store) is tests/e2e/README.md's command."""
    run_.pass_("crash-store", "crash loop, machine lost (kill -9, data directory gone, recover from the store)")
    ctx, checks = run_.ctx, run_.checks
    script = os.path.join(ctx.root, "tests/e2e/crash_loop.py")
    pid_file = os.path.join(ctx.work, "crash-store.pid")
    watch_pid_file(pid_file)
    seed = os.environ.get("E2E_CRASH_SEED")
    rounds, stores, store_env = store_crash_setup(ctx)
    for engine in ["tao", "path-oram", "tee", "oblivistore", "curious", "curious-path"]:
        for store_name, url in stores:
            checks.ingest(f"crash-store-{engine}-{store_name}", [
                sys.executable, script, "--bin", ctx.bin,
                "--work", os.path.join(ctx.work, f"crash-store-{engine}-{store_name}"),
                "--pid-file", pid_file, "--rounds", rounds, "--threads", "4", "--lease-ttl", "500ms",
                "--lose-data-dir", "--capacity", "32MiB", *(["--store", url(engine)] if url else []),
                # The partition and tee engines take more than 4x their capacity in the store.
                "--serve-flag=--engine", f"--serve-flag={engine}", "--serve-flag=--allow-overhead",
                *(["--seed", seed] if seed else [])],
                env=store_env, timeout=900)


# =============================================================================================
# A node cluster under --durability store: the gateway's machine and a node's are lost at once.
def crash_nodes(run_):
    """Two `blindfold node`s and the gateway, each logging in its own store; both lost, both
    recovered from their stores alone (the node first, then the gateway over the nodes)."""
    p = run_.pass_("crash-nodes", "a cluster under --durability store loses the gateway's machine "
                   "and a node's at once")
    root = p.dir("crash-nodes")

    def node_flags(i):
        return ["--store", f"file://{root}/n{i}-store", "--key-file", f"{root}/n{i}-key.json",
                "--durability", "store", "--lease-ttl", "500ms"]

    cluster = Cluster(run_.ctx, os.path.join(root, "nodes"), node_flags=node_flags)
    gw = Gateway(run_.ctx, "crash-nodes", data_dir=os.path.join(root, "gw"), capacity="32MiB",
                 flags=["--store", f"file://{root}/gw-store", "--key-file", f"{root}/gw-key.json",
                        "--durability", "store", "--lease-ttl", "500ms"], nodes=cluster)
    try:
        if not p.check("two nodes and the gateway start, each with --durability store on its own store",
                       lambda: (cluster.start(), gw.start())):
            return
        p.check("aws puts, overwrites and deletes; kill -9 of the gateway and of node 1, both data "
                "directories gone; blindfold recover of node 1 from its store, then of the gateway "
                "over the nodes from its store: every acknowledged object reads back, the deleted one "
                "stays deleted", nodes_lost, p, gw, cluster, root)
        rc = gw.stop()
        p.check("the recovered gateway exits cleanly on SIGTERM", lambda: expect(rc == 0, f"exit status {rc}"))
    finally:
        gw.kill()
        cluster.stop()


def nodes_lost(p, gw, cluster, root):
    ctx, d, b = gw.ctx, p.dir("crash-nodes-files"), "s3://e2e-nodes-lost"
    aws_cmd(gw, "s3", "mb", b)
    files = {}
    for i in range(8):
        rand_file(f"{d}/o{i}", 20000 + 7919 * i)
        aws_cmd(gw, "s3", "cp", f"{d}/o{i}", f"{b}/o{i}")
        files[f"o{i}"] = f"{d}/o{i}"
    rand_file(f"{d}/o1.new", 33333)
    aws_cmd(gw, "s3", "cp", f"{d}/o1.new", f"{b}/o1")
    files["o1"] = f"{d}/o1.new"
    aws_cmd(gw, "s3", "rm", f"{b}/o2")
    del files["o2"]
    # Both machines are lost at once: no clean stop, data directories gone.
    gw.kill()
    cluster.kill(1)
    shutil.rmtree(gw.data_dir)
    shutil.rmtree(os.path.join(cluster.dir, "n1"))
    time.sleep(0.7)  # the leases lapse
    out = ctx.blindfold("recover", "--data-dir", os.path.join(cluster.dir, "n1"),
                        "--store", f"file://{root}/n1-store", "--key-file", f"{root}/n1-key.json").stdout
    expect("every acknowledged write is back" in out, f"recover of node 1: {out}")
    cluster.restart(1)
    out = ctx.blindfold("recover", "--data-dir", gw.data_dir, "--store", f"file://{root}/gw-store",
                        "--key-file", f"{root}/gw-key.json", "--nodes", ",".join(cluster.urls),
                        "--tls-dir", cluster.balancer_tls).stdout
    expect("every acknowledged write is back" in out, f"recover of the gateway: {out}")
    gw.start()
    listed = aws_cmd(gw, "s3", "ls", f"{b}/").stdout
    names = sorted(re.findall(r" (o\d)$", listed, re.M))
    expect(names == sorted(files), f"after recovery the bucket lists {names}, not {sorted(files)}")
    for name, f in files.items():
        aws_cmd(gw, "s3", "cp", f"{b}/{name}", f"{f}.back")
        same_file(f, f"{f}.back")


# =============================================================================================
# A full disk (serve --disk-reserve): reads go on, writes are refused clearly and resume by
# themselves, nothing is lost, and a start on the full disk works.
def disk_full(run_):
    """The data directory on a small tmpfs that another program fills while clients read."""
    p = run_.pass_("disk-full", "the data directory's disk fills up while it serves (a 48 MiB tmpfs)")
    root = p.dir("disk-full")
    mnt = os.path.join(root, "disk")
    os.makedirs(mnt, exist_ok=True)
    # Root mounts it; anyone else through sudo (as the test command installs packages).
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    r = run([*sudo, "mount", "-t", "tmpfs", "-o", f"size=48m,uid={os.geteuid()}", "tmpfs", mnt], ok=False)
    if r.returncode != 0:
        p.check("mount a 48 MiB tmpfs (root, or sudo without a password)",
                lambda: die(f"mount failed: {r.stderr.strip()}"))
        return
    try:
        DiskFull(p, Gateway(run_.ctx, "disk-full", data_dir=mnt, capacity="2MiB",
                            flags=["--disk-reserve", "4MiB"])).run()
    finally:
        run([*sudo, "umount", "-l", mnt], ok=False)


class DiskFull:
    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("disk-full-files")
        self.filler = os.path.join(gw.data_dir, "filler")
        self.acked = []

    def put(self, name, size=65536):
        rand_file(f"{self.d}/{name}", size)
        # One attempt: the gateway's answer is what is checked, not the CLI's retries.
        return aws_cmd(self.gw, "s3", "cp", f"{self.d}/{name}", f"s3://e2e-disk/{name}", ok=False,
                       env=self.gw.client_env(AWS_MAX_ATTEMPTS="1"))

    def put_ok(self, name):
        r = self.put(name)
        expect(r.returncode == 0, f"upload {name} failed: {r.stderr}")
        self.acked.append(name)

    def all_back(self):
        for name in self.acked:
            aws_cmd(self.gw, "s3", "cp", f"s3://e2e-disk/{name}", f"{self.d}/back")
            same_file(f"{self.d}/{name}", f"{self.d}/back")

    def fill(self):
        """Fills the disk to the last byte, as another program would."""
        # All the free space in one step, so the program stops before the gateway gives up its
        # reserve (a program that went on filling would take that too, and the gateway's logs
        # would wait for room, then stop it: nothing acknowledged is lost, see operations.md).
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            st = os.statvfs(self.gw.data_dir)
            have = os.fstat(fd).st_size
            os.posix_fallocate(fd, have, st.f_bavail * st.f_frsize)
        finally:
            os.close(fd)

    def refused_while_full(self, fill=True, seen=None):
        # Reads keep going while the disk fills (each one writes to the engine's log).
        stop, errors = threading.Event(), []

        def reader():
            while not stop.is_set():
                r = aws_cmd(self.gw, "s3", "cp", f"s3://e2e-disk/{self.acked[0]}", f"{self.d}/reader", ok=False)
                if r.returncode != 0:
                    errors.append(r.stderr)
        t = threading.Thread(target=reader)
        seen = len(self.gw.stderr()) if seen is None else seen
        t.start()
        try:
            if fill:
                self.fill()
            expect(wait_for(lambda: "nearly full" in self.gw.stderr()[seen:], 10, 0.2),
                   "the gateway did not say within 10 s that its disk is nearly full")
        finally:
            stop.set()
            t.join()
        expect(not errors, f"reads failed while the disk filled: {errors[:1]}")
        expect(self.gw.running(), "the gateway stopped when its disk filled")
        r = self.put("refused")
        expect(r.returncode != 0, "an upload was accepted on a full disk")
        expect("SlowDown" in r.stderr or "503" in r.stderr, f"not a 503 SlowDown: {r.stderr}")
        expect(self.gw.data_dir in r.stderr and "free at least" in r.stderr,
               f"the error does not name the disk and what to free: {r.stderr}")
        log = self.gw.stderr()
        expect(self.gw.data_dir in log and "free at least" in log, f"the log does not say what to free: {log[-800:]}")
        self.all_back()
        aws_cmd(self.gw, "s3", "ls", "s3://e2e-disk/")

    def resumes(self):
        seen = len(self.gw.stderr())
        os.remove(self.filler)
        expect(wait_for(lambda: "accepted again" in self.gw.stderr()[seen:], 10, 0.2),
               "writes did not resume within 10 s of the disk having room")
        for i in range(3):
            self.put_ok(f"after{i}")
        self.all_back()

    def run(self):
        p, gw = self.p, self.gw
        if not p.check("start blindfold serve --disk-reserve 4MiB on the tmpfs", gw.start):
            return
        aws_cmd(gw, "s3", "mb", "s3://e2e-disk")
        p.check("five uploads", lambda: [self.put_ok(f"before{i}") for i in range(5)])
        p.check("the disk fills while a client reads: reads go on, uploads get 503 SlowDown naming the "
                "disk and what to free, the log says the same", self.refused_while_full)
        p.check("the filler removed: uploads resume by themselves within seconds; every object reads back",
                self.resumes)
        rc = gw.stop()
        p.check("clean exit on SIGTERM", lambda: expect(rc == 0, f"exit status {rc}"))
        self.fill()
        seen = len(gw.stderr())
        if not p.check("a start on the full disk comes up", gw.start):
            return
        p.check("on the full disk after the restart: every object reads back, uploads refused",
                self.refused_while_full, fill=False, seen=seen)
        p.check("room again: uploads resume; every object reads back", self.resumes)
        p.stop_and_verify(gw, "after the full disk")


# =============================================================================================
def versions(run_):
    """Versioning, tagging, object lock, lifecycle and sharing with the aws CLI's s3api (issue 48)."""
    p = run_.pass_("versions", "versioning, tagging, object lock, lifecycle, sharing (aws s3api, restic)")
    # Lifecycle days of two seconds, applied every second, so that rules act within the test.
    gw = Gateway(run_.ctx, "versions", capacity="8MiB",
                 flags=["--lifecycle-day", "2s", "--lifecycle-every", "1s"])
    if not p.check("start blindfold serve", gw.start):
        return
    p.check("versioning: versions, delete marker, GET by version id, list-object-versions, suspend",
            versions_s3api, p, gw)
    p.check("tagging: put-object --tagging, put/get/delete-object-tagging per version, limits, bucket tags",
            tagging_s3api, p, gw)
    p.check("object lock: default and per-version retention, legal hold, deletes refused, bypass",
            object_lock_s3api, p, gw)
    p.check("lifecycle: rules set and read back, objects and old versions expire, header",
            lifecycle_s3api, p, gw)
    p.check("sharing: canned ACLs, a bucket policy, CORS preflight, SSE-C (s3api, unsigned HTTP)",
            sharing_s3api, p, gw)
    p.check("restic into an object-locked bucket: an attacker's deletes leave every version; restore",
            restic_locked, p, gw)
    p.stop_and_verify(gw)


def s3api_json(gw, *args):
    out = aws_cmd(gw, "s3api", *args).stdout
    return json.loads(out) if out.strip() else {}


def versions_s3api(p, gw):
    d, b = p.dir("versions"), "e2e-versions"
    s3api_json(gw, "create-bucket", "--bucket", b)
    s3api_json(gw, "put-bucket-versioning", "--bucket", b,
               "--versioning-configuration", "Status=Enabled")
    got = s3api_json(gw, "get-bucket-versioning", "--bucket", b)
    expect(got.get("Status") == "Enabled", f"get-bucket-versioning: {got}")
    ids = []
    for i in range(3):
        rand_file(f"{d}/v{i}", 1000 + i)
        r = s3api_json(gw, "put-object", "--bucket", b, "--key", "k", "--body", f"{d}/v{i}")
        expect(r.get("VersionId"), f"put-object answered no version id: {r}")
        ids.append(r["VersionId"])
    for i, vid in enumerate(ids):
        s3api_json(gw, "get-object", "--bucket", b, "--key", "k", "--version-id", vid, f"{d}/back{i}")
        same_file(f"{d}/v{i}", f"{d}/back{i}")
    r = s3api_json(gw, "delete-object", "--bucket", b, "--key", "k")
    expect(r.get("DeleteMarker") is True and r.get("VersionId"), f"delete-object: {r}")
    marker = r["VersionId"]
    r = aws_cmd(gw, "s3api", "head-object", "--bucket", b, "--key", "k", ok=False)
    expect(r.returncode != 0 and "404" in r.stderr + r.stdout, f"head after delete: {r.stderr}")
    lst = s3api_json(gw, "list-object-versions", "--bucket", b)
    got = [v["VersionId"] for v in lst.get("Versions", [])]
    expect(got == ids[::-1], f"versions {got}, wanted newest first {ids[::-1]}")
    markers = [(m["VersionId"], m["IsLatest"]) for m in lst.get("DeleteMarkers", [])]
    expect(markers == [(marker, True)], f"delete markers: {markers}")
    # Pages of one through the markers.
    seen, km, vm = [], None, None
    while True:
        args = ["list-object-versions", "--bucket", b, "--max-keys", "1", "--no-paginate"]
        if km:
            args += ["--key-marker", km, "--version-id-marker", vm]
        page = s3api_json(gw, *args)
        seen += [v["VersionId"] for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        if not page.get("IsTruncated"):
            break
        km, vm = page["NextKeyMarker"], page["NextVersionIdMarker"]
    expect(sorted(seen) == sorted(ids + [marker]), f"paged listing: {seen}")
    s3api_json(gw, "delete-object", "--bucket", b, "--key", "k", "--version-id", marker)
    s3api_json(gw, "get-object", "--bucket", b, "--key", "k", f"{d}/current")
    same_file(f"{d}/v2", f"{d}/current")
    s3api_json(gw, "put-bucket-versioning", "--bucket", b,
               "--versioning-configuration", "Status=Suspended")
    r = s3api_json(gw, "put-object", "--bucket", b, "--key", "k", "--body", f"{d}/v0")
    expect(r.get("VersionId", "null") == "null", f"suspended put: {r}")
    r = aws_cmd(gw, "s3api", "put-bucket-versioning", "--bucket", b, "--versioning-configuration",
                "Status=Enabled,MFADelete=Enabled", "--mfa", "arn:aws:iam::1:mfa/x 123456", ok=False)
    expect(r.returncode != 0 and "MFA" in r.stderr, f"MFA delete not refused: {r.stderr}")


def tagging_s3api(p, gw):
    d, b = p.dir("tagging"), "e2e-tagging"
    rand_file(f"{d}/f", 500)
    s3api_json(gw, "create-bucket", "--bucket", b)
    s3api_json(gw, "put-object", "--bucket", b, "--key", "k", "--body", f"{d}/f",
               "--tagging", "team=backup&year=2026")
    tags = s3api_json(gw, "get-object-tagging", "--bucket", b, "--key", "k")["TagSet"]
    expect(sorted((t["Key"], t["Value"]) for t in tags) == [("team", "backup"), ("year", "2026")],
           f"tags: {tags}")
    head = s3api_json(gw, "get-object", "--bucket", b, "--key", "k", f"{d}/back")
    expect(head.get("TagCount") == 2, f"get-object TagCount: {head}")
    eleven = ",".join(f"{{Key=k{i},Value=v}}" for i in range(11))
    r = aws_cmd(gw, "s3api", "put-object-tagging", "--bucket", b, "--key", "k",
                "--tagging", f"TagSet=[{eleven}]", ok=False)
    expect(r.returncode != 0 and "InvalidTag" in r.stderr, f"11 tags: {r.stderr}")
    s3api_json(gw, "put-object-tagging", "--bucket", b, "--key", "k", "--tagging",
               "TagSet=[{Key=a,Value=1}]")
    tags = s3api_json(gw, "get-object-tagging", "--bucket", b, "--key", "k")["TagSet"]
    expect(tags == [{"Key": "a", "Value": "1"}], f"replaced tags: {tags}")
    s3api_json(gw, "delete-object-tagging", "--bucket", b, "--key", "k")
    tags = s3api_json(gw, "get-object-tagging", "--bucket", b, "--key", "k")["TagSet"]
    expect(tags == [], f"deleted tags: {tags}")
    # Per version.
    s3api_json(gw, "put-bucket-versioning", "--bucket", b,
               "--versioning-configuration", "Status=Enabled")
    v1 = s3api_json(gw, "put-object", "--bucket", b, "--key", "v", "--body", f"{d}/f",
                    "--tagging", "n=1")["VersionId"]
    s3api_json(gw, "put-object", "--bucket", b, "--key", "v", "--body", f"{d}/f", "--tagging", "n=2")
    old = s3api_json(gw, "get-object-tagging", "--bucket", b, "--key", "v", "--version-id", v1)
    expect(old["TagSet"] == [{"Key": "n", "Value": "1"}] and old.get("VersionId") == v1,
           f"old version's tags: {old}")
    s3api_json(gw, "put-bucket-tagging", "--bucket", b, "--tagging", "TagSet=[{Key=env,Value=e2e}]")
    got = s3api_json(gw, "get-bucket-tagging", "--bucket", b)["TagSet"]
    expect(got == [{"Key": "env", "Value": "e2e"}], f"bucket tags: {got}")


def object_lock_s3api(p, gw):
    d, b = p.dir("lock"), "e2e-lock"
    rand_file(f"{d}/f", 700)
    s3api_json(gw, "create-bucket", "--bucket", b, "--object-lock-enabled-for-bucket")
    got = s3api_json(gw, "get-bucket-versioning", "--bucket", b)
    expect(got.get("Status") == "Enabled", f"a lock bucket is versioned: {got}")
    s3api_json(gw, "put-object-lock-configuration", "--bucket", b, "--object-lock-configuration",
               '{"ObjectLockEnabled":"Enabled","Rule":{"DefaultRetention":{"Mode":"GOVERNANCE","Days":1}}}')
    conf = s3api_json(gw, "get-object-lock-configuration", "--bucket", b)["ObjectLockConfiguration"]
    expect(conf["Rule"]["DefaultRetention"] == {"Mode": "GOVERNANCE", "Days": 1}, f"config: {conf}")
    v = s3api_json(gw, "put-object", "--bucket", b, "--key", "k", "--body", f"{d}/f")["VersionId"]
    head = s3api_json(gw, "head-object", "--bucket", b, "--key", "k")
    expect(head.get("ObjectLockMode") == "GOVERNANCE" and head.get("ObjectLockRetainUntilDate"),
           f"the default retention: {head}")
    r = aws_cmd(gw, "s3api", "delete-object", "--bucket", b, "--key", "k", "--version-id", v, ok=False)
    expect(r.returncode != 0 and "AccessDenied" in r.stderr and "GOVERNANCE" in r.stderr,
           f"a retained version was not protected: {r.stderr}")
    r = aws_cmd(gw, "s3api", "put-bucket-versioning", "--bucket", b,
                "--versioning-configuration", "Status=Suspended", ok=False)
    expect(r.returncode != 0 and "InvalidBucketState" in r.stderr, f"suspend: {r.stderr}")
    c = s3api_json(gw, "put-object", "--bucket", b, "--key", "c", "--body", f"{d}/f",
                   "--object-lock-mode", "COMPLIANCE",
                   "--object-lock-retain-until-date", "2099-01-01T00:00:00Z",
                   "--object-lock-legal-hold-status", "ON")["VersionId"]
    got = s3api_json(gw, "get-object-legal-hold", "--bucket", b, "--key", "c")["LegalHold"]
    expect(got == {"Status": "ON"}, f"legal hold: {got}")
    r = aws_cmd(gw, "s3api", "delete-object", "--bucket", b, "--key", "c", "--version-id", c,
                "--bypass-governance-retention", ok=False)
    expect(r.returncode != 0 and "legal hold" in r.stderr, f"a held version was not protected: {r.stderr}")
    s3api_json(gw, "put-object-legal-hold", "--bucket", b, "--key", "c", "--legal-hold", "Status=OFF")
    r = aws_cmd(gw, "s3api", "delete-object", "--bucket", b, "--key", "c", "--version-id", c,
                "--bypass-governance-retention", ok=False)
    expect(r.returncode != 0 and "COMPLIANCE" in r.stderr, f"compliance was bypassed: {r.stderr}")
    # The administrator may bypass GOVERNANCE retention.
    s3api_json(gw, "delete-object", "--bucket", b, "--key", "k", "--version-id", v,
               "--bypass-governance-retention")
    r = aws_cmd(gw, "s3api", "head-object", "--bucket", b, "--key", "k", "--version-id", v, ok=False)
    expect(r.returncode != 0, "the bypassed version is gone")


def lifecycle_s3api(p, gw):
    d, b = p.dir("lifecycle"), "e2e-lifecycle"
    rand_file(f"{d}/f", 300)
    s3api_json(gw, "create-bucket", "--bucket", b)
    s3api_json(gw, "put-bucket-versioning", "--bucket", b,
               "--versioning-configuration", "Status=Enabled")
    rules = {"Rules": [
        {"ID": "tmp", "Filter": {"Prefix": "tmp/"}, "Status": "Enabled", "Expiration": {"Days": 2}},
        {"ID": "old", "Filter": {"Prefix": "keep/"}, "Status": "Enabled",
         "NoncurrentVersionExpiration": {"NoncurrentDays": 1}}]}
    s3api_json(gw, "put-bucket-lifecycle-configuration", "--bucket", b,
               "--lifecycle-configuration", json.dumps(rules))
    got = s3api_json(gw, "get-bucket-lifecycle-configuration", "--bucket", b)["Rules"]
    expect(got == rules["Rules"], f"rules read back: {got}")
    r = s3api_json(gw, "put-object", "--bucket", b, "--key", "tmp/a", "--body", f"{d}/f")
    expect('rule-id="tmp"' in r.get("Expiration", ""), f"x-amz-expiration on PUT: {r}")
    old = s3api_json(gw, "put-object", "--bucket", b, "--key", "keep/a", "--body", f"{d}/f")["VersionId"]
    s3api_json(gw, "put-object", "--bucket", b, "--key", "keep/a", "--body", f"{d}/f")
    deadline = time.time() + 30
    while time.time() < deadline:
        lst = s3api_json(gw, "list-object-versions", "--bucket", b)
        keys = sorted((v["Key"], v["VersionId"]) for v in lst.get("Versions", []))
        markers = [m["Key"] for m in lst.get("DeleteMarkers", [])]
        if "tmp/a" in markers and all(vid != old for _, vid in keys):
            break
        time.sleep(1)
    expect("tmp/a" in markers, f"tmp/a did not expire: {lst}")
    expect(all(vid != old for _, vid in keys), f"the noncurrent version stayed: {keys}")
    expect(any(k == "keep/a" for k, _ in keys), f"the current keep/a went: {keys}")
    r = aws_cmd(gw, "s3api", "put-bucket-lifecycle-configuration", "--bucket", b,
                "--lifecycle-configuration",
                '{"Rules":[{"ID":"x","Filter":{},"Status":"Enabled","Expiration":{"Days":0}}]}', ok=False)
    expect(r.returncode != 0 and "InvalidArgument" in r.stderr, f"0 days: {r.stderr}")
    s3api_json(gw, "delete-bucket-lifecycle", "--bucket", b)
    r = aws_cmd(gw, "s3api", "get-bucket-lifecycle-configuration", "--bucket", b, ok=False)
    expect(r.returncode != 0 and "NoSuchLifecycleConfiguration" in r.stderr, f"deleted: {r.stderr}")


def restic_locked(p, gw):
    """A backup protected against whoever steals the backup's keys: restic writes into a bucket
    whose default retention is GOVERNANCE; deleting every object only adds delete markers, no
    version can be removed, and removing the markers brings the backup back."""
    b = "e2e-restic-lock"
    s3api_json(gw, "create-bucket", "--bucket", b, "--object-lock-enabled-for-bucket")
    s3api_json(gw, "put-object-lock-configuration", "--bucket", b, "--object-lock-configuration",
               '{"ObjectLockEnabled":"Enabled","Rule":{"DefaultRetention":{"Mode":"GOVERNANCE","Days":1}}}')
    r = ResticFlow(p, gw)
    r.env["RESTIC_REPOSITORY"] = f"s3:{gw.endpoint}/{b}"
    r.restic("init")
    gen_tree(f"{r.d}/src/data", big=False)
    r.restic("backup", "--host", "e2e", "data", cwd=f"{r.d}/src")
    # The attack: delete everything, then try to remove each version.
    aws_cmd(gw, "s3", "rm", f"s3://{b}", "--recursive")
    listed = s3api_json(gw, "list-object-versions", "--bucket", b)
    versions, markers = listed.get("Versions", []), listed.get("DeleteMarkers", [])
    expect(versions and len(markers) == len(versions), f"{len(versions)} versions, {len(markers)} markers")
    for v in versions[:5]:
        d = aws_cmd(gw, "s3api", "delete-object", "--bucket", b, "--key", v["Key"],
                    "--version-id", v["VersionId"], ok=False)
        expect(d.returncode != 0 and "AccessDenied" in d.stderr, f"a locked version went: {d.stderr}")
    # Recovery: remove the delete markers; restic sees its repository again.
    for m in markers:
        s3api_json(gw, "delete-object", "--bucket", b, "--key", m["Key"], "--version-id", m["VersionId"])
    # The lock file restic removed after its backup is back too (its marker went as well).
    r.restic("unlock", "--remove-all")
    r.restic("check")
    shutil.rmtree(f"{r.d}/restore", ignore_errors=True)
    r.restic("restore", "latest", "--target", f"{r.d}/restore")
    same_tree(f"{r.d}/src/data", f"{r.d}/restore/data")


def sharing_s3api(p, gw):
    d, b = p.dir("sharing"), "e2e-sharing"
    rand_file(f"{d}/f", 500)
    body = read(f"{d}/f")
    url = f"{gw.endpoint}/{b}"
    s3api_json(gw, "create-bucket", "--bucket", b)
    s3api_json(gw, "put-object", "--bucket", b, "--key", "open", "--body", f"{d}/f", "--acl", "public-read")
    s3api_json(gw, "put-object", "--bucket", b, "--key", "closed", "--body", f"{d}/f")
    status, got, _ = http(f"{url}/open", ca=gw.ca)
    expect(status == 200 and got == body, f"an unsigned GET of a public-read object: {status}")
    status, got, _ = http(f"{url}/closed", ca=gw.ca)
    expect(status == 403 and b"AccessDenied" in got, f"an unsigned GET of a private object: {status} {got[:200]}")
    status, _, _ = http(f"{url}/open", method="DELETE", ca=gw.ca)
    expect(status == 403, f"an unsigned DELETE: {status}")
    grants = s3api_json(gw, "get-object-acl", "--bucket", b, "--key", "open")["Grants"]
    expect(any(g["Grantee"].get("URI", "").endswith("AllUsers") for g in grants), f"grants: {grants}")
    r = aws_cmd(gw, "s3api", "put-bucket-acl", "--bucket", b, "--acl", "public-read-write", ok=False)
    expect(r.returncode != 0 and "AccessControlListNotSupported" in r.stderr, f"public-read-write: {r.stderr}")
    # A policy: everyone may read under pub/; nobody may delete under keep/, the admin included.
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{b}/pub/*"},
        {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject", "Resource": f"arn:aws:s3:::{b}/keep/*"}]}
    s3api_json(gw, "put-bucket-policy", "--bucket", b, "--policy", json.dumps(policy))
    got = json.loads(s3api_json(gw, "get-bucket-policy", "--bucket", b)["Policy"])
    expect(got == policy, f"the policy read back: {got}")
    status = s3api_json(gw, "get-bucket-policy-status", "--bucket", b)["PolicyStatus"]
    expect(status == {"IsPublic": True}, f"policy status: {status}")
    s3api_json(gw, "put-object", "--bucket", b, "--key", "pub/x", "--body", f"{d}/f")
    s3api_json(gw, "put-object", "--bucket", b, "--key", "keep/y", "--body", f"{d}/f")
    status, got, _ = http(f"{url}/pub/x", ca=gw.ca)
    expect(status == 200 and got == body, f"an unsigned GET the policy allows: {status}")
    r = aws_cmd(gw, "s3api", "delete-object", "--bucket", b, "--key", "keep/y", ok=False)
    expect(r.returncode != 0 and "AccessDenied" in r.stderr, f"a delete the policy denies: {r.stderr}")
    r = aws_cmd(gw, "s3api", "put-bucket-policy", "--bucket", b, "--policy",
                json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                                           "Resource": f"arn:aws:s3:::{b}/*",
                                           "Condition": {"Bool": {"aws:SecureTransport": "true"}}}]}), ok=False)
    expect(r.returncode != 0 and "MalformedPolicy" in r.stderr, f"a condition: {r.stderr}")
    s3api_json(gw, "delete-bucket-policy", "--bucket", b)
    s3api_json(gw, "delete-object", "--bucket", b, "--key", "keep/y")
    # CORS: a preflight from an allowed origin, and one from another.
    cors = {"CORSRules": [{"AllowedOrigins": ["https://app.example"], "AllowedMethods": ["GET"],
                           "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 60}]}
    s3api_json(gw, "put-bucket-cors", "--bucket", b, "--cors-configuration", json.dumps(cors))
    got = s3api_json(gw, "get-bucket-cors", "--bucket", b)
    expect(got.get("CORSRules") == cors["CORSRules"], f"cors read back: {got}")
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "GET"}
    status, _, h = http(f"{url}/open", method="OPTIONS", headers=pre, ca=gw.ca)
    expect(status == 200 and h.get("Access-Control-Allow-Origin") == "https://app.example",
           f"an allowed preflight: {status} {dict(h)}")
    status, _, h = http(f"{url}/open", method="OPTIONS", ca=gw.ca,
                        headers={**pre, "Origin": "https://evil.example"})
    expect(status == 403 and not h.get("Access-Control-Allow-Origin"), f"another origin: {status}")
    # SSE-C: the key on every read; SSE-KMS refused.
    key = base64.b64encode(bytes(range(32))).decode()
    md5 = base64.b64encode(hashlib.md5(bytes(range(32))).digest()).decode()
    ssec = ["--sse-customer-algorithm", "AES256", "--sse-customer-key", key, "--sse-customer-key-md5", md5]
    s3api_json(gw, "put-object", "--bucket", b, "--key", "ssec", "--body", f"{d}/f", *ssec)
    r = aws_cmd(gw, "s3api", "head-object", "--bucket", b, "--key", "ssec", ok=False)
    expect(r.returncode != 0, "an SSE-C object was read without its key")
    got = s3api_json(gw, "get-object", "--bucket", b, "--key", "ssec", *ssec, f"{d}/back")
    expect(got.get("SSECustomerKeyMD5") == md5 and read(f"{d}/back") == body, f"SSE-C read: {got}")
    r = aws_cmd(gw, "s3api", "put-object", "--bucket", b, "--key", "kms", "--body", f"{d}/f",
                "--server-side-encryption", "aws:kms", ok=False)
    expect(r.returncode != 0 and "SSE-KMS" in r.stderr, f"SSE-KMS: {r.stderr}")


EXTRAS = {"users": users, "observe": observe, "grow": grow, "report": report, "crash": crash, "crash-store": crash_store,
          "disk-full": disk_full, "deploy": deploy, "versions": versions, "crash-nodes": crash_nodes}
