#!/usr/bin/env python3
"""boto3 against a live `blindfold serve`: one line per check, `ok - …` or `FAIL - …: reason`.

Run by tests/e2e/suite.py (the full client pass); by hand:

    python3 tests/e2e/boto3_check.py --endpoint http://127.0.0.1:9100 --access-key AK --secret-key SK

Every check compares bytes (or exact listing contents), not just status codes. Exits 1 if any
check failed.
"""

import argparse
import hashlib
import os
import sys
import time
import traceback

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ARGS = None
S3 = None
RESULTS = {"ok": 0, "fail": 0}
PREFIX = "boto3: "


def client(secret=None, access=None, read_timeout=300):
    return boto3.client(
        "s3",
        endpoint_url=ARGS.endpoint,
        aws_access_key_id=access or ARGS.access_key,
        aws_secret_access_key=secret or ARGS.secret_key,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1, "mode": "standard"},
            # boto3 presigns with SigV2 unless told otherwise; the gateway accepts SigV4 only.
            signature_version="s3v4",
            connect_timeout=10,
            read_timeout=read_timeout,
        ),
    )


def throwaway():
    """A client for one request the gateway refuses before reading its body.

    The gateway then closes the connection without saying so (no `Connection: close`; see the
    check "error before the body: the connection is closed or stays usable"), and the next
    request on that pooled connection may fail with RemoteDisconnected. Real clients retry
    that; these checks must not depend on it, so such requests get their own connection.
    """
    return client()


class Failed(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failed(msg)


def expect_eq(got, want, what):
    if got != want:
        g, w = got, want
        if isinstance(g, bytes) and isinstance(w, bytes):
            g = f"{len(got)} bytes sha256 {hashlib.sha256(got).hexdigest()[:16]}"
            w = f"{len(want)} bytes sha256 {hashlib.sha256(want).hexdigest()[:16]}"
        raise Failed(f"{what}: got {g!r}, expected {w!r}")


def error_code(fn, *a, **kw):
    """Runs fn; returns (code, http status) of the ClientError it must raise."""
    try:
        fn(*a, **kw)
    except ClientError as e:
        return e.response.get("Error", {}).get("Code"), e.response.get("ResponseMetadata", {}).get(
            "HTTPStatusCode"
        )
    raise Failed(f"{getattr(fn, '__name__', fn)} succeeded, expected an error")


def expect_error(codes, status, fn, *a, **kw):
    if isinstance(codes, str):
        codes = (codes,)
    code, st = error_code(fn, *a, **kw)
    if code not in codes or (status is not None and st != status):
        raise Failed(f"error {code} (HTTP {st}), expected {'/'.join(codes)} (HTTP {status})")


def check(name):
    def wrap(fn):
        t0 = time.monotonic()
        try:
            fn()
        except Failed as e:
            RESULTS["fail"] += 1
            print(f"FAIL - {PREFIX}{name}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - any exception is a failed check
            RESULTS["fail"] += 1
            print(f"FAIL - {PREFIX}{name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(file=sys.stdout)
        else:
            RESULTS["ok"] += 1
            print(f"ok - {PREFIX}{name} # {time.monotonic() - t0:.1f} s", flush=True)
        return fn

    return wrap


def md5_etag(data):
    return '"%s"' % hashlib.md5(data).hexdigest()


def multipart_etag(parts):
    return '"%s-%d"' % (hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest(), len(parts))


def get(bucket, key, **kw):
    return S3.get_object(Bucket=bucket, Key=key, **kw)["Body"].read()


def list_all(bucket, **kw):
    """Pages through list_objects_v2; returns (keys, common prefixes, pages)."""
    keys, prefixes, pages, token = [], [], 0, None
    while True:
        args = dict(kw)
        if token:
            args["ContinuationToken"] = token
        r = S3.list_objects_v2(Bucket=bucket, **args)
        pages += 1
        keys += [o["Key"] for o in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        expect_eq(r["KeyCount"], len(r.get("Contents", [])) + len(r.get("CommonPrefixes", [])), "KeyCount")
        if not r["IsTruncated"]:
            return keys, prefixes, pages
        token = r.get("NextContinuationToken")
        expect(token, "IsTruncated without NextContinuationToken")
        expect(pages < 1000, "pagination does not end")


def main():
    global ARGS, S3
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret-key", required=True)
    ap.add_argument("--bucket", default="e2e-boto3")
    ap.add_argument("--label", help="added to every check's name (e.g. 'over HTTPS')")
    ap.add_argument("--prefix", help="every check's name starts with this (default 'boto3: ')")
    ARGS = ap.parse_args()
    global PREFIX
    if ARGS.label:
        PREFIX = f"boto3 {ARGS.label}: "
    if ARGS.prefix:
        PREFIX = ARGS.prefix
    S3 = client()
    B = ARGS.bucket
    B2 = B + "-other"
    rnd = os.urandom

    @check("create_bucket, head_bucket, list_buckets")
    def _():
        S3.create_bucket(Bucket=B)
        S3.create_bucket(Bucket=B2)
        S3.head_bucket(Bucket=B)
        names = [b["Name"] for b in S3.list_buckets()["Buckets"]]
        expect(B in names and B2 in names, f"list_buckets shows {names}")
        # Creating it again: S3 in us-east-1 answers 200, elsewhere BucketAlreadyOwnedByYou.
        try:
            S3.create_bucket(Bucket=B)
        except ClientError as e:
            code = e.response["Error"]["Code"]
            expect(code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"), f"re-create: {code}")

    data = {
        "empty": b"",
        "one": b"x",
        "block-1": rnd(4095),
        "block": rnd(4096),
        "block+1": rnd(4097),
        "mid": rnd(100_000),
        "1MiB+": rnd((1 << 20) + 3),
    }

    @check("put_object / get_object round trip (0 B … 1 MiB, block boundaries)")
    def _():
        for k, v in data.items():
            r = S3.put_object(Bucket=B, Key="sizes/" + k, Body=v)
            expect_eq(r["ETag"], md5_etag(v), f"PUT ETag of {k}")
        for k, v in data.items():
            expect_eq(get(B, "sizes/" + k), v, f"GET {k}")

    @check("empty PUT, then PUT on the same connection (botocore's default Expect: 100-continue)")
    def _():
        # botocore (through 1.43 at least) sends "Expect: 100-continue" on every PutObject, even
        # with Content-Length: 0. hyper answers an empty body with the final response and no
        # "100 Continue" (allowed by RFC 9110); botocore keeps that response's status line on
        # the connection object, and the next PUT that does get a "100 Continue" on the same
        # keep-alive connection is parsed wrongly: the client hangs until its read timeout
        # (60 s by default). The gateway answers such a request with `Connection: close`, which
        # makes botocore drop the connection and that state. Each PUT must answer in seconds.
        c = client(read_timeout=10)
        for i in range(3):
            t0 = time.monotonic()
            c.put_object(Bucket=B, Key=f"expect/empty{i}", Body=b"")
            body = rnd(1000 + i)
            try:
                r = c.put_object(Bucket=B, Key=f"expect/after{i}", Body=body)
            except Exception as e:  # noqa: BLE001
                raise Failed(f"PUT after an empty PUT failed after {time.monotonic() - t0:.1f} s: "
                             f"{type(e).__name__}: {e}")
            expect(time.monotonic() - t0 < 5, f"two small PUTs took {time.monotonic() - t0:.1f} s")
            expect_eq(r.get("ETag"), md5_etag(body), "ETag of the PUT after an empty PUT "
                      f"(response headers {r['ResponseMetadata'].get('HTTPHeaders')})")
            expect_eq(get(B, f"expect/empty{i}"), b"", "empty object")
            expect_eq(get(B, f"expect/after{i}"), body, "content")

    @check("head_object: size, ETag, LastModified")
    def _():
        for k, v in data.items():
            h = S3.head_object(Bucket=B, Key="sizes/" + k)
            expect_eq(h["ContentLength"], len(v), f"ContentLength of {k}")
            expect_eq(h["ETag"], md5_etag(v), f"ETag of {k}")
            expect("LastModified" in h, "no LastModified")

    @check("overwrite replaces the content")
    def _():
        v = rnd(7000)
        S3.put_object(Bucket=B, Key="sizes/mid", Body=v)
        expect_eq(get(B, "sizes/mid"), v, "GET after overwrite")
        data["mid"] = v

    @check("content type and user metadata round trip (GET and HEAD)")
    def _():
        body = b"<p>hi</p>"
        S3.put_object(
            Bucket=B,
            Key="meta/page.html",
            Body=body,
            ContentType="text/html; charset=utf-8",
            Metadata={"color": "blue", "owner-name": "Ada Lovelace", "n": "42"},
        )
        want = {"color": "blue", "owner-name": "Ada Lovelace", "n": "42"}
        h = S3.head_object(Bucket=B, Key="meta/page.html")
        expect_eq(h["ContentType"], "text/html; charset=utf-8", "HEAD ContentType")
        expect_eq(h["Metadata"], want, "HEAD Metadata")
        g = S3.get_object(Bucket=B, Key="meta/page.html")
        expect_eq(g["ContentType"], "text/html; charset=utf-8", "GET ContentType")
        expect_eq(g["Metadata"], want, "GET Metadata")
        expect_eq(g["Body"].read(), body, "GET body")

    @check("keys with spaces, unicode, '+', '=', '%', and a trailing '/'")
    def _():
        keys = ["odd/with space", "odd/ünïcödé/名前", "odd/a+b=c", "odd/100%", "odd/dir/", "odd/q?x&y"]
        for i, k in enumerate(keys):
            S3.put_object(Bucket=B, Key=k, Body=str(i).encode() * 10)
        for i, k in enumerate(keys):
            expect_eq(get(B, k), str(i).encode() * 10, f"GET {k!r}")
            expect_eq(S3.head_object(Bucket=B, Key=k)["ContentLength"], 10 * len(str(i)), f"HEAD {k!r}")
        got, _, _ = list_all(B, Prefix="odd/")
        expect_eq(sorted(got), sorted(keys), "listing of odd/")

    @check("ranged GET: middle, across blocks, suffix, open end")
    def _():
        v = data["1MiB+"]
        for rng, want in [
            ("bytes=100-199", v[100:200]),
            ("bytes=4000-9000", v[4000:9001]),
            ("bytes=0-0", v[0:1]),
            ("bytes=-500", v[-500:]),
            ("bytes=1048570-", v[1048570:]),
            ("bytes=1000-99999999", v[1000:]),
        ]:
            r = S3.get_object(Bucket=B, Key="sizes/1MiB+", Range=rng)
            expect_eq(r["Body"].read(), want, f"GET {rng}")
            expect_eq(r["ResponseMetadata"]["HTTPStatusCode"], 206, f"status of {rng}")
            expect_eq(r["ContentLength"], len(want), f"ContentLength of {rng}")

    @check("InvalidRange (416) past the end")
    def _():
        expect_error("InvalidRange", 416, S3.get_object, Bucket=B, Key="sizes/block", Range="bytes=5000-6000")

    @check("copy_object: same and other bucket, metadata COPY and REPLACE")
    def _():
        S3.copy_object(Bucket=B, Key="copies/page", CopySource={"Bucket": B, "Key": "meta/page.html"})
        g = S3.get_object(Bucket=B, Key="copies/page")
        expect_eq(g["Body"].read(), b"<p>hi</p>", "copied body")
        expect_eq(g["Metadata"].get("color"), "blue", "copied metadata")
        expect_eq(g["ContentType"], "text/html; charset=utf-8", "copied content type")
        S3.copy_object(
            Bucket=B2,
            Key="from-other/mid",
            CopySource={"Bucket": B, "Key": "sizes/1MiB+"},
            MetadataDirective="REPLACE",
            Metadata={"fresh": "yes"},
            ContentType="application/x-test",
        )
        g = S3.get_object(Bucket=B2, Key="from-other/mid")
        expect_eq(g["Body"].read(), data["1MiB+"], "cross-bucket copy body")
        expect_eq(g["Metadata"], {"fresh": "yes"}, "REPLACE metadata")
        expect_eq(g["ContentType"], "application/x-test", "REPLACE content type")
        expect_eq(g["ETag"], md5_etag(data["1MiB+"]), "copy ETag")
        # The source is untouched.
        expect_eq(get(B, "sizes/1MiB+"), data["1MiB+"], "source after copy")

    @check("delete_object, then NoSuchKey on GET and 404 on HEAD")
    def _():
        S3.put_object(Bucket=B, Key="del/one", Body=b"bye")
        S3.delete_object(Bucket=B, Key="del/one")
        expect_error("NoSuchKey", 404, S3.get_object, Bucket=B, Key="del/one")
        expect_error(("404", "NoSuchKey", "NotFound"), 404, S3.head_object, Bucket=B, Key="del/one")
        # Deleting a missing key succeeds, as in S3.
        S3.delete_object(Bucket=B, Key="del/never-was")

    @check("delete_objects: several keys, one missing, listing after")
    def _():
        keys = [f"bulk/{i:03d}" for i in range(25)]
        for k in keys:
            S3.put_object(Bucket=B, Key=k, Body=k.encode())
        gone = keys[:20] + ["bulk/missing"]
        r = S3.delete_objects(Bucket=B, Delete={"Objects": [{"Key": k} for k in gone]})
        expect_eq(sorted(d["Key"] for d in r.get("Deleted", [])), sorted(gone), "Deleted")
        expect_eq(r.get("Errors", []), [], "Errors")
        left, _, _ = list_all(B, Prefix="bulk/")
        expect_eq(left, keys[20:], "keys left")
        for k in keys[20:]:
            expect_eq(get(B, k), k.encode(), f"GET {k}")

    @check("list_objects_v2: prefix, delimiter, start-after, empty delimiter")
    def _():
        for k in ["l/a/1", "l/a/2", "l/a/b/3", "l/b/4", "l/c", "l/d", "l/e/5", "m/x"]:
            S3.put_object(Bucket=B, Key=k, Body=k.encode())
        keys, prefixes, _ = list_all(B, Prefix="l/", Delimiter="/")
        expect_eq(keys, ["l/c", "l/d"], "keys under l/ with /")
        expect_eq(prefixes, ["l/a/", "l/b/", "l/e/"], "common prefixes under l/")
        keys, prefixes, _ = list_all(B, Prefix="l/a/", Delimiter="/")
        expect_eq((keys, prefixes), (["l/a/1", "l/a/2"], ["l/a/b/"]), "l/a/ with /")
        keys, prefixes, _ = list_all(B, Prefix="l/")
        expect_eq(keys, ["l/a/1", "l/a/2", "l/a/b/3", "l/b/4", "l/c", "l/d", "l/e/5"], "l/ recursive")
        expect_eq(prefixes, [], "no prefixes without delimiter")
        keys, prefixes, _ = list_all(B, Prefix="l/", Delimiter="")
        expect_eq(len(keys), 7, "empty delimiter means none")
        keys, _, _ = list_all(B, Prefix="l/", StartAfter="l/b/4")
        expect_eq(keys, ["l/c", "l/d", "l/e/5"], "start-after")
        keys, _, _ = list_all(B, Prefix="nothing-here/")
        expect_eq(keys, [], "empty prefix listing")
        r = S3.list_objects_v2(Bucket=B, Prefix="l/c")
        o = r["Contents"][0]
        expect_eq((o["Key"], o["Size"], o["ETag"]), ("l/c", 3, md5_etag(b"l/c")), "entry fields")
        expect("LastModified" in o, "entry without LastModified")

    @check("list_objects_v2 pagination (MaxKeys 1, 2, 7) is complete and in order")
    def _():
        want, _, _ = list_all(B)
        expect(len(want) > 20, f"only {len(want)} keys")
        expect_eq(want, sorted(want), "order")
        for mk in (1, 2, 7):
            got, _, pages = list_all(B, MaxKeys=mk)
            expect_eq(got, want, f"keys with MaxKeys={mk}")
            expect(pages >= len(want) // mk, f"MaxKeys={mk} gave {pages} pages")
        # Pages with a delimiter: prefixes are counted once each, never repeated.
        keys, prefixes, _ = list_all(B, Prefix="l/", Delimiter="/", MaxKeys=1)
        expect_eq((keys, prefixes), (["l/c", "l/d"], ["l/a/", "l/b/", "l/e/"]), "paged delimiter listing")

    @check("list_objects (v1) with marker")
    def _():
        r = S3.list_objects(Bucket=B, Prefix="l/", MaxKeys=3)
        first = [o["Key"] for o in r["Contents"]]
        expect_eq(first, ["l/a/1", "l/a/2", "l/a/b/3"], "first page")
        expect(r["IsTruncated"], "v1 page not truncated")
        r = S3.list_objects(Bucket=B, Prefix="l/", Marker="l/a/b/3")
        expect_eq([o["Key"] for o in r["Contents"]], ["l/b/4", "l/c", "l/d", "l/e/5"], "after marker")

    # Parts other than the last must be at least 5 MiB in S3; the gateway stores about 1 MiB/s
    # in a debug build, so keep this to two full parts and a short last one.
    parts = [rnd(5 << 20), rnd(5 << 20), rnd(234_567)]

    @check("multipart: create, upload parts, list_parts, list uploads, complete, ETag")
    def _():
        up = S3.create_multipart_upload(Bucket=B, Key="mp/object", ContentType="application/x-mp",
                                        Metadata={"mp": "1"})
        uid = up["UploadId"]
        etags = []
        # Upload out of order, and part 3 twice (the second upload wins).
        S3.upload_part(Bucket=B, Key="mp/object", UploadId=uid, PartNumber=3, Body=rnd(300_000))
        for n in (3, 1, 2):
            r = S3.upload_part(Bucket=B, Key="mp/object", UploadId=uid, PartNumber=n, Body=parts[n - 1])
            expect_eq(r["ETag"], md5_etag(parts[n - 1]), f"part {n} ETag")
        etags = {n: md5_etag(parts[n - 1]) for n in (1, 2, 3)}
        lp = S3.list_parts(Bucket=B, Key="mp/object", UploadId=uid)
        got = [(p["PartNumber"], p["ETag"], p["Size"]) for p in lp["Parts"]]
        expect_eq(got, [(n, etags[n], len(parts[n - 1])) for n in (1, 2, 3)], "list_parts")
        ups = S3.list_multipart_uploads(Bucket=B)
        expect_eq([(u["Key"], u["UploadId"]) for u in ups.get("Uploads", [])], [("mp/object", uid)],
                  "list_multipart_uploads")
        # Not visible before completion.
        expect_error("NoSuchKey", 404, S3.get_object, Bucket=B, Key="mp/object")
        r = S3.complete_multipart_upload(
            Bucket=B, Key="mp/object", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in (1, 2, 3)]},
        )
        expect_eq(r["ETag"], multipart_etag(parts), "complete ETag")
        g = S3.get_object(Bucket=B, Key="mp/object")
        expect_eq(g["Body"].read(), b"".join(parts), "completed object")
        expect_eq(g["ETag"], multipart_etag(parts), "GET ETag")
        expect_eq(g["ContentType"], "application/x-mp", "content type from create")
        expect_eq(g["Metadata"], {"mp": "1"}, "metadata from create")
        expect_eq(S3.list_multipart_uploads(Bucket=B).get("Uploads", []), [], "uploads after complete")
        # A range across the part boundary.
        r = get(B, "mp/object", Range="bytes=%d-%d" % ((5 << 20) - 10, (5 << 20) + 9))
        expect_eq(r, b"".join(parts)[(5 << 20) - 10:(5 << 20) + 10], "range across parts")

    @check("multipart: list_parts pages (MaxParts, PartNumberMarker)")
    def _():
        uid = S3.create_multipart_upload(Bucket=B, Key="mp/paged")["UploadId"]
        try:
            bodies = {n: rnd(1000 + n) for n in range(1, 6)}
            for n, b in bodies.items():
                S3.upload_part(Bucket=B, Key="mp/paged", UploadId=uid, PartNumber=n, Body=b)
            lp = S3.list_parts(Bucket=B, Key="mp/paged", UploadId=uid, PartNumberMarker=3)
            expect_eq([p["PartNumber"] for p in lp["Parts"]], [4, 5], "list_parts after marker 3")
            seen, marker, pages = [], 0, 0
            while True:
                lp = S3.list_parts(Bucket=B, Key="mp/paged", UploadId=uid, MaxParts=2, PartNumberMarker=marker)
                pages += 1
                got = [p["PartNumber"] for p in lp["Parts"]]
                expect(len(got) <= 2, f"MaxParts=2 returned parts {got}")
                seen += got
                if not lp["IsTruncated"]:
                    break
                marker = lp["NextPartNumberMarker"]
                expect(pages < 10, "list_parts pages do not end")
            expect_eq(seen, [1, 2, 3, 4, 5], "parts over all pages")
        finally:
            S3.abort_multipart_upload(Bucket=B, Key="mp/paged", UploadId=uid)

    @check("multipart: abort, then NoSuchUpload; wrong part ETag refused")
    def _():
        uid = S3.create_multipart_upload(Bucket=B, Key="mp/aborted")["UploadId"]
        S3.upload_part(Bucket=B, Key="mp/aborted", UploadId=uid, PartNumber=1, Body=rnd(100_000))
        S3.abort_multipart_upload(Bucket=B, Key="mp/aborted", UploadId=uid)
        expect_error("NoSuchUpload", 404, S3.list_parts, Bucket=B, Key="mp/aborted", UploadId=uid)
        expect_error("NoSuchUpload", 404, throwaway().upload_part, Bucket=B, Key="mp/aborted", UploadId=uid,
                     PartNumber=2, Body=b"late")
        expect_error("NoSuchKey", 404, S3.get_object, Bucket=B, Key="mp/aborted")
        uid = S3.create_multipart_upload(Bucket=B, Key="mp/badpart")["UploadId"]
        S3.upload_part(Bucket=B, Key="mp/badpart", UploadId=uid, PartNumber=1, Body=b"only part")
        expect_error("InvalidPart", 400, S3.complete_multipart_upload, Bucket=B, Key="mp/badpart", UploadId=uid,
                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": md5_etag(b"other")}]})
        S3.abort_multipart_upload(Bucket=B, Key="mp/badpart", UploadId=uid)

    @check("conditional PUT: If-None-Match '*' on an existing key is refused (412)")
    def _():
        S3.put_object(Bucket=B, Key="cond/x", Body=b"first")
        expect_error("PreconditionFailed", 412, throwaway().put_object, Bucket=B, Key="cond/x", Body=b"second",
                     IfNoneMatch="*")
        expect_eq(get(B, "cond/x"), b"first", "content after refused PUT")
        S3.put_object(Bucket=B, Key="cond/new", Body=b"created", IfNoneMatch="*")
        expect_eq(get(B, "cond/new"), b"created", "If-None-Match * on a new key")

    @check("conditional PUT: If-Match")
    def _():
        etag = md5_etag(b"first")
        expect_error("PreconditionFailed", 412, throwaway().put_object, Bucket=B, Key="cond/x", Body=b"nope",
                     IfMatch=md5_etag(b"other"))
        expect_eq(get(B, "cond/x"), b"first", "content after refused If-Match PUT")
        S3.put_object(Bucket=B, Key="cond/x", Body=b"third", IfMatch=etag)
        expect_eq(get(B, "cond/x"), b"third", "content after If-Match PUT")

    @check("conditional GET/HEAD: If-Match 412, If-None-Match 304")
    def _():
        etag = md5_etag(b"third")
        expect_eq(get(B, "cond/x", IfMatch=etag), b"third", "GET If-Match (matching)")
        expect_error("PreconditionFailed", 412, S3.get_object, Bucket=B, Key="cond/x", IfMatch='"00"')
        expect_error("304", 304, S3.get_object, Bucket=B, Key="cond/x", IfNoneMatch=etag)
        expect_eq(get(B, "cond/x", IfNoneMatch='"00"'), b"third", "GET If-None-Match (other)")
        expect_error("412", 412, S3.head_object, Bucket=B, Key="cond/x", IfMatch='"00"')
        expect_error("304", 304, S3.head_object, Bucket=B, Key="cond/x", IfNoneMatch=etag)

    @check("NoSuchBucket on object and bucket operations")
    def _():
        expect_error("NoSuchBucket", 404, S3.get_object, Bucket="no-such-bucket-e2e", Key="k")
        expect_error("NoSuchBucket", 404, throwaway().put_object, Bucket="no-such-bucket-e2e", Key="k", Body=b"x")
        expect_error("NoSuchBucket", 404, S3.list_objects_v2, Bucket="no-such-bucket-e2e")
        expect_error("NoSuchBucket", 404, S3.delete_bucket, Bucket="no-such-bucket-e2e")
        expect_error(("404", "NoSuchBucket", "NotFound"), 404, S3.head_bucket, Bucket="no-such-bucket-e2e")

    @check("NoSuchKey on GET of a missing key")
    def _():
        expect_error("NoSuchKey", 404, S3.get_object, Bucket=B, Key="missing/key")
        expect_error("NoSuchKey", 404, S3.copy_object, Bucket=B, Key="copies/none",
                     CopySource={"Bucket": B, "Key": "missing/key"})

    @check("BucketNotEmpty on delete of a non-empty bucket")
    def _():
        expect_error("BucketNotEmpty", 409, S3.delete_bucket, Bucket=B)
        S3.head_bucket(Bucket=B)
        expect_eq(get(B, "sizes/block"), data["block"], "object after refused bucket delete")

    @check("wrong secret key: SignatureDoesNotMatch (403), nothing written")
    def _():
        bad = client(secret=ARGS.secret_key + "x")
        expect_error(("SignatureDoesNotMatch", "AccessDenied"), 403, bad.list_buckets)
        expect_error(("SignatureDoesNotMatch", "AccessDenied"), 403, bad.put_object, Bucket=B, Key="bad/put",
                     Body=b"evil")
        expect_error(("SignatureDoesNotMatch", "AccessDenied"), 403, bad.get_object, Bucket=B, Key="sizes/block")
        expect_error("NoSuchKey", 404, S3.get_object, Bucket=B, Key="bad/put")

    @check("unknown access key: InvalidAccessKeyId / AccessDenied (403)")
    def _():
        bad = client(access="NOSUCHACCESSKEY", secret="whatever")
        expect_error(("InvalidAccessKeyId", "AccessDenied", "SignatureDoesNotMatch"), 403, bad.list_buckets)

    @check("error before the body: the connection is closed or stays usable (RFC 9110 §10.1.1)")
    def _():
        # A PUT with "Expect: 100-continue" that the gateway refuses (here: unknown upload id)
        # gets its final response without the body ever being sent. RFC 9110 §10.1.1: a server
        # answering before reading the content SHOULD say whether it will close the connection
        # (`Connection: close`) or keep reading. Then the next request on that connection must
        # get a response.
        import socket
        from urllib.parse import urlsplit

        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        u = urlsplit(ARGS.endpoint)
        creds = Credentials(ARGS.access_key, ARGS.secret_key)

        def raw(method, path, length, expect):
            r = AWSRequest(method=method, url=ARGS.endpoint + path, data=b"x" * length,
                           headers={"Content-Length": str(length)})
            if expect:
                r.headers["Expect"] = "100-continue"
            S3SigV4Auth(creds, "s3", "us-east-1").add_auth(r)
            lines = [f"{method} {path} HTTP/1.1", f"Host: {u.netloc}"] + [f"{k}: {v}" for k, v in r.headers.items()]
            return ("\r\n".join(lines) + "\r\n\r\n").encode()

        def response(sock):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    return data, True
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip())
            while len(rest) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
            return head, False

        def connect():
            sock = socket.create_connection((u.hostname, u.port), timeout=10)
            if u.scheme == "https":  # trust what the clients trust ($AWS_CA_BUNDLE)
                import ssl
                ctx = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE"))
                sock = ctx.wrap_socket(sock, server_hostname=u.hostname)
            return sock

        with connect() as sock:
            sock.sendall(raw("PUT", f"/{B}/conn/k?partNumber=1&uploadId=no-such-upload", 4, True))
            head, closed = response(sock)
            if head.startswith(b"HTTP/1.1 100"):  # the gateway wants the body after all
                sock.sendall(b"x" * 4)
                head, closed = response(sock)
            expect(not closed, "no response to the refused PUT")
            status = head.split(b"\r\n")[0].decode()
            expect(" 404 " in status + " ", f"refused PUT answered {status!r}, expected 404")
            says_close = b"connection: close" in head.lower()
            if says_close:
                return
            # Not closing, then: the connection must carry the next request.
            sock.sendall(raw("GET", f"/{B}/sizes/one", 0, False))
            try:
                head2, closed = response(sock)
            except ConnectionError as e:
                closed, head2 = True, repr(e).encode()
            expect(not closed, "the gateway answered the refused PUT without `Connection: close`, then closed "
                   "the connection: the next request on it got no response (clients see RemoteDisconnected)")
            expect(head2.startswith(b"HTTP/1.1 200"), f"next request answered {head2[:60]!r}")

    @check("presigned GET and PUT URLs (SigV4 query auth)")
    def _():
        import urllib.request

        url = S3.generate_presigned_url("get_object", Params={"Bucket": B, "Key": "sizes/1MiB+"}, ExpiresIn=300)
        with urllib.request.urlopen(url, timeout=60) as r:
            expect_eq(r.read(), data["1MiB+"], "presigned GET body")
        body = rnd(33_333)
        url = S3.generate_presigned_url("put_object", Params={"Bucket": B, "Key": "presigned/put"}, ExpiresIn=300)
        req = urllib.request.Request(url, data=body, method="PUT")
        with urllib.request.urlopen(req, timeout=60) as r:
            expect_eq(r.status, 200, "presigned PUT status")
        expect_eq(get(B, "presigned/put"), body, "object from presigned PUT")

    @check("empty the buckets and delete them")
    def _():
        for b in (B, B2):
            keys, _, _ = list_all(b)
            for i in range(0, len(keys), 1000):
                r = S3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]],
                                                        "Quiet": True})
                expect_eq(r.get("Errors", []), [], "delete_objects errors")
            expect_eq(list_all(b)[0], [], f"{b} after emptying")
            S3.delete_bucket(Bucket=b)
            expect_error(("404", "NoSuchBucket", "NotFound"), 404, S3.head_bucket, Bucket=b)

    print(f"boto3 summary: {RESULTS['ok']} ok, {RESULTS['fail']} failed", flush=True)
    return 1 if RESULTS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
