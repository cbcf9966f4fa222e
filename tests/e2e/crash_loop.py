#!/usr/bin/env python3
"""Crash loop: kill -9 `blindfold serve` under concurrent writes, restart, check every acknowledged write.

Each round:

1. the server runs on the same data directory (started fresh in round 1, restarted after each
   kill);
2. several writer threads (boto3, one client each) PUT random objects of 0–300 KiB, overwrite
   keys, DELETE keys and read their own keys back, on keys private to the thread and on a few
   keys shared by all threads;
3. after a random 0.2–3 s (and at least one acknowledged write) the server gets SIGKILL in the
   middle of that traffic (every fifth round also kills it again while it is recovering);
4. after a restart every key is read back and must hold a value the acknowledged history
   allows.

What "allows" means (a register per key, checked for linearizability): every operation has a
start time (before the request is sent) and, if acknowledged, an end time (after the response
arrived). An operation X can be the key's final state unless some *acknowledged* operation Y on
the same key started after X ended. Unacknowledged operations (in flight at the kill, or failed)
never end, so they may or may not have landed. The state found at the previous check counts as an
operation that ended before the round began. So: the last acknowledged PUT reads back byte for
byte, an acknowledged DELETE stays deleted, and only an operation that was in flight (or
concurrent with the last acknowledged one) may replace them. Anything else, and any GET failing
with a server error (an integrity error), is a failure. The listing must match the keys found.

At the end `blindfold verify` runs on the crashed data directory (it recovers like a restart)
and, after a clean SIGTERM stop, once more; both must succeed.

Key rotations ride along (`--rotate-every N`): every N-th round runs `blindfold rotate-key` while
the server serves, so the following restarts re-seal the store while writers write and the kills
land in the middle of the sweep. At the end every rotation must have finished (the gateway is
run until it has), and `blindfold verify` with any retired key must be refused.

Growths ride along too (`--grow-every N`): every N-th round starts `blindfold grow` (by
`--grow-step-mib`) as the traffic starts, so the kill lands before, during or after the rebuild of
the tree; the next start finishes or redoes an interrupted growth, and every acknowledged write
must survive it. A request still unanswered when the loop ends (it waits behind a key rotation,
and a slow machine can cut every attempt short) is run to its end after the loop, and every key
must read as before. At the end the store must have grown.

The machine can be lost too (`--lose-data-dir`, with `--durability store` and an `--anchor` kept
beside the store, which every recover must find in agreement): after each kill the
data directory is deleted, and `blindfold recover` rebuilds a new one from the store and the key
alone (waiting for the dead gateway's lease to lapse) before the restart; every acknowledged write
must come back all the same. `--store URL` puts the store elsewhere (MinIO, Redis), `--serve-flag`
passes more flags to `serve` (`--serve-flag=--engine --serve-flag=tee`).

One `ok - …` or `FAIL - …: reason` line per round and per final check. Run by scripts/e2e.sh;
by hand: python3 tests/e2e/crash_loop.py --bin target/debug/blindfold --work /tmp/crash
"""

import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

AK = "crashaccesskey"
SK = "crash-secret-key-0123456789abcdefghijklmn"
BUCKET = "crash"
KB = 1024
INF = float("inf")

RESULTS = {"ok": 0, "fail": 0}


def report(ok, name, reason="", details=()):
    if ok:
        RESULTS["ok"] += 1
        print(f"ok - {name}", flush=True)
    else:
        RESULTS["fail"] += 1
        print(f"FAIL - {name}: {reason}", flush=True)
        for d in list(details)[:25]:
            print(f"    | {d}", flush=True)


def digest(b):
    return None if b is None else hashlib.sha256(b).hexdigest()[:16]


def short(d):
    return "absent" if d is None else d


class Server:
    def __init__(self, args):
        self.args = args
        self.proc = None
        self.endpoint = None
        self.log = open(os.path.join(args.work, "server.err"), "ab")

    def spawn(self):
        out = os.path.join(self.args.work, "server.out")
        with open(out, "wb") as f:
            self.proc = subprocess.Popen(
                [self.args.bin, "serve", *dir_flags(self.args), "--capacity", self.args.capacity,
                 "--listen", "127.0.0.1:0", "--access-key", AK, "--secret-key", SK, *self.args.serve_flag],
                stdout=f, stderr=self.log, stdin=subprocess.DEVNULL,
            )
        if self.args.pid_file:
            with open(self.args.pid_file, "w") as f:
                f.write(str(self.proc.pid))
        return out

    def start(self, timeout=120):
        out = self.spawn()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            with open(out, "rb") as f:
                for line in f.read().decode(errors="replace").splitlines():
                    # The banner: "blindfold <version> serving S3 at http://host:port".
                    if line.startswith("blindfold ") and " serving S3 at " in line:
                        self.endpoint = line.split()[-1]
                        return time.monotonic() - t0
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with status {self.proc.returncode} while starting; "
                                   f"see {self.log.name}")
            time.sleep(0.02)
        raise RuntimeError(f"server not ready after {timeout} s")

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc:
            self.proc.wait()

    def stop(self):
        """SIGTERM; returns the exit status (or None if it had to be killed)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill9()
            return None


def dir_flags(args):
    """The flags naming the data directory (and, when the machine can be lost, the key and the store
    that live outside it)."""
    flags = ["--data-dir", args.data_dir]
    if args.lose_data_dir:
        flags += ["--key-file", args.key_file, "--store", args.store, "--durability", "store",
                  "--lease-ttl", args.lease_ttl, "--anchor", args.anchor]
    return flags


def lose_and_recover(args, n):
    """The machine is lost: its data directory goes, and `blindfold recover` rebuilds a new one from
    the store and the key alone (retrying while the dead gateway's lease has not lapsed yet).
    Returns the seconds it took and what recover said."""
    shutil.rmtree(args.data_dir)
    args.data_dir = os.path.join(args.work, f"data-{n}")
    shutil.rmtree(args.data_dir, ignore_errors=True)
    t0 = time.monotonic()
    while True:
        p = subprocess.run([args.bin, "recover", *dir_flags(args), *args.recover_flag], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=600)
        if p.returncode == 0:
            about = next((l for l in p.stdout.splitlines() if "restored" in l), p.stdout.strip())
            # Every round's recovery is checked against the trusted anchor the gateway kept.
            if "the anchor at" not in p.stdout or "agrees" not in p.stdout:
                raise RuntimeError(f"blindfold recover did not check the anchor: {p.stdout.strip()[-600:]}")
            # A gateway that read ahead of the log must come back on a rebuilt tree: continuing
            # the old one would keep every write but not the access pattern.
            if "--reads-ahead-of-log" in args.serve_flag and "rebuilt with fresh leaves" not in p.stdout:
                raise RuntimeError(f"blindfold recover did not rebuild the tree: {p.stdout.strip()[-900:]}")
            # A rebuild whose blocks do not fit in its memory limit sets them aside, and says so.
            if any(f.startswith("--rebuild-memory") for f in args.recover_flag) and \
                    "rebuilt with fresh leaves" in p.stdout and "waited, sealed, on this disk" not in p.stdout:
                raise RuntimeError(f"the rebuild did not set blocks aside: {p.stdout.strip()[-900:]}")
            if os.path.exists(os.path.join(args.data_dir, "oram", "rebuild-aside")):
                raise RuntimeError("the rebuild left the blocks it set aside on the disk")
            return time.monotonic() - t0, about
        if "another gateway" not in p.stderr or time.monotonic() - t0 > 60:
            raise RuntimeError(f"blindfold recover failed: {p.stderr.strip()[-600:]}")
        shutil.rmtree(args.data_dir, ignore_errors=True)
        time.sleep(0.2)


def client(endpoint, read_timeout=30):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=AK,
        aws_secret_access_key=SK,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            signature_version="s3v4",
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=read_timeout,
            max_pool_connections=4,
        ),
    )


def random_size(rng):
    r = rng.random()
    if r < 0.08:
        return 0
    if r < 0.16:
        return rng.choice([1, 4095, 4096, 4097, 8192])
    if r < 0.55:
        return rng.randint(1, 16 * KB)
    return rng.randint(16 * KB, 300 * KB)


class Op:
    __slots__ = ("key", "kind", "digest", "start", "end", "thread", "error")

    def __init__(self, key, kind, dig, start, thread):
        self.key, self.kind, self.digest, self.start, self.thread = key, kind, dig, start, thread
        self.end = INF
        self.error = None

    def __repr__(self):
        end = "in flight" if self.end == INF else f"acked {self.end:.3f}"
        return f"{self.kind} {short(self.digest)} by t{self.thread} start {self.start:.3f} {end}"


class Round:
    def __init__(self, n, endpoint, model, args, seed):
        self.n = n
        self.endpoint = endpoint
        self.model = model  # key -> digest found at the last check (None: absent)
        self.args = args
        self.seed = seed
        self.ops = []  # every operation, in the order it started
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.kill_time = INF
        self.problems = []  # failures seen during traffic
        self.reads = 0

    def writer(self, t):
        rng = random.Random(self.seed * 1000 + t)
        s3 = client(self.endpoint)
        mine = [f"t{t}/k{i}" for i in range(self.args.private_keys)]
        shared = [f"shared/k{i}" for i in range(self.args.shared_keys)]
        # What this thread knows of its private keys (nobody else writes them).
        known = {k: self.model.get(k) for k in mine}
        seq = 0
        while not self.stop.is_set():
            seq += 1
            key = rng.choice(shared) if rng.random() < 0.25 else rng.choice(mine)
            r = rng.random()
            if key in known and r < 0.15:
                kind = "GET"
            elif r < 0.30:
                kind = "DELETE"
            else:
                kind = "PUT"
            if kind == "GET":
                try:
                    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
                    got = digest(body)
                except ClientError as e:
                    code = e.response.get("Error", {}).get("Code")
                    if code == "NoSuchKey":
                        got = None
                    elif time.monotonic() < self.kill_time:
                        self.problems.append(f"GET {key} failed before the kill: {code} {e}")
                        continue
                    else:
                        continue
                except Exception as e:  # noqa: BLE001 - connection errors after the kill
                    if time.monotonic() < self.kill_time and not self.stop.is_set():
                        self.problems.append(f"GET {key} failed before the kill: {type(e).__name__}: {e}")
                    continue
                self.reads += 1
                if got != known[key]:
                    self.problems.append(f"read-your-writes: GET {key} by its only writer returned {short(got)}, "
                                         f"expected {short(known[key])}")
                continue
            if kind == "PUT":
                size = random_size(rng)
                head = f"{key}|round {self.n}|t{t}|op {seq}|".encode()
                body = (head + rng.randbytes(max(0, size - len(head))))[:size] if size else b""
                op = Op(key, "PUT", digest(body), 0.0, t)
            else:
                body = None
                op = Op(key, "DELETE", None, 0.0, t)
            with self.lock:
                op.start = time.monotonic()
                self.ops.append(op)
            try:
                if kind == "PUT":
                    r = s3.put_object(Bucket=BUCKET, Key=key, Body=body)
                    want = '"%s"' % hashlib.md5(body).hexdigest()
                    if r.get("ETag") != want:
                        self.problems.append(f"PUT {key} ({len(body)} bytes): ETag {r.get('ETag')}, expected {want}; headers {r['ResponseMetadata'].get('HTTPHeaders')}")
                else:
                    s3.delete_object(Bucket=BUCKET, Key=key)
            except Exception as e:  # noqa: BLE001 - unacknowledged: stays in flight
                op.error = f"{type(e).__name__}: {e}"
                if time.monotonic() < self.kill_time and not self.stop.is_set():
                    self.problems.append(f"{kind} {key} failed before the kill: {op.error}")
                continue
            op.end = time.monotonic()
            if key in known:
                known[key] = op.digest

    def traffic(self, duration, server):
        threads = [threading.Thread(target=self.writer, args=(t,), daemon=True) for t in range(self.args.threads)]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        time.sleep(duration)
        # A round without an acknowledged write checks little: wait for one (a cold restart can
        # make the first PUTs slow), but not forever.
        deadline = time.monotonic() + 20
        while not any(op.end != INF for op in self.ops) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.kill_time = time.monotonic()
        self.stop.set()  # no new operations; those under way are cut by the kill
        server.kill9()
        for th in threads:
            th.join(timeout=60)
            if th.is_alive():
                self.problems.append("a writer thread did not stop within 60 s of the kill")
        return self.kill_time - t0

    def candidates(self):
        """key -> (set of allowed digests, explanation)."""
        by_key = {}
        for op in self.ops:
            by_key.setdefault(op.key, []).append(op)
        out = {}
        for key in set(self.model) | set(by_key):
            ops = by_key.get(key, [])
            acked_starts = [op.start for op in ops if op.end != INF]
            latest_acked_start = max(acked_starts, default=-INF)
            allowed = {op.digest for op in ops if not latest_acked_start > op.end}
            if not acked_starts:  # the state found at the last check may survive
                allowed.add(self.model.get(key))
            out[key] = (allowed, ops)
        return out


def check_state(server, rnd, allowed):
    """Reads every key and the listing; returns (observed model, problems, stats)."""
    s3 = client(server.endpoint, read_timeout=120)
    observed, problems = {}, []
    stats = {"keys": 0, "present": 0, "bytes": 0, "inflight_keys": 0}
    for key in sorted(allowed):
        ok_set, ops = allowed[key]
        stats["keys"] += 1
        if any(op.end == INF for op in ops):
            stats["inflight_keys"] += 1
        try:
            body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            got = digest(body)
            stats["present"] += 1
            stats["bytes"] += len(body)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code != "NoSuchKey":
                problems.append(f"GET {key}: {code} (HTTP {e.response['ResponseMetadata'].get('HTTPStatusCode')}) "
                                f"— integrity or server error: {e}")
                observed[key] = ("error", code)
                continue
            got = None
            body = None
        except Exception as e:  # noqa: BLE001
            problems.append(f"GET {key}: {type(e).__name__}: {e}")
            observed[key] = ("error", str(e))
            continue
        observed[key] = got
        if got not in ok_set:
            hint = ""
            if body:
                hint = f" (content header: {body[:60]!r})"
            hist = "; ".join(repr(op) for op in ops[-6:]) or "no operations this round"
            problems.append(f"{key}: found {short(got)}{hint}, allowed {sorted(map(short, ok_set))}; "
                            f"history: {hist}")
    # The listing must show exactly the keys that exist.
    try:
        listed, token = [], None
        while True:
            kw = {"Bucket": BUCKET, "MaxKeys": 100}
            if token:
                kw["ContinuationToken"] = token
            r = s3.list_objects_v2(**kw)
            listed += [(o["Key"], o["Size"]) for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                break
            token = r["NextContinuationToken"]
        present = {k for k, v in observed.items() if v is not None}
        listed_keys = {k for k, _ in listed}
        if listed_keys != present:
            problems.append(f"listing differs from GETs: only listed {sorted(listed_keys - present)[:10]}, "
                            f"only found by GET {sorted(present - listed_keys)[:10]}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"list_objects_v2: {type(e).__name__}: {e}")
    return observed, problems, stats


def capacity(args):
    import json
    with open(os.path.join(args.data_dir, "gateway.json")) as f:
        p = json.load(f)
    return p["blocks"] * p["block_size"]


def start_grow(args):
    """`blindfold grow` in the background (it asks the running gateway, which grows while the
    writers write); killed after the round if still waiting."""
    target = capacity(args) + args.grow_step_mib * KB * KB
    out = open(os.path.join(args.work, "grow.out"), "ab")
    print(f"    grow: asking for {target // (KB * KB)} MiB", flush=True)
    return subprocess.Popen([args.bin, "grow", "--data-dir", args.data_dir, "--capacity", str(target)],
                            stdout=out, stderr=out, stdin=subprocess.DEVNULL)


def wait_gone(path, t0, limit=600):
    """Waits until the running gateway has removed `path` (an answered request, a finished
    rotation), at most `limit` seconds after `t0`."""
    while os.path.exists(path) and time.monotonic() - t0 < limit:
        time.sleep(0.2)


def finish_growth(args, server, model):
    """A growth still asked for when the loop ends (it waited behind a key rotation, or every kill
    cut it short) is run to its end as an operator would: the gateway runs until it has answered.
    Then every key must still read as the last round left it. Returns the answer's message."""
    import json
    request = os.path.join(args.data_dir, "grow-request.json")
    if not os.path.exists(request):
        return None
    print("    grow: a growth was still asked for at the end of the loop: running the gateway until "
          "it has answered", flush=True)
    t0 = time.monotonic()
    server.start()
    wait_gone(request, t0)
    try:
        with open(os.path.join(args.data_dir, "grow-result.json")) as f:
            message = json.load(f).get("message", "?")
    except (OSError, ValueError) as e:
        message = f"no answer ({type(e).__name__}: {e})"
    allowed = {k: ({v}, []) for k, v in model.items()}
    _, problems, stats = check_state(server, None, allowed)
    if os.path.exists(request):
        problems.insert(0, "the gateway did not answer the growth request within 600 s")
    report(not problems, f"crash: the growth asked for during the loop finished after it "
           f"({time.monotonic() - t0:.1f} s: {message[:160]}); {stats['keys']} keys read as before",
           f"{len(problems)} problem(s)", problems)
    code = server.stop()
    report(code == 0, "crash: clean exit on SIGTERM after the growth", f"exit status {code}")
    return message


def run_verify(args, label):
    t0 = time.monotonic()
    p = subprocess.run([args.bin, "verify", *dir_flags(args)], capture_output=True, text=True,
                       timeout=600)
    lines = (p.stdout + p.stderr).strip().splitlines()
    name = f"crash: blindfold verify {label}"
    if p.returncode == 0 and any(line.strip().startswith("OK:") for line in lines):
        summary = "; ".join(line.strip() for line in lines[1:3])
        report(True, f"{name} ({summary}; {time.monotonic() - t0:.1f} s)")
    else:
        report(False, name, f"exit status {p.returncode}", lines[-20:])


def rotate_key(args, retired):
    """`blindfold rotate-key` on the live data directory; the current key is kept aside, as
    retired, once the rotation is prepared (it fails while another is under way)."""
    key = os.path.join(args.data_dir, "key.json")
    with open(key, "rb") as f:
        current = f.read()
    p = subprocess.run([args.bin, "rotate-key", "--data-dir", args.data_dir], capture_output=True,
                       text=True, timeout=60)
    if p.returncode == 0:
        path = os.path.join(args.work, f"retired-key-{len(retired) + 1}.json")
        with open(path, "wb") as f:
            f.write(current)
        retired.append(path)
        print(f"    rotate-key: prepared rotation {len(retired)}", flush=True)
    elif "already under way" not in p.stderr:
        report(False, "crash: blindfold rotate-key", f"exit status {p.returncode}", p.stderr.splitlines()[-5:])


def finish_rotation(args, server, retired):
    """Runs the gateway until no rotation is left, then stops it cleanly."""
    marker = os.path.join(args.data_dir, "rotation.sealed")
    t0 = time.monotonic()
    if os.path.exists(marker):
        server.start()
        wait_gone(marker, t0)
        server.stop()
    leftovers = [p for p in (marker, os.path.join(args.data_dir, "key.json.next")) if os.path.exists(p)]
    report(not leftovers, f"crash: {len(retired)} key rotation(s) finished across the kills "
           f"({time.monotonic() - t0:.1f} s after the loop)", "left behind", leftovers)


def refuse_retired_key(args, path):
    p = subprocess.run([args.bin, "verify", "--data-dir", args.data_dir, "--key-file", path],
                       capture_output=True, text=True, timeout=600)
    refused = p.returncode != 0 and "does not belong" in p.stderr
    report(refused, f"crash: a retired key ({os.path.basename(path)}) is refused",
           f"exit status {p.returncode}", (p.stdout + p.stderr).splitlines()[-5:])


def self_test():
    """The checker itself: histories whose allowed final states are known. Returns problems."""
    def op(key, kind, dig, start, end=INF):
        o = Op(key, kind, dig, start, 0)
        o.end = end
        return o

    rnd = Round(0, None, {"old": "A", "kept": "K", "gone": "G"}, None, 0)
    rnd.ops = [
        op("old", "PUT", "B", 1.0, 2.0),        # acknowledged: "A" must not come back
        op("k", "PUT", "X", 1.0, 2.0),
        op("k", "DELETE", None, 3.0, 4.0),      # acknowledged DELETE: stays deleted
        op("f", "PUT", "P", 1.0, 2.0),
        op("f", "PUT", "Q", 3.0),               # in flight at the kill: P or Q
        op("c", "PUT", "C1", 1.0, 3.0),
        op("c", "PUT", "C2", 2.0, 4.0),         # concurrent acknowledged PUTs: either
        op("c", "DELETE", None, 5.0),           # ... or the in-flight DELETE
        op("gone", "DELETE", None, 1.0),        # in flight only: G or deleted
    ]
    want = {
        "old": {"B"}, "k": {None}, "f": {"P", "Q"}, "c": {"C1", "C2", None},
        "kept": {"K"}, "gone": {"G", None},
    }
    got = {k: v[0] for k, v in rnd.candidates().items()}
    return [f"{k}: allowed {sorted(map(short, got.get(k, set())))}, expected {sorted(map(short, w))}"
            for k, w in want.items() if got.get(k) != w] + \
        [f"unexpected key {k}" for k in set(got) - set(want)]


def main():
    if "--self-test" in sys.argv:
        problems = self_test()
        report(not problems, "crash: the checker's model allows exactly what it should (self-test)",
               f"{len(problems)} problem(s)", problems)
        return 1 if problems else 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the blindfold binary")
    ap.add_argument("--work", required=True, help="work directory (created; the data dir goes inside)")
    ap.add_argument("--pid-file", help="write the server's pid here (for the caller's cleanup)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=6)
    ap.add_argument("--private-keys", type=int, default=8, help="keys per thread")
    ap.add_argument("--shared-keys", type=int, default=6, help="keys all threads write")
    ap.add_argument("--capacity", default="64MiB")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--min-delay", type=float, default=0.2)
    ap.add_argument("--max-delay", type=float, default=3.0)
    ap.add_argument("--rotate-every", type=int, default=0,
                    help="run `blindfold rotate-key` every N rounds (0: never)")
    ap.add_argument("--grow-every", type=int, default=0,
                    help="start `blindfold grow` every N rounds, during the traffic (0: never)")
    ap.add_argument("--grow-step-mib", type=int, default=16, help="MiB each growth adds")
    ap.add_argument("--lose-data-dir", action="store_true",
                    help="delete the data directory after each kill and recover a new one from the store alone "
                         "(--durability store)")
    ap.add_argument("--store", default=None, help="with --lose-data-dir: the store URL (default: files in the work dir)")
    ap.add_argument("--lease-ttl", default="1s", help="with --lose-data-dir: the gateway's --lease-ttl")
    ap.add_argument("--serve-flag", action="append", default=[], help="one more flag for `serve` (repeatable)")
    ap.add_argument("--recover-flag", action="append", default=[],
                    help="one more flag for `recover` (repeatable); `--recover-flag=--rebuild-memory=1MiB` "
                         "also checks that each rebuild set blocks aside on the disk")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    os.makedirs(args.work, exist_ok=True)
    args.data_dir = os.path.join(args.work, "data")
    shutil.rmtree(args.data_dir, ignore_errors=True)
    if args.lose_data_dir:
        for old in os.listdir(args.work):
            if old.startswith("data-") or old in ("cells", "key.json", "anchor"):
                path = os.path.join(args.work, old)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        args.key_file = os.path.join(args.work, "key.json")
        # The trusted anchor (another disk, in a deployment): recover refuses a store whose log
        # is behind it.
        args.anchor = os.path.join(os.path.abspath(args.work), "anchor")
        args.store = args.store or "file://" + os.path.join(os.path.abspath(args.work), "cells")
    print(f"crash loop: {args.rounds} rounds, {args.threads} writer threads, seed {seed} "
          f"(rerun with --seed {seed}), data dir {args.data_dir}", flush=True)

    server = Server(args)
    t_all = time.monotonic()
    try:
        server.start()
        client(server.endpoint).create_bucket(Bucket=BUCKET)
        model = {}
        retired = []
        totals = {"acked": 0, "inflight": 0}
        first_capacity = capacity(args)
        for n in range(1, args.rounds + 1):
            t_round = time.monotonic()
            rnd = Round(n, server.endpoint, model, args, seed + n)
            if args.rotate_every and n % args.rotate_every == 0:
                rotate_key(args, retired)
            growing = None
            if args.grow_every and n % args.grow_every == 0:
                growing = start_grow(args)
            delay = rng.uniform(args.min_delay, args.max_delay)
            delay = rnd.traffic(delay, server)
            if growing is not None:
                growing.kill()
                growing.wait()
            acked = sum(1 for op in rnd.ops if op.end != INF)
            inflight = len(rnd.ops) - acked
            totals["acked"] += acked
            totals["inflight"] += inflight
            extra = ""
            if args.lose_data_dir:
                # The machine is lost with its data directory (the kill below finds it dead).
                server.kill9()
                took, about = lose_and_recover(args, n)
                extra = f", data directory lost, recovered from the store in {took:.2f} s ({about.strip()[:160]})"
            elif n % 5 == 0 or n == args.rounds:
                # Also crash during recovery: start, kill after 0–150 ms, whether ready or not.
                server.spawn()
                time.sleep(rng.uniform(0.0, 0.15))
                server.kill9()
                extra = ", killed again during restart"
            if n == args.rounds and not args.lose_data_dir:
                run_verify(args, "after the last kill -9 (no clean stop)")
            startup = server.start()
            observed, problems, stats = check_state(server, rnd, rnd.candidates())
            problems = rnd.problems + problems
            name = (f"crash round {n}: kill -9 after {delay:.2f} s{extra}; {acked} acked writes, {inflight} in flight, "
                    f"{rnd.reads} own-key reads during traffic; restart {startup:.2f} s; {stats['keys']} keys checked "
                    f"({stats['present']} present, {stats['bytes'] // KB} KiB, {stats['inflight_keys']} with "
                    f"in-flight writes) in {time.monotonic() - t_round:.1f} s")
            if acked == 0:
                problems.append("no write was acknowledged within 20 s (server too slow or not serving?)")
            report(not problems, name, f"{len(problems)} problem(s)", problems)
            model = {k: v for k, v in observed.items() if not isinstance(v, tuple)}
        code = server.stop()
        report(code == 0, "crash: clean exit on SIGTERM after the loop", f"exit status {code}")
        if retired:
            finish_rotation(args, server, retired)
        if args.grow_every and args.rounds >= args.grow_every:
            during = capacity(args) > first_capacity
            finish_growth(args, server, model)
            last = capacity(args)
            if not during and last > first_capacity:
                print("    grow: the store did not grow during the loop (its requests waited behind a key "
                      "rotation or every kill cut the growth short); it grew after it", flush=True)
            report(last > first_capacity, f"crash: the store grew across the kills ({first_capacity // (KB * KB)} MiB "
                   f"→ {last // (KB * KB)} MiB) and every acknowledged write survived the growths",
                   "it never grew")
        run_verify(args, "after a clean stop")
        if args.lose_data_dir and args.store.startswith("file://"):
            # A recovery that rebuilds the tree (--reads-ahead-of-log) moves it to a new array: the
            # old one must leave the store, or every loss would leave a whole tree behind.
            cells = args.store[len("file://"):].split("?")[0]
            arrays = sorted(n for n in os.listdir(cells) if n.startswith("oram") and n.endswith(".cells"))
            report(len(arrays) == 1, f"crash: the store holds one engine array after the loop ({arrays[0] if arrays else 'none'})",
                   f"{len(arrays)} arrays", arrays)
        for path in retired:
            refuse_retired_key(args, path)
        print(f"crash loop: {totals['acked']} acknowledged writes, {totals['inflight']} in flight at kills, "
              f"{time.monotonic() - t_all:.0f} s", flush=True)
    except Exception as e:  # noqa: BLE001
        report(False, "crash loop", f"{type(e).__name__}: {e}")
        server.kill9()
        try:
            with open(os.path.join(args.work, "server.err"), "rb") as f:
                tail = f.read().decode(errors="replace").splitlines()[-20:]
            for line in tail:
                print(f"    | {line}")
        except OSError:
            pass
    finally:
        server.kill9()
    print(f"crash loop summary: {RESULTS['ok']} ok, {RESULTS['fail']} failed", flush=True)
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
