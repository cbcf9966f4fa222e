"""One function per S3/Swift client, each taking a `Pass` (the target being tested: its name,
work directory, whether this is the full or the short pass) and a running `Gateway`.

The full pass (tao, plain and over HTTPS) runs everything the client is checked for; the short
pass (every other engine) runs one upload, download, listing and delete per client, compared
byte for byte. Every check compares bytes or exact listings, not just exit codes.
"""

import hashlib
import json
import os
import re
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request

from harness import (die, expect, gen_backup_tree, gen_tree, rand_file, read, run, same_file, same_tree,
                     tree_files)

CLIENT_TIMEOUT = 600


# ---------------------------------------------------------------------------------------------
# Plain HTTP(S) requests (what curl did): status, body and headers, whatever the status.
def http(url, method="GET", headers=None, data=None, ca=None, timeout=60, context=None):
    if context is None:
        context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


# ---------------------------------------------------------------------------------------------
# aws CLI
def aws_cmd(gw, *args, env=None, timeout=CLIENT_TIMEOUT, ok=True):
    ca = ["--ca-bundle", gw.ca] if gw.ca else []
    return run(["aws", *ca, "--endpoint-url", gw.endpoint, *args], env=env or gw.client_env(),
               timeout=timeout, ok=ok)


def s3_etag(path, part=8 << 20):
    """The ETag S3 gives an object the aws CLI uploads in `part`-sized parts."""
    digests = b""
    with open(path, "rb") as f:
        while chunk := f.read(part):
            digests += hashlib.md5(chunk).digest()
    return '"%s-%d"' % (hashlib.md5(digests).hexdigest(), len(digests) // 16)


def md5(path):
    return hashlib.md5(read(path)).hexdigest()


class AwsFlow:
    """The aws CLI's steps on one bucket; the full pass runs them all, the short pass some."""

    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("aws")
        self.bucket = "e2e-aws"
        self.b = f"s3://{self.bucket}"

    def aws(self, *args, **kw):
        return aws_cmd(self.gw, *args, **kw)

    def mb(self):
        self.aws("s3", "mb", self.b)
        out = self.aws("s3", "ls").stdout
        expect(re.search(rf" {self.bucket}$", out, re.M), f"bucket not in 'aws s3 ls': {out}")

    def cp(self):
        rand_file(f"{self.d}/small", 10000)
        self.aws("s3", "cp", f"{self.d}/small", f"{self.b}/small.bin")
        self.aws("s3", "cp", f"{self.b}/small.bin", f"{self.d}/small.back")
        same_file(f"{self.d}/small", f"{self.d}/small.back")

    def ls(self):
        out = self.aws("s3", "ls", f"{self.b}/").stdout
        expect(re.search(r"^\d{4}-\d\d-\d\d [0-9:]{8} +10000 small\.bin$", out, re.M),
               f"'aws s3 ls' does not show small.bin with size 10000 and a date: {out}")

    def head_etag(self):
        etag = self.aws("s3api", "head-object", "--bucket", self.bucket, "--key", "small.bin",
                        "--query", "ETag", "--output", "text").stdout.strip()
        want = f'"{md5(f"{self.d}/small")}"'
        expect(etag == want, f"ETag {etag}, expected {want}")

    def range(self):
        src = read(f"{self.d}/small")
        for rng, want in (("bytes=100-199", src[100:200]), ("bytes=4000-8999", src[4000:9000]),
                          ("bytes=-300", src[-300:])):
            out = self.aws("s3api", "get-object", "--bucket", self.bucket, "--key", "small.bin",
                           "--range", rng, f"{self.d}/range").stdout
            got = read(f"{self.d}/range")
            expect(got == want, f"{rng}: {len(got)} bytes differ from the source's {len(want)}")
            if rng == "bytes=100-199":
                expect(json.loads(out).get("ContentRange") == "bytes 100-199/10000",
                       f"no/incorrect ContentRange: {out}")

    def sync(self, big=True):
        tree = f"{self.d}/tree"
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(f"{self.d}/tree.back", ignore_errors=True)
        gen_tree(tree, big)
        t0 = time.monotonic()
        self.aws("s3", "sync", tree, f"{self.b}/tree")
        # The tree holds an empty file: botocore sends it with "Expect: 100-continue", and a
        # gateway answering that without `Connection: close` made a later PUT wait out
        # botocore's 60 s read timeout (see the boto3 check "empty PUT, then PUT on the same
        # connection").
        took = time.monotonic() - t0
        expect(took <= 30, f"uploading the tree took {took:.0f} s (a stalled request?)")
        self.aws("s3", "sync", f"{self.b}/tree", f"{self.d}/tree.back")
        same_tree(tree, f"{self.d}/tree.back")
        listed = self.aws("s3", "ls", "--recursive", f"{self.b}/tree/").stdout.splitlines()
        want = len(tree_files(tree))
        expect(len(listed) == want, f"listing shows {len(listed)} objects, the tree has {want} files")
        again = self.aws("s3", "sync", tree, f"{self.b}/tree").stdout
        expect(not again.strip(), f"an unchanged tree was uploaded again: {again}")

    def sync_changes(self):
        tree = f"{self.d}/tree"
        rand_file(f"{tree}/a/block", 5000)
        os.remove(f"{tree}/docs/small-3.txt")
        rand_file(f"{tree}/a/b/new file", 777)
        self.aws("s3", "sync", "--delete", tree, f"{self.b}/tree")
        shutil.rmtree(f"{self.d}/tree.back2", ignore_errors=True)
        self.aws("s3", "sync", f"{self.b}/tree", f"{self.d}/tree.back2")
        same_tree(tree, f"{self.d}/tree.back2")

    def multipart(self, size):
        f = rand_file(f"{self.d}/mp", size)
        self.aws("s3", "cp", f, f"{self.b}/big/mp.bin")
        h = json.loads(self.aws("s3api", "head-object", "--bucket", self.bucket, "--key", "big/mp.bin").stdout)
        expect(h["ContentLength"] == size, f"ContentLength {h['ContentLength']}, expected {size}")
        want = s3_etag(f)
        expect(h["ETag"] == want, f"multipart ETag {h['ETag']}, expected {want} (8 MiB parts)")
        self.aws("s3", "cp", f"{self.b}/big/mp.bin", f"{self.d}/mp.back")
        same_file(f, f"{self.d}/mp.back")
        os.remove(f"{self.d}/mp.back")
        os.remove(f)

    def presign(self):
        gw = self.gw
        url = self.aws("s3", "presign", f"{self.b}/small.bin", "--expires-in", "300").stdout.strip()
        expect("X-Amz-Signature=" in url, f"not a SigV4 presigned URL: {url}")
        code, body, _ = http(url, ca=gw.ca)
        expect(code == 200, f"presigned GET got HTTP {code}")
        expect(body == read(f"{self.d}/small"), "presigned GET: bytes differ")
        # A tampered signature is refused, and so is the signature of another key.
        bad = url[:-1] + ("1" if url[-1] == "0" else "0")
        code, body, _ = http(bad, ca=gw.ca)
        expect(code == 403, f"tampered presigned URL got HTTP {code}, expected 403: {body[:200]!r}")
        code, body, _ = http(url.replace("small.bin", "small.bix"), ca=gw.ca)
        expect(code == 403, f"presigned URL for another key got HTTP {code}, expected 403: {body[:200]!r}")
        # Unsigned requests are refused.
        code, _, _ = http(f"{gw.endpoint}/{self.bucket}/small.bin", ca=gw.ca)
        expect(code == 403, f"anonymous GET got HTTP {code}, expected 403")

    def presign_v2_refused(self):
        # What aws CLI v1 makes without signature_version = s3v4: a SigV2 URL, which the gateway
        # refuses on purpose, with a message that says what to do.
        env = self.gw.client_env(AWS_CONFIG_FILE="/dev/null")
        url = self.aws("s3", "presign", f"{self.b}/small.bin", "--expires-in", "300", env=env).stdout.strip()
        if "Signature=" not in url or "X-Amz-Signature=" in url:
            # A newer aws CLI presigns with SigV4 by default: make the SigV2 URL with botocore.
            import boto3
            from botocore.config import Config

            c = boto3.client("s3", endpoint_url=self.gw.endpoint, verify=self.gw.ca or True,
                             aws_access_key_id=self.gw.ctx.AK, aws_secret_access_key=self.gw.ctx.SK,
                             region_name="us-east-1",
                             config=Config(signature_version="s3", s3={"addressing_style": "path"}))
            url = c.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": "small.bin"},
                                           ExpiresIn=300)
        expect("Signature=" in url and "X-Amz-Signature=" not in url, f"could not make a SigV2 URL: {url}")
        code, body, _ = http(url, ca=self.gw.ca)
        expect(code == 403, f"SigV2 presigned URL got HTTP {code}, expected 403")
        expect(b"SigV4" in body, f"the refusal does not say to use SigV4: {body[:300]!r}")

    def rm(self):
        self.aws("s3", "rm", "--recursive", self.b)
        left = self.aws("s3", "ls", "--recursive", f"{self.b}/", ok=False).stdout.strip()
        expect(not left, f"objects left after rm --recursive: {left}")
        self.aws("s3", "rb", self.b)
        out = self.aws("s3", "ls").stdout
        expect(not re.search(rf" {self.bucket}$", out, re.M), "bucket still listed after rb")

    def short(self):
        self.mb()
        self.cp()
        self.range()
        self.sync(big=False)
        self.rm()


def passes(p, short, full):
    """A client's checks: on the short pass the one check `short`, on the full pass each step of
    `full`, in order (each a check's label, function and arguments)."""
    for step in (full if p.full else [short]):
        p.check(*step)


def aws(p, gw):
    a = AwsFlow(p, gw)
    passes(p, ("aws: mb, cp, ranged get, sync a tree, rm, rb", a.short), [
        ("aws: mb + ls buckets", a.mb),
        ("aws: cp up and down", a.cp),
        ("aws: ls shows size and date", a.ls),
        ("aws: head-object ETag is the MD5", a.head_etag),
        ("aws: ranged get-object", a.range),
        ("aws: sync a nested tree up and down", a.sync),
        ("aws: sync --delete with changes", a.sync_changes),
        (f"aws: {p.multipart_mib} MiB multipart upload, ETag, download", a.multipart, p.multipart_mib << 20),
        ("aws: presigned GET (SigV4), tampered URLs refused", a.presign),
        ("aws: SigV2 presigned URL (aws CLI v1 default) refused with a clear 403", a.presign_v2_refused),
        ("aws: rm --recursive and rb", a.rm),
    ])


# ---------------------------------------------------------------------------------------------
# boto3: the whole of boto3_check.py on the full pass; one round trip on the short pass.
def boto3_client(gw):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=gw.endpoint, aws_access_key_id=gw.ctx.AK, aws_secret_access_key=gw.ctx.SK,
        region_name="us-east-1", verify=gw.ca or True,
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                      retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10,
                      read_timeout=300))


def boto3_short(gw):
    s3 = boto3_client(gw)
    b = "e2e-boto3"
    s3.create_bucket(Bucket=b)
    bodies = {f"k/{n}": os.urandom(n) for n in (0, 1, 4095, 4096, 4097, 100_000)}
    for k, v in bodies.items():
        r = s3.put_object(Bucket=b, Key=k, Body=v)
        expect(r["ETag"] == '"%s"' % hashlib.md5(v).hexdigest(), f"PUT ETag of {k}: {r['ETag']}")
    for k, v in bodies.items():
        got = s3.get_object(Bucket=b, Key=k)["Body"].read()
        expect(got == v, f"GET {k}: {len(got)} bytes differ from the {len(v)} put")
    r = s3.get_object(Bucket=b, Key="k/100000", Range="bytes=4000-9000")["Body"].read()
    expect(r == bodies["k/100000"][4000:9001], "ranged GET differs")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=b).get("Contents", [])]
    expect(keys == sorted(bodies), f"listing {keys}, expected {sorted(bodies)}")
    s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": k} for k in bodies]})
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=b).get("Contents", [])]
    expect(keys == [], f"keys left after delete_objects: {keys}")
    s3.delete_bucket(Bucket=b)
    names = [x["Name"] for x in s3.list_buckets()["Buckets"]]
    expect(b not in names, f"bucket still listed after delete: {names}")


def boto3(p, gw):
    if not p.full:
        p.check("boto3: put, get, ranged get, list, delete", boto3_short, gw)
        return
    env = gw.client_env()
    if gw.ca:
        env["SSL_CERT_FILE"] = gw.ca
    p.ingest("boto3", [sys.executable, os.path.join(gw.ctx.root, "tests/e2e/boto3_check.py"),
                       "--prefix", f"{p.name}: boto3: ", "--endpoint", gw.endpoint,
                       "--access-key", gw.ctx.AK, "--secret-key", gw.ctx.SK], env=env, timeout=900)


# ---------------------------------------------------------------------------------------------
# rclone (AWS_CA_BUNDLE unset: rclone trusts --ca-cert)
class RcloneFlow:
    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("rclone")
        env = gw.client_env()
        env.pop("AWS_CA_BUNDLE", None)
        env.update(RCLONE_CONFIG_BF_TYPE="s3", RCLONE_CONFIG_BF_PROVIDER="Other", RCLONE_CONFIG_BF_ENV_AUTH="false",
                   RCLONE_CONFIG_BF_ACCESS_KEY_ID=gw.ctx.AK, RCLONE_CONFIG_BF_SECRET_ACCESS_KEY=gw.ctx.SK,
                   RCLONE_CONFIG_BF_ENDPOINT=gw.endpoint, RCLONE_CONFIG_BF_FORCE_PATH_STYLE="true",
                   RCLONE_CONFIG_BF_REGION="us-east-1")
        self.env = env
        self.r = "bf:e2e-rclone"

    def rclone(self, *args):
        ca = ["--ca-cert", self.gw.ca] if self.gw.ca else []
        return run(["rclone", *ca, *args], env=self.env, timeout=CLIENT_TIMEOUT)

    def sync(self, big=True):
        tree = gen_tree(f"{self.d}/tree", big)
        self.rclone("mkdir", self.r)
        self.rclone("sync", tree, f"{self.r}/tree")
        self.rclone("check", tree, f"{self.r}/tree")  # sizes and MD5s
        self.rclone("check", "--download", tree, f"{self.r}/tree")  # bytes
        self.rclone("copy", f"{self.r}/tree", f"{self.d}/tree.back")
        same_tree(tree, f"{self.d}/tree.back")
        listed = sorted(x for x in self.rclone("lsf", "-R", f"{self.r}/tree").stdout.splitlines()
                        if not x.endswith("/"))
        expect(listed == tree_files(tree), f"rclone lsf shows {listed[:5]}…, not the tree's files")

    def resync(self):
        tree = f"{self.d}/tree"
        rand_file(f"{tree}/a/b/c/big", 1_600_000)
        rand_file(f"{tree}/one", 2)
        os.remove(f"{tree}/docs/small-7.txt")
        rand_file(f"{tree}/docs/deep/added", 5555)
        self.rclone("sync", tree, f"{self.r}/tree")
        self.rclone("check", "--download", tree, f"{self.r}/tree")
        self.rclone("copy", f"{self.r}/tree", f"{self.d}/tree.back2")
        same_tree(tree, f"{self.d}/tree.back2")

    def delete(self):
        self.rclone("delete", f"{self.r}/tree")
        left = [x for x in self.rclone("lsf", "-R", self.r).stdout.splitlines() if not x.endswith("/")]
        expect(not left, f"{len(left)} objects left after rclone delete: {left[:5]}")
        self.rclone("rmdir", self.r)

    def short(self):
        self.sync(big=False)
        self.delete()


def rclone(p, gw):
    r = RcloneFlow(p, gw)
    passes(p, ("rclone: sync a tree, check --download, copy back, lsf, delete", r.short), [
        ("rclone: sync a tree, check, copy back", r.sync),
        ("rclone: modify, sync again, check", r.resync),
        ("rclone: delete", r.delete),
    ])


# ---------------------------------------------------------------------------------------------
# restic
class ResticFlow:
    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("restic")
        self.env = gw.client_env(RESTIC_REPOSITORY=f"s3:{gw.endpoint}/e2e-restic",
                                 RESTIC_PASSWORD="e2e-restic-password",
                                 RESTIC_CACHE_DIR=f"{self.d}/cache")

    def restic(self, *args, cwd=None):
        ca = ["--cacert", self.gw.ca] if self.gw.ca else []
        return run(["restic", *ca, *args], env=self.env, cwd=cwd, timeout=CLIENT_TIMEOUT)

    def backup(self, big=True):
        self.restic("init")
        if big:
            gen_backup_tree(f"{self.d}/src/data")
        else:
            gen_tree(f"{self.d}/src/data", big=False)
        self.restic("backup", "--host", "e2e", "data", cwd=f"{self.d}/src")
        self.restic("check")

    def restore(self):
        shutil.rmtree(f"{self.d}/restore", ignore_errors=True)
        self.restic("restore", "latest", "--target", f"{self.d}/restore")
        same_tree(f"{self.d}/src/data", f"{self.d}/restore/data")

    def snapshots(self):
        return json.loads(self.restic("snapshots", "--json").stdout)

    def second(self):
        d = f"{self.d}/src/data"
        rand_file(f"{d}/big/blob1", 2_500_000)
        os.remove(f"{d}/small/f10")
        os.remove(f"{d}/small/f11")
        rand_file(f"{d}/nested/new", 123456)
        with open(f"{d}/big/text.txt", "a") as f:
            f.write("changed\n")
        self.restic("backup", "--host", "e2e", "data", cwd=f"{self.d}/src")
        n = len(self.snapshots())
        expect(n == 2, f"{n} snapshots, expected 2")
        self.restic("check", "--read-data")
        self.restore()

    def short(self):
        self.backup(big=False)
        snaps = self.snapshots()
        expect(len(snaps) == 1, f"{len(snaps)} snapshots, expected 1")
        self.restore()
        # Deleting: forget the snapshot and prune its data; the repository stays consistent.
        self.restic("forget", snaps[0]["id"], "--prune")
        n = len(self.snapshots())
        expect(n == 0, f"{n} snapshots after forget, expected 0")
        self.restic("check")


def restic(p, gw):
    r = ResticFlow(p, gw)
    passes(p, ("restic: init, backup, restore equals the source, forget --prune, check", r.short), [
        ("restic: init, backup, check", r.backup),
        ("restic: restore latest equals the source", r.restore),
        ("restic: second backup, check --read-data, restore", r.second),
    ])


# ---------------------------------------------------------------------------------------------
# s3cmd (SigV4)
class S3cmdFlow:
    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("s3cmd")
        self.cfg = f"{self.d}/s3cfg"
        tls = bool(gw.ca)
        with open(self.cfg, "w") as f:
            f.write(f"[default]\naccess_key = {gw.ctx.AK}\nsecret_key = {gw.ctx.SK}\n"
                    f"host_base = {gw.hostport}\nhost_bucket = {gw.hostport}\n"
                    f"use_https = {tls}\nsignature_v2 = False\nbucket_location = us-east-1\n"
                    f"check_ssl_certificate = {tls}\nguess_mime_type = False\n"
                    + (f"ca_certs_file = {gw.ca}\n" if tls else ""))

    def s3cmd(self, *args):
        return run(["s3cmd", f"--config={self.cfg}", *args], env=self.gw.client_env(), timeout=CLIENT_TIMEOUT)

    def roundtrip(self, big_mib=20):
        b = "s3://e2e-s3cmd"
        self.s3cmd("mb", b)
        files = {"small": 54321}
        if big_mib:
            files["big"] = big_mib << 20  # over s3cmd's 15 MiB chunk: a multipart upload
        for name, size in files.items():
            rand_file(f"{self.d}/{name}", size)
            self.s3cmd("put", f"{self.d}/{name}", f"{b}/dir/{name}")
        out = self.s3cmd("ls", f"{b}/dir/").stdout
        for name, size in files.items():
            expect(re.search(rf" {size} +{b}/dir/{name}$", out, re.M), f"ls does not show {name} ({size} bytes): {out}")
        for name in files:
            self.s3cmd("get", "--force", f"{b}/dir/{name}", f"{self.d}/{name}.back")
            same_file(f"{self.d}/{name}", f"{self.d}/{name}.back")

    def delete(self):
        b = "s3://e2e-s3cmd"
        names = [line.split()[-1] for line in self.s3cmd("ls", "-r", b).stdout.splitlines() if line.strip()]
        expect(names, "nothing to delete")
        self.s3cmd("del", *names)
        left = self.s3cmd("ls", "-r", b).stdout.strip()
        expect(not left, f"objects left after del: {left}")
        self.s3cmd("rb", b)

    def short(self):
        self.roundtrip(big_mib=0)
        self.delete()


def s3cmd(p, gw):
    s = S3cmdFlow(p, gw)
    mib = 20 if p.big else 0
    passes(p, ("s3cmd: mb, put, ls, get, del, rb", s.short), [
        (f"s3cmd: mb, put{f' (incl. a {mib} MiB multipart)' if mib else ''}, ls, get", s.roundtrip, mib),
        ("s3cmd: del, rb", s.delete),
    ])


# ---------------------------------------------------------------------------------------------
# git over S3 (git-remote-s3 uses boto3: AWS_ENDPOINT_URL points it at the gateway)
class GitFlow:
    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("git")
        self.env = gw.client_env(AWS_ENDPOINT_URL=gw.endpoint)
        self.a, self.b = f"{self.d}/a", f"{self.d}/b"

    def git(self, *args):
        return run(["git", *args], env=self.env, timeout=CLIENT_TIMEOUT)

    def same(self, what):
        ha = self.git("-C", self.a, "rev-parse", "HEAD").stdout.strip()
        hb = self.git("-C", self.b, "rev-parse", "HEAD").stdout.strip()
        expect(ha == hb, f"{what}: HEAD {hb}, expected {ha}")
        same_tree(self.a, self.b, exclude=(".git",))

    def push_clone(self, big=True):
        aws_cmd(self.gw, "s3", "mb", "s3://e2e-git", env=self.env)
        a = self.a
        os.makedirs(f"{a}/src/deep")
        self.git("-C", a, "init", "-q")
        with open(f"{a}/README", "w") as f:
            f.write("hello blindfold\n")
        rand_file(f"{a}/src/deep/blob.bin", 300000 if big else 30000)
        with open(f"{a}/src/numbers.txt", "w") as f:
            f.write("".join(f"{i}\n" for i in range(1, 5001)))
        self.git("-C", a, "add", "-A")
        self.git("-C", a, "commit", "-q", "-m", "first")
        with open(f"{a}/README", "a") as f:
            f.write("second line\n")
        self.git("-C", a, "commit", "-q", "-am", "second")
        self.git("-C", a, "remote", "add", "origin", "s3://e2e-git/repo")
        self.git("-C", a, "push", "-u", "origin", "main")
        self.git("clone", "-q", "s3://e2e-git/repo", self.b)
        self.same("clone")

    def push_pull(self):
        a = self.a
        rand_file(f"{a}/src/another.bin", 100000)
        with open(f"{a}/README", "a") as f:
            f.write("third\n")
        self.git("-C", a, "add", "-A")
        self.git("-C", a, "commit", "-q", "-m", "third")
        self.git("-C", a, "push", "origin", "main")
        self.git("-C", self.b, "pull", "--ff-only")
        self.same("pull")
        self.git("-C", self.b, "fsck", "--full")

    def delete(self):
        aws_cmd(self.gw, "s3", "rb", "--force", "s3://e2e-git", env=self.env)

    def short(self):
        self.push_clone(big=False)
        self.delete()


def git(p, gw):
    g = GitFlow(p, gw)
    passes(p, ("git: push to s3://, clone, HEAD and work tree equal; bucket removed", g.short), [
        ("git: push to s3://, clone", g.push_clone),
        ("git: push a commit, pull in the clone, fsck", g.push_pull),
    ])


# ---------------------------------------------------------------------------------------------
# The Swift front end, with the real python-swiftclient (`swift`), on the same objects as S3.
class SwiftFlow:
    def __init__(self, p, gw):
        self.p, self.gw, self.d = p, gw, p.dir("swift")
        self.c = "e2e-swift"

    def swift(self, *args, user=None, key=None, cwd=None, ok=True):
        if not self.gw.swift_auth:
            die("the banner has no swift: line")
        ca = ["--os-cacert", self.gw.ca] if self.gw.ca else []
        return run(["swift", *ca, "-A", self.gw.swift_auth, "-U", f"blindfold:{user or self.gw.ctx.AK}",
                    "-K", key or self.gw.ctx.SK, *args], env=self.gw.client_env(), cwd=cwd, timeout=300, ok=ok)

    def roundtrip(self, big=True):
        self.swift("stat")
        src = gen_tree(f"{self.d}/src", big)
        self.swift("upload", self.c, ".", cwd=src)
        listed = sorted(self.swift("list", self.c).stdout.splitlines())
        expect(listed == tree_files(src), f"swift list shows {listed[:5]}…, not the tree's files")
        if big:
            out = self.swift("list", self.c, "--prefix", "docs/", "--delimiter", "/").stdout.splitlines()
            expect("docs/deep/" in out, f"no docs/deep/ subdir in the delimited listing: {out}")
            stat = self.swift("stat", self.c).stdout
            expect(re.search(rf"Objects: {len(listed)}\b", stat), f"container stat: {stat}")
        self.swift("download", self.c, "-D", f"{self.d}/back")
        same_tree(src, f"{self.d}/back")

    def ranges_and_s3(self):
        gw = self.gw
        # A token, then raw requests: ranged GET, and the same object through S3.
        auth = self.swift("auth").stdout
        url = re.search(r"OS_STORAGE_URL=(\S+)", auth).group(1)
        token = re.search(r"OS_AUTH_TOKEN=(\S+)", auth).group(1)
        h = {"X-Auth-Token": token}
        code, body, _ = http(f"{url}/{self.c}/a/b/c/big", headers={**h, "Range": "bytes=100-1099"}, ca=gw.ca)
        expect(code == 206 and body == read(f"{self.d}/src/a/b/c/big")[100:1100], f"ranged GET: {code}, bytes differ")
        code, _, _ = http(f"{url}/{self.c}/a/b/c/big", headers={**h, "Range": "bytes=9999999-"}, ca=gw.ca)
        expect(code == 416, f"unsatisfiable range answered {code}")
        aws_cmd(gw, "s3", "cp", f"s3://{self.c}/x y/with space.txt", f"{self.d}/from-swift")
        same_file(f"{self.d}/src/x y/with space.txt", f"{self.d}/from-swift")
        rand_file(f"{self.d}/s3-to-swift", 5000)
        aws_cmd(gw, "s3", "cp", f"{self.d}/s3-to-swift", f"s3://{self.c}/from-s3.bin")
        self.swift("download", self.c, "from-s3.bin", "-o", f"{self.d}/s3-to-swift.back")
        same_file(f"{self.d}/s3-to-swift", f"{self.d}/s3-to-swift.back")
        # A wrong ETag stores nothing; a non-empty container is not deleted; a bad token is refused.
        code, _, _ = http(f"{url}/{self.c}/bad-etag", "PUT", {**h, "ETag": "0" * 32},
                          read(f"{self.d}/s3-to-swift"), ca=gw.ca)
        expect(code == 422, f"a wrong ETag answered {code}")
        code, _, _ = http(f"{url}/{self.c}/bad-etag", "HEAD", h, ca=gw.ca)
        expect(code == 404, f"the object with the wrong ETag exists ({code})")
        code, _, _ = http(f"{url}/{self.c}", "DELETE", h, ca=gw.ca)
        expect(code == 409, f"deleting a non-empty container answered {code}")
        code, _, _ = http(f"{url}/{self.c}", headers={"X-Auth-Token": "not-a-token"}, ca=gw.ca)
        expect(code == 401, f"a bad token answered {code}")

    def users(self):
        gw = self.gw
        aws_cmd(gw, "s3", "mb", "s3://e2e-outside")
        sak, ssk = gw.user_add("swifty", "--buckets", "e2e-swift*")
        rak, rsk = gw.user_add("swiftro", "--buckets", self.c, "--read-only")
        time.sleep(1.2)  # the gateway looks at the users file once a second
        r = self.swift("list", user=sak, key="wrong", ok=False)
        expect(r.returncode != 0, "a wrong key signed in")
        seen = self.swift("list", user=sak, key=ssk).stdout.split()
        expect(seen == [self.c], f"swifty sees {seen}")
        self.swift("download", self.c, "one", "-o", f"{self.d}/ro", user=rak, key=rsk)
        same_file(f"{self.d}/src/one", f"{self.d}/ro")
        r = self.swift("upload", self.c, f"{self.d}/ro", user=rak, key=rsk, ok=False)
        expect(r.returncode != 0, "the read-only user uploaded")
        expect("403" in r.stdout + r.stderr, f"read-only refusal: {r.stdout} {r.stderr}")
        r = self.swift("list", "e2e-outside", user=sak, key=ssk, ok=False)
        expect(r.returncode != 0, "swifty listed a bucket outside its policy")
        gw.ctx.blindfold("user", "remove", "swifty", "--data-dir", gw.data_dir)
        gw.ctx.blindfold("user", "remove", "swiftro", "--data-dir", gw.data_dir)
        aws_cmd(gw, "s3", "rb", "s3://e2e-outside")

    def delete(self):
        self.swift("delete", self.c)
        listed = self.swift("list").stdout.split()
        expect(self.c not in listed, f"the container is still listed: {listed}")

    def short(self):
        self.roundtrip(big=False)
        self.delete()


def swift(p, gw):
    s = SwiftFlow(p, gw)
    passes(p, ("swift: upload a tree, list, download equals the source, delete", s.short), [
        ("swift: stat, upload a tree, list (plain, delimited), stat, download equals the source", s.roundtrip),
        ("swift: ranged GET, 416, objects shared with S3 both ways, wrong ETag stores nothing, 409, 401",
         s.ranges_and_s3),
        ("swift: users' keys and policies (buckets, read-only) apply", s.users),
        ("swift: delete a container with its objects", s.delete),
    ])


# The suite's client list, in the order they run.
CLIENTS = {"aws": aws, "boto3": boto3, "rclone": rclone, "restic": restic, "s3cmd": s3cmd, "git": git,
           "swift": swift}

