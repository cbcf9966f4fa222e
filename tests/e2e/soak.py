#!/usr/bin/env python3
"""Soak test: many concurrent S3 clients against a live blindfold gateway.

Each client (a thread sharing one boto3 client with a connection per thread) owns a few keys in
one bucket and loops: PUT a random-sized body, GET it back and compare, now and then HEAD, a
ranged GET, LIST its prefix and DELETE. Every answer is checked against what that client last
wrote, so a lost or mixed-up write counts as an error just like an HTTP failure does.

While it runs it samples the gateway's resident memory from the admin listener's /metrics
(blindfold_process_resident_bytes), or from /proc/PID/status with --pid. At the end it prints
`ok - …` / `FAIL - …` lines (scripts/e2e.sh counts them):

  * the run: requests made, errors (must be 0), throughput and latency percentiles;
  * memory: start, peak and end; bounded means the peak stays under --max-rss-mib and the last
    third of the run does not grow past the first third's peak by more than 25 % + 64 MiB
    (a leak grows with requests; a bounded gateway levels off after warm-up).

Usage: soak.py --endpoint URL --access-key AK --secret-key SK [--admin URL] [--clients 256]
               [--seconds 600] [--json FILE]
"""
import argparse
import hashlib
import json
import os
import random
import re
import sys
import threading
import time
import urllib.request
import base64

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

RSS_METRIC = re.compile(r"^blindfold_process_resident_bytes (\d+(?:\.\d+)?(?:e\+?\d+)?)$", re.M)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True, help="the gateway's S3 endpoint, http://host:port")
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--admin", help="the admin listener (http://host:port), for memory samples")
    p.add_argument("--pid", type=int, help="read memory from /proc/PID/status instead")
    p.add_argument("--clients", type=int, default=256, help="concurrent clients (default 256)")
    p.add_argument("--seconds", type=float, default=600, help="how long to run (default 600)")
    p.add_argument("--bucket", default="soak")
    p.add_argument("--keys-per-client", type=int, default=3)
    p.add_argument("--max-object", type=int, default=16384, help="largest body in bytes")
    p.add_argument("--max-rss-mib", type=float, default=2048, help="memory ceiling (MiB)")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args()
    if a.clients < 1 or a.seconds <= 0 or a.keys_per_client < 1 or a.max_object < 1:
        p.error("--clients, --seconds, --keys-per-client and --max-object must be positive")
    return a


class Memory(threading.Thread):
    """Samples the gateway's resident set every second."""

    def __init__(self, args):
        super().__init__(daemon=True)
        self.args = args
        self.samples = []  # (seconds since start, bytes)
        self.errors = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def read(self):
        if self.args.pid:
            with open(f"/proc/{self.args.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
            raise RuntimeError("no VmRSS line")
        req = urllib.request.Request(self.args.admin.rstrip("/") + "/metrics")
        token = base64.b64encode(f"{self.args.access_key}:{self.args.secret_key}".encode()).decode()
        req.add_header("Authorization", "Basic " + token)
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
        m = RSS_METRIC.search(text)
        if not m:
            raise RuntimeError("/metrics has no blindfold_process_resident_bytes")
        return int(float(m.group(1)))

    def run(self):
        while not self.stop.is_set():
            try:
                self.samples.append((time.monotonic() - self.t0, self.read()))
            except Exception as e:  # noqa: BLE001 - reported, not fatal to the soak
                self.errors.append(str(e))
            self.stop.wait(1.0)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.errors = []
        self.latencies = []

    def ok(self, seconds):
        with self.lock:
            self.requests += 1
            self.latencies.append(seconds)

    def fail(self, what):
        with self.lock:
            self.requests += 1
            if len(self.errors) < 1000:
                self.errors.append(what)


def client_loop(s3, args, run, n, deadline, stats):
    rng = random.Random(n)
    prefix = f"{run}/c{n:04d}/"
    keys = [f"{prefix}k{i}" for i in range(args.keys_per_client)]
    held = {}  # key -> bytes we last wrote (None once deleted)

    def timed(what, fn):
        t = time.monotonic()
        try:
            out = fn()
        except (ClientError, BotoCoreError) as e:
            stats.fail(f"{what}: {e}")
            return None, False
        stats.ok(time.monotonic() - t)
        return out, True

    while time.monotonic() < deadline:
        key = rng.choice(keys)
        roll = rng.random()
        if key not in held or held[key] is None or roll < 0.35:
            body = os.urandom(rng.randint(1, args.max_object))
            out, ok = timed("put", lambda: s3.put_object(Bucket=args.bucket, Key=key, Body=body))
            if ok:
                want = '"' + hashlib.md5(body).hexdigest() + '"'
                if out.get("ETag") != want:
                    stats.fail(f"put {key}: ETag {out.get('ETag')} is not the MD5 {want}")
                held[key] = body
            continue
        body = held[key]
        if roll < 0.75:
            out, ok = timed("get", lambda: s3.get_object(Bucket=args.bucket, Key=key)["Body"].read())
            if ok and out != body:
                stats.fail(f"get {key}: {len(out)} bytes differ from the {len(body)} written")
        elif roll < 0.85:
            lo = rng.randrange(len(body))
            hi = rng.randrange(lo, len(body))
            out, ok = timed(
                "range",
                lambda: s3.get_object(Bucket=args.bucket, Key=key, Range=f"bytes={lo}-{hi}")["Body"].read(),
            )
            if ok and out != body[lo : hi + 1]:
                stats.fail(f"ranged get {key} bytes={lo}-{hi}: wrong bytes")
        elif roll < 0.92:
            out, ok = timed("head", lambda: s3.head_object(Bucket=args.bucket, Key=key))
            if ok and out["ContentLength"] != len(body):
                stats.fail(f"head {key}: length {out['ContentLength']}, wrote {len(body)}")
        elif roll < 0.97:
            out, ok = timed("list", lambda: s3.list_objects_v2(Bucket=args.bucket, Prefix=prefix))
            if ok:
                listed = {o["Key"] for o in out.get("Contents", [])}
                live = {k for k, v in held.items() if v is not None}
                if listed != live:
                    stats.fail(f"list {prefix}: {sorted(listed)} but live {sorted(live)}")
        else:
            _, ok = timed("delete", lambda: s3.delete_object(Bucket=args.bucket, Key=key))
            if ok:
                held[key] = None


def percentile(sorted_values, q):
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main():
    args = parse_args()
    s3 = boto3.client(
        "s3",
        endpoint_url=args.endpoint,
        aws_access_key_id=args.access_key,
        aws_secret_access_key=args.secret_key,
        region_name="us-east-1",
        config=Config(
            max_pool_connections=args.clients,
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=30,
            read_timeout=120,
            s3={"addressing_style": "path"},
        ),
    )
    try:
        s3.create_bucket(Bucket=args.bucket)
    except ClientError as e:
        if e.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            print(f"FAIL - soak: create bucket {args.bucket}: {e}")
            return 1

    memory = None
    if args.admin or args.pid:
        memory = Memory(args)
        memory.start()

    # Keys of this run only, so a bucket left over from an earlier run does not confuse LIST.
    run = f"run-{os.urandom(4).hex()}"
    stats = Stats()
    t0 = time.monotonic()
    deadline = t0 + args.seconds
    threads = [
        threading.Thread(target=client_loop, args=(s3, args, run, n, deadline, stats), daemon=True)
        for n in range(args.clients)
    ]
    for t in threads:
        t.start()
    next_report = t0 + 30
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if time.monotonic() >= next_report:
            with stats.lock:
                r, e = stats.requests, len(stats.errors)
            rss = f", gateway {memory.samples[-1][1] / 2**20:.0f} MiB" if memory and memory.samples else ""
            print(f"  {time.monotonic() - t0:5.0f} s: {r} requests, {e} errors{rss}", flush=True)
            next_report += 30
    # A client stuck past its read timeout would hang here; the deadline plus the timeout bounds it.
    for t in threads:
        t.join(timeout=180)
    elapsed = time.monotonic() - t0
    if memory:
        memory.stop.set()
        memory.join(timeout=15)

    lat = sorted(stats.latencies)
    figures = {
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "requests": stats.requests,
        "errors": len(stats.errors),
        "requests_per_s": round(stats.requests / elapsed, 1),
        "p50_ms": round(percentile(lat, 0.50) * 1000, 1),
        "p99_ms": round(percentile(lat, 0.99) * 1000, 1),
    }
    status = 0
    line = (
        f"soak: {args.clients} clients for {elapsed:.0f} s, {stats.requests} requests "
        f"({figures['requests_per_s']}/s, p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms), "
        f"{len(stats.errors)} errors"
    )
    if stats.errors or stats.requests == 0:
        print(f"FAIL - {line}")
        for e in stats.errors[:10]:
            print(f"    | {e}")
        status = 1
    else:
        print(f"ok - {line}")

    if memory:
        samples = memory.samples
        if len(samples) < 3:
            print(f"FAIL - soak: memory: only {len(samples)} samples ({'; '.join(memory.errors[:3])})")
            status = 1
        else:
            mib = [b / 2**20 for _, b in samples]
            third = max(1, len(mib) // 3)
            early, late = max(mib[:third]), max(mib[-third:])
            peak = max(mib)
            figures.update(
                rss_start_mib=round(mib[0], 1),
                rss_peak_mib=round(peak, 1),
                rss_end_mib=round(mib[-1], 1),
                rss_first_third_peak_mib=round(early, 1),
                rss_last_third_peak_mib=round(late, 1),
            )
            line = (
                f"soak: gateway memory start {mib[0]:.0f} MiB, peak {peak:.0f} MiB, end {mib[-1]:.0f} MiB "
                f"(first third's peak {early:.0f}, last third's {late:.0f}; ceiling {args.max_rss_mib:.0f})"
            )
            if peak > args.max_rss_mib or late > early * 1.25 + 64:
                print(f"FAIL - {line}")
                status = 1
            else:
                print(f"ok - {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return status


if __name__ == "__main__":
    sys.exit(main())
