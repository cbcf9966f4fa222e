"""A live `blindfold serve` (any engine, plain or HTTPS, alone or over nodes or an enclave).

`Gateway.start` runs the binary on free 127.0.0.1 ports with a fresh (or given) data directory
and reads its banner for the endpoints; `stop` sends SIGTERM and returns the exit status;
`verify` runs `blindfold verify` on its data directory. `Enclave` is `blindfold enclave` (the
TEE engine's trusted component in its own process) and `Cluster` two `blindfold node`
processes with the certificates from `blindfold cluster-certs`, for `serve --nodes`.
"""

import os
import re
import signal
import subprocess

from harness import die, forget, read, run, spawn, wait_for

BANNER = re.compile(r"^blindfold .*serving S3 at (https?:\S*)", re.M)
ADMIN = re.compile(r"^  admin: (https?:\S*)/ ", re.M)
SWIFT = re.compile(r"^  swift: (https?:\S*) ", re.M)
ENCLAVE = re.compile(r"^blindfold storage-server listening on (\S+) ", re.M)
NODE = re.compile(r"^blindfold node serving at (https:\S*)", re.M)


class Context:
    """What every gateway and client shares: the binary, the work directory, the keys and the
    environment the clients run in (isolated from the machine's own configuration)."""

    AK = "e2eaccesskey"
    SK = "e2e-secret-key-0123456789abcdefghijklmnop"

    def __init__(self, bin, work, root, artefacts):
        self.bin, self.work, self.root, self.artefacts = bin, work, root, artefacts
        env = dict(os.environ)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_DEFAULT_PROFILE",
                  "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE", "SSL_CERT_FILE",
                  "OS_AUTH_URL", "OS_AUTH_TOKEN", "OS_STORAGE_URL", "ST_AUTH", "ST_USER", "ST_KEY"):
            env.pop(k, None)
        # aws CLI v1 presigns with SigV2 unless told otherwise; the gateway takes SigV4 only.
        cfg = os.path.join(work, "aws-config")
        with open(cfg, "w") as f:
            f.write("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n"
                    "  signature_version = s3v4\n")
        creds = os.path.join(work, "aws-credentials")
        open(creds, "w").close()
        rclone = os.path.join(work, "rclone.conf")
        open(rclone, "w").close()
        gitcfg = os.path.join(work, "gitconfig")
        with open(gitcfg, "w") as f:
            f.write("[user]\n\tname = blindfold e2e\n\temail = e2e@blindfold.invalid\n"
                    "[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n")
        env.update(
            AWS_ACCESS_KEY_ID=self.AK, AWS_SECRET_ACCESS_KEY=self.SK, AWS_DEFAULT_REGION="us-east-1",
            AWS_REGION="us-east-1", AWS_CONFIG_FILE=cfg, AWS_SHARED_CREDENTIALS_FILE=creds,
            RCLONE_CONFIG=rclone, GIT_CONFIG_GLOBAL=gitcfg, GIT_CONFIG_NOSYSTEM="1",
            GIT_TERMINAL_PROMPT="0", LC_ALL="C.UTF-8",
        )
        self.env = env

    def blindfold(self, *args, ok=True, timeout=600):
        return run([self.bin, *args], env=self.env, ok=ok, timeout=timeout)


class Gateway:
    """One `blindfold serve`. Flags beyond the defaults go in `flags`; `capacity` and the data
    directory are fixed when the store is created (a restart reuses them)."""

    def __init__(self, ctx, name, data_dir=None, capacity="64MiB", flags=(), tls=False, nodes=None):
        self.ctx, self.name = ctx, name
        self.data_dir = data_dir or os.path.join(ctx.work, name, "data")
        self.capacity, self.flags, self.tls, self.nodes = capacity, list(flags), tls, nodes
        self.proc = None
        self.endpoint = self.admin = self.swift_auth = None
        self.out = os.path.join(os.path.dirname(self.data_dir), f"{os.path.basename(self.data_dir)}.out")
        self.err = self.out[:-4] + ".err"

    # The client side.
    @property
    def ca(self):
        """The certificate clients must trust (None over plain HTTP)."""
        return os.path.join(self.data_dir, "tls", "cert.pem") if self.tls else None

    @property
    def hostport(self):
        return self.endpoint.split("://", 1)[1]

    def client_env(self, **more):
        env = dict(self.ctx.env)
        if self.ca:
            env["AWS_CA_BUNDLE"] = self.ca
        env.update(more)
        return env

    def banner(self):
        return read(self.out).decode("utf-8", "replace")

    def stderr(self):
        try:
            return read(self.err).decode("utf-8", "replace")
        except OSError:
            return ""

    # The server side.
    def serve_args(self, flags=()):
        args = [self.ctx.bin, "serve", "--data-dir", self.data_dir, "--capacity", self.capacity,
                "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                "--swift-listen", "127.0.0.1:0", *self.flags, *flags]
        if self.tls:
            args += ["--tls", "self-signed"]
        if self.nodes:
            args += ["--nodes", ",".join(self.nodes.urls), "--tls-dir", self.nodes.balancer_tls]
        return args + ["--access-key", self.ctx.AK, "--secret-key", self.ctx.SK]

    def start(self, flags=(), timeout=60):
        """Starts it; fails the check (with the server's last words) if it does not come up."""
        os.makedirs(os.path.dirname(self.data_dir), exist_ok=True)
        with open(self.out, "w") as out, open(self.err, "a") as err:
            self.proc = spawn(self.serve_args(flags), stdout=out, stderr=err, env=self.ctx.env)

        def ready():
            text = self.banner()
            m, a = BANNER.search(text), ADMIN.search(text)
            if m and a:
                return m, a, SWIFT.search(text)
            if self.proc.poll() is not None:
                return "exited"
            return None

        got = wait_for(ready, timeout, 0.05)
        if not got or got == "exited":
            tail = "\n".join(self.stderr().splitlines()[-20:])
            self.kill()
            die(f"{self.name}: the server did not become ready "
                f"({'it exited' if got else f'{timeout} s'}); its stderr ends:\n{tail}")
        m, a, s = got
        self.endpoint, self.admin = m.group(1), a.group(1)
        self.swift_auth = s.group(1) if s else None
        return self

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, seconds=30):
        """SIGTERM, then up to `seconds` for it to exit; its exit status (-9 if it had to be killed)."""
        p = self.proc
        if p is None:
            return None
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(seconds)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = -9
        forget(p)
        self.proc = None
        return rc

    def kill(self):
        p = self.proc
        if p is None:
            return
        p.kill()
        p.wait()
        forget(p)
        self.proc = None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def verify(self):
        """`blindfold verify` on the stopped gateway's data directory; its output."""
        args = ["verify", "--data-dir", self.data_dir]
        if self.nodes:
            args += ["--nodes", ",".join(self.nodes.urls), "--tls-dir", self.nodes.balancer_tls]
        out = self.ctx.blindfold(*args).stdout
        if "OK" not in out:
            die(f"verify did not say OK: {out.strip()[-300:]}")
        return out

    def user_add(self, name, *flags):
        """`blindfold user add` on the live data directory; (access key, secret key)."""
        out = self.ctx.blindfold("user", "add", name, *flags, "--data-dir", self.data_dir).stdout
        ak = re.search(r"^  access key: (\S+)", out, re.M)
        sk = re.search(r"^  secret key: (\S+)", out, re.M)
        if not (ak and sk):
            die(f"user add printed no keys: {out}")
        return ak.group(1), sk.group(1)


class Enclave:
    """`blindfold enclave`: the TEE engine's trusted component in its own process, with its
    cells in files; the gateway reaches it over remote://."""

    def __init__(self, ctx, dir):
        self.ctx, self.dir, self.proc, self.addr = ctx, dir, None, None
        self.data_dir = os.path.join(dir, "data")

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        key = os.path.join(self.data_dir, "key.json")
        self.ctx.blindfold("init", "--key-file", key)
        self.ctx.blindfold("enclave-key", "--key-file", key, "--out", os.path.join(self.dir, "tee.key"))
        return self.run(os.path.join(self.dir, "tee.key"), "127.0.0.1:0")

    def restart(self, tee_key):
        """Stops the enclave and starts it again at the same address with the TEE key `tee_key`."""
        self.stop()
        return self.run(tee_key, self.addr)

    def run(self, tee_key, listen):
        out, err = os.path.join(self.dir, "enclave.out"), os.path.join(self.dir, "enclave.err")
        with open(out, "w") as o, open(err, "w") as e:
            self.proc = spawn([self.ctx.bin, "enclave", "--listen", listen,
                               "--store", f"file://{self.dir}/cells",
                               "--auth-key-file", os.path.join(self.dir, "auth.key"), "--generate-auth-key",
                               "--enclave-key", tee_key,
                               "--enclave-block-size", "4KiB"], stdout=o, stderr=e, env=self.ctx.env)
        m = wait_for(lambda: ENCLAVE.search(read(out).decode()) or self.proc.poll() is not None, 30, 0.05)
        if not m or m is True:
            die(f"the enclave did not start: {read(err).decode()[-1500:]}")
        self.addr = m.group(1)
        return self

    @property
    def store(self):
        return f"remote://{self.addr}?key_file={self.dir}/auth.key"

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            forget(self.proc)
            self.proc = None


class Cluster:
    """Two `blindfold node` processes (an ObliviStore node and a TaoStore node: any engine) with
    mutual-TLS certificates from `blindfold cluster-certs`, for `serve --nodes`."""

    def __init__(self, ctx, dir, engines=("oblivistore", "tao"), node_flags=lambda i: []):
        self.ctx, self.dir, self.engines, self.node_flags = ctx, dir, engines, node_flags
        self.procs, self.urls = [], []
        self.certs = os.path.join(dir, "certs")
        self.balancer_tls = os.path.join(self.certs, "balancer")

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        self.ctx.blindfold("cluster-certs", "--out", self.certs,
                           "--nodes", ",".join("127.0.0.1" for _ in self.engines))
        for i in range(1, len(self.engines) + 1):
            p, url = self.run_node(i)
            self.procs.append(p)
            self.urls.append(url)
        return self

    def run_node(self, i):
        """Starts node `i` (from 1) on a free port; its process and URL."""
        engine = self.engines[i - 1]
        d = os.path.join(self.dir, f"n{i}")
        out, err = d + ".out", d + ".err"
        with open(out, "w") as o, open(err, "a") as e:
            p = spawn([self.ctx.bin, "node", "--listen", "127.0.0.1:0", "--data-dir", d,
                       "--tls-dir", os.path.join(self.certs, f"node-{i}"), "--blocks", "4608",
                       "--block-size", "4096", "--engine", engine, *self.node_flags(i)],
                      stdout=o, stderr=e, env=self.ctx.env)
        m = wait_for(lambda: NODE.search(read(out).decode()) or p.poll() is not None, 60, 0.05)
        if not m or m is True:
            die(f"node {i} ({engine}) did not start: {read(err).decode()[-1500:]}")
        return p, m.group(1)

    def kill(self, i):
        """kill -9 of node `i` (from 1), as a lost machine."""
        p = self.procs[i - 1]
        p.kill()
        p.wait()
        forget(p)

    def restart(self, i):
        """Starts node `i` (from 1) again, on a new port."""
        self.procs[i - 1], self.urls[i - 1] = self.run_node(i)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            forget(p)
        self.procs = []

