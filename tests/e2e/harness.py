"""The e2e suite's plumbing: checks and their counts, commands with time limits, test data.

A check is a function that raises `Failed` (through `die` or `expect`) with a reason, or any
other exception, to fail. `Checks.check` runs one and prints `ok - name # N s` or
`FAIL - name: reason` followed by the tail of what its commands printed. `Checks.ingest` runs a
script that prints such lines itself (boto3_check.py, soak.py, crash_loop.py, the browser
checks) and adds them to the counts.

Every process the suite starts in the background is registered here, so `kill_all` (run on any
exit) leaves none behind.
"""

import os
import random
import signal
import subprocess
import threading
import time

DEFAULT_TIMEOUT = 600  # seconds; a hung client fails its check, not the run


class Failed(Exception):
    """A check's reason for failing."""


def die(msg):
    raise Failed(msg)


def expect(cond, msg):
    if not cond:
        raise Failed(msg)


# ---------------------------------------------------------------------------------------------
# What the current check's commands printed, shown when it fails.
_log = threading.local()


def log(text):
    lines = getattr(_log, "lines", None)
    if lines is not None:
        lines.extend(str(text).splitlines())
        del lines[:-200]


class Checks:
    """Counts checks and prints one line for each."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, name, seconds=None):
        self.passed += 1
        print(f"ok - {name}" + ("" if seconds is None else f" # {seconds:.0f} s"), flush=True)

    def fail(self, name, reason, details=()):
        self.failed += 1
        print(f"FAIL - {name}: {reason}", flush=True)
        for line in list(details)[-25:]:
            print(f"    | {line}", flush=True)

    def check(self, name, fn, *args, **kwargs):
        """Runs fn(*args, **kwargs) as the check `name`; returns whether it passed."""
        _log.lines = []
        t0 = time.monotonic()
        try:
            fn(*args, **kwargs)
        except Failed as e:
            self.fail(name, e, _log.lines)
            return False
        except Exception as e:  # noqa: BLE001 - any exception fails the check
            import traceback

            log(traceback.format_exc())
            self.fail(name, f"{type(e).__name__}: {e}", _log.lines)
            return False
        finally:
            _log.lines = None
        self.ok(name, time.monotonic() - t0)
        return True

    def ingest(self, name, cmd, env=None, timeout=DEFAULT_TIMEOUT, cwd=None):
        """Runs a script that prints its own `ok - ` / `FAIL - ` lines; echoes and counts them."""
        ok = bad = 0
        try:
            p = spawn(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as e:
            self.fail(name, f"could not start {cmd[0]}: {e}")
            return
        timer = threading.Timer(timeout, lambda: p.kill())
        timer.start()
        try:
            for raw in p.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                print(line, flush=True)
                if line.startswith("ok - "):
                    ok += 1
                elif line.startswith("FAIL - "):
                    bad += 1
            rc = p.wait()
        finally:
            timer.cancel()
            forget(p)
        self.passed += ok
        self.failed += bad
        if rc != 0 and bad == 0:
            self.fail(name, f"exited with status {rc} without reporting a failed check")


# ---------------------------------------------------------------------------------------------
# Processes.
_procs = []
_pid_files = []


def spawn(cmd, **kw):
    """Popen, remembered until `forget` so that `kill_all` can end it."""
    p = subprocess.Popen([str(c) for c in cmd], **kw)
    _procs.append(p)
    return p


def forget(p):
    if p in _procs:
        _procs.remove(p)


def watch_pid_file(path):
    """A process another script starts writes its pid here; `kill_all` ends it too."""
    _pid_files.append(path)


def kill_all():
    for p in list(_procs):
        if p.poll() is None:
            p.kill()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        forget(p)
    for path in _pid_files:
        try:
            with open(path) as f:
                os.kill(int(f.read().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def run(cmd, env=None, cwd=None, input=None, timeout=DEFAULT_TIMEOUT, ok=True):
    """Runs a command to completion; its output goes to the check's log and is returned.

    With ok=True a non-zero exit fails the check with the command and its last line of output;
    with ok=False the CompletedProcess is returned whatever the status.
    """
    cmd = [str(c) for c in cmd]
    try:
        r = subprocess.run(cmd, env=env, cwd=cwd, input=input, capture_output=True, timeout=timeout,
                           text=not isinstance(input, bytes))
    except subprocess.TimeoutExpired:
        die(f"`{short(cmd)}` took more than {timeout} s")
    out = r.stdout if isinstance(r.stdout, str) else r.stdout.decode("utf-8", "replace")
    err = r.stderr if isinstance(r.stderr, str) else r.stderr.decode("utf-8", "replace")
    log(f"$ {short(cmd, 300)}")
    log(out)
    log(err)
    r.stdout, r.stderr = out, err
    if ok and r.returncode != 0:
        last = [line for line in err.splitlines() if line.strip()] or [line for line in out.splitlines() if line.strip()]
        die(f"`{short(cmd)}` exited with status {r.returncode}: {last[-1] if last else ''}")
    return r


def short(cmd, n=120):
    s = " ".join(cmd)
    return s if len(s) <= n else s[: n - 1] + "…"


def wait_for(cond, seconds, step=0.1):
    """Polls cond() until it returns something true or `seconds` pass; returns its last value."""
    end = time.monotonic() + seconds
    while True:
        v = cond()
        if v or time.monotonic() >= end:
            return v
        time.sleep(step)


# ---------------------------------------------------------------------------------------------
# Test data.
def rand_file(path, size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    return path


def gen_tree(d, big=True):
    """Nested directories, empty and block-boundary sized files, odd names (space, '+', '=',
    non-ASCII letters). With big=False the 1.5 MB file is 150 kB."""
    files = {
        "empty": 0,
        "one": 1,
        "a/block-minus": 4095,
        "a/block": 4096,
        "a/b/block-plus": 4097,
        "a/b/c/big": 1_500_000 if big else 150_000,
        "docs/deep/er/still/leaf.bin": 70000,
        "x y/with space.txt": 1234,
        "x y/plus+equals=.dat": 99,
        "docs/ünïcödé-名前.txt": 321,
    }
    for i in range(1, 13):
        files[f"docs/small-{i}.txt"] = i * 37
    for rel, n in files.items():
        rand_file(os.path.join(d, rel), n)
    return d


def gen_backup_tree(d):
    """A restic source: a few MB, many small files, some compressible text."""
    rng = random.Random()
    for i in range(1, 151):
        rand_file(f"{d}/small/f{i}", rng.randrange(3000))
    for i in range(1, 21):
        rand_file(f"{d}/nested/one/two/g{i}", rng.randrange(32768) * 3)
    rand_file(f"{d}/big/blob1", 3_000_000)
    rand_file(f"{d}/big/blob2", 1_200_000)
    with open(f"{d}/big/text.txt", "w") as f:
        f.write(("blindfold restic e2e line\n" * 40000)[:800000])
    return d


def tree_files(d, exclude=()):
    """Relative paths of the regular files under d (sorted)."""
    out = []
    for root, dirs, files in os.walk(d):
        dirs[:] = [x for x in dirs if x not in exclude]
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), d))
    return sorted(out)


def same_file(a, b):
    with open(a, "rb") as f:
        x = f.read()
    with open(b, "rb") as f:
        y = f.read()
    if x != y:
        die(f"bytes differ: {a} ({len(x)} B) vs {b} ({len(y)} B)")


def same_tree(a, b, exclude=()):
    """The same files with the same bytes (and the same directories) under a and b."""
    fa, fb = tree_files(a, exclude), tree_files(b, exclude)
    if fa != fb:
        only_a = sorted(set(fa) - set(fb))[:5]
        only_b = sorted(set(fb) - set(fa))[:5]
        die(f"trees differ: {a} vs {b}: only in the first {only_a}, only in the second {only_b}")
    for rel in fa:
        same_file(os.path.join(a, rel), os.path.join(b, rel))
    da = sorted(os.path.relpath(r, a) for r, _, _ in os.walk(a) if not set(r.split(os.sep)) & set(exclude))
    db = sorted(os.path.relpath(r, b) for r, _, _ in os.walk(b) if not set(r.split(os.sep)) & set(exclude))
    if da != db:
        die(f"directories differ: {sorted(set(da) ^ set(db))[:5]}")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def step(msg):
    print(f"\n==> {msg}", flush=True)
