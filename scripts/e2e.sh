#!/usr/bin/env bash
# End-to-end tests: real S3 clients against a live `blindfold serve`.
#
#   aws CLI, a boto3 script (tests/e2e/boto3_check.py), rclone, restic, s3cmd, git through
#   git-remote-s3, then the admin listener under load (tests/e2e/soak.py: 256 concurrent boto3
#   clients, beside tests/browser/check.mjs: headless Chromium on the dashboard and visualizer),
#   then a crash loop (tests/e2e/crash_loop.py) that kill -9s the server under concurrent writes
#   and checks every acknowledged write.
#
# Installs the clients it needs when missing (apt: rclone restic s3cmd git curl; pip: awscli boto3
# git-remote-s3, into a virtualenv under the cargo target dir if the system Python is managed by
# apt; chromium, nodejs and npm for the browser checks, and `npm ci` in tests/browser), builds the `blindfold` binary (debug profile; honours CARGO_TARGET_DIR), starts it on a
# free 127.0.0.1 port with a fresh data directory, and prints one line per check (`ok - name` or
# `FAIL - name: reason`) and a closing `N passed, M failed`. Exits non-zero if any check failed.
# Servers are killed and the work directory (under $TMPDIR or /tmp) removed on any exit.
#
# Knobs (environment): BLINDFOLD_BIN (use this binary, skip the build), E2E_KEEP=1 (keep the
# work directory), E2E_ONLY="aws boto3 rclone restic s3cmd git swift users observe tls grow
# tee oblivistore curious curious-path nodes report crash" (run a subset), E2E_SOAK_SECONDS (default 45),
# E2E_ARTEFACTS (browser screenshots; default
# <target>/browser-artefacts), E2E_CRASH_ROUNDS (default 20), E2E_CRASH_SEED, E2E_COUNTS_FILE
# (see finish below).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export LC_ALL=C.UTF-8

START_TIME=$(date +%s)
step() { printf '\n==> %s\n' "$*"; }
only() { [[ -z "${E2E_ONLY:-}" || " $E2E_ONLY " == *" $1 "* ]]; }

# ---------------------------------------------------------------------------------------------
step "e2e: clients"

SUDO=()
[[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && SUDO=(sudo)
APT_UPDATED=
apt_install() { # package…
  echo "apt-get install $*"
  if [[ -z $APT_UPDATED ]]; then
    "${SUDO[@]}" apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  hash -r
}

apt_need=()
command -v python3 >/dev/null || apt_need+=(python3)
for tool in rclone restic s3cmd git curl; do
  command -v "$tool" >/dev/null || apt_need+=("$tool")
done
only tls && ! command -v openssl >/dev/null && apt_need+=(openssl)
if only observe; then
  CHROMIUM=${CHROMIUM:-}
  if [[ -z $CHROMIUM ]]; then
    for c in chromium chromium-browser google-chrome; do
      command -v "$c" >/dev/null && { CHROMIUM=$(command -v "$c"); break; }
    done
  fi
  [[ -n $CHROMIUM ]] || apt_need+=(chromium)
  command -v node >/dev/null || apt_need+=(nodejs)
  command -v npm >/dev/null || apt_need+=(npm)
fi
if ((${#apt_need[@]})); then apt_install "${apt_need[@]}" ca-certificates; fi
if only observe; then
  [[ -n $CHROMIUM ]] || CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
  export CHROMIUM
  # playwright-core only (no browser download): it drives the system's Chromium.
  (cd tests/browser && npm ci --silent --no-audit --no-fund) || echo "npm ci failed in tests/browser"
fi

# Console scripts pip installs land next to the interpreter (pyenv shims may not know them yet).
PY_SCRIPTS=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$PY_SCRIPTS:$PATH"

pip_need=()
python3 -c 'import boto3' 2>/dev/null || pip_need+=(boto3)
command -v aws >/dev/null || pip_need+=(awscli)
command -v git-remote-s3 >/dev/null || pip_need+=(git-remote-s3)
command -v swift >/dev/null || pip_need+=(python-swiftclient)
if ((${#pip_need[@]})); then
  # One resolver run, so awscli's botocore pin and git-remote-s3's boto3 floor agree. Into the
  # interpreter's own site-packages where pip may write there (pyenv, a virtualenv); else (a
  # Debian python3 is "externally managed") into a virtualenv next to the build.
  echo "pip install ${pip_need[*]}"
  if ! python3 -m pip install --quiet --root-user-action=ignore "${pip_need[@]}" 2>/dev/null; then
    VENV_TARGET=${CARGO_TARGET_DIR:-target}
    [[ $VENV_TARGET == /* ]] || VENV_TARGET=$ROOT/$VENV_TARGET
    VENV=$VENV_TARGET/e2e-venv
    echo "  into a virtualenv: $VENV"
    python3 -m venv "$VENV" 2>/dev/null || { apt_install python3-venv python3-pip && python3 -m venv --clear "$VENV"; }
    "$VENV/bin/python3" -m pip install --quiet --upgrade pip
    "$VENV/bin/python3" -m pip install --quiet boto3 awscli git-remote-s3 python-swiftclient
    export PATH="$VENV/bin:$PATH" # its python3 has boto3; git finds git-remote-s3 here
  fi
  hash -r
fi

for tool in aws s3cmd git-remote-s3 swift rclone restic git curl node; do
  printf '  %-14s %s\n' "$tool" "$(command -v "$tool" || echo MISSING)"
done
printf '  %-14s %s\n' boto3 "$(python3 -c 'import boto3; print(boto3.__version__)' 2>&1)"
only observe && printf '  %-14s %s\n' chromium "${CHROMIUM:-MISSING}"

# The counts: a closing `N passed, M failed`, or with E2E_COUNTS_FILE set (scripts/test.sh,
# which prints one closing line for everything) "N M" in that file and a line of another form.
finish() {
  echo
  echo "e2e took $(($(date +%s) - START_TIME)) s"
  if [[ -n ${E2E_COUNTS_FILE:-} ]]; then
    echo "$PASSED $FAILED" >"$E2E_COUNTS_FILE"
    echo "e2e checks: $PASSED ok, $FAILED failed"
  else
    echo "${PASSED} passed, ${FAILED} failed"
  fi
  ((FAILED == 0))
  exit
}
PASSED=0
FAILED=0

# ---------------------------------------------------------------------------------------------
step "e2e: build"
if [[ -n "${BLINDFOLD_BIN:-}" ]]; then
  BIN=$BLINDFOLD_BIN
else
  TARGET_DIR=${CARGO_TARGET_DIR:-target}
  [[ $TARGET_DIR == /* ]] || TARGET_DIR=$ROOT/$TARGET_DIR
  cargo build --quiet --locked -p blindfold || { echo "FAIL - build"; FAILED=1; finish; }
  BIN=$TARGET_DIR/debug/blindfold
fi
echo "  binary: $BIN"
[[ -x $BIN ]] || { echo "FAIL - build: no binary at $BIN"; FAILED=1; finish; }

# ---------------------------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/blindfold-e2e.XXXXXX")
ART_TARGET=${CARGO_TARGET_DIR:-target}
[[ $ART_TARGET == /* ]] || ART_TARGET=$ROOT/$ART_TARGET
ARTEFACTS=${E2E_ARTEFACTS:-$ART_TARGET/browser-artefacts}
SERVER_PID=
cleanup() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
  fi
  # The crash loop runs its own servers; make sure none outlives us.
  if [[ -f $WORK/crash.pid ]]; then
    kill -KILL "$(cat "$WORK/crash.pid")" 2>/dev/null
  fi
  if [[ ${E2E_KEEP:-0} == 1 ]]; then
    echo "work directory kept: $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

AK=e2eaccesskey
SK=e2e-secret-key-0123456789abcdefghijklmnop
CAPACITY=256MiB # 64 MiB uploads fit; the store preallocates ~4x on disk (two slots per cell) (deleting it is slow on ext4 with discard)

# The tests' MinIO (scripts/servers.sh) is what `blindfold report` compares with: keep its
# credentials before the clients' own replace them below.
S3_TEST_AK=${AWS_ACCESS_KEY_ID:-} S3_TEST_SK=${AWS_SECRET_ACCESS_KEY:-}

# Isolate every client from the machine's own AWS/rclone/s3cmd/git configuration.
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_SECURITY_TOKEN AWS_DEFAULT_PROFILE AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3
export AWS_CONFIG_FILE=$WORK/aws-config AWS_SHARED_CREDENTIALS_FILE=$WORK/aws-credentials
# aws CLI v1 presigns with SigV2 unless told otherwise; the gateway takes SigV4 only.
cat >"$AWS_CONFIG_FILE" <<'EOF'
[default]
region = us-east-1
s3 =
  addressing_style = path
  signature_version = s3v4
EOF
: >"$AWS_SHARED_CREDENTIALS_FILE"
export RCLONE_CONFIG=$WORK/rclone.conf
: >"$RCLONE_CONFIG"
export GIT_CONFIG_GLOBAL=$WORK/gitconfig GIT_CONFIG_NOSYSTEM=1
cat >"$GIT_CONFIG_GLOBAL" <<'EOF'
[user]
	name = blindfold e2e
	email = e2e@blindfold.invalid
[init]
	defaultBranch = main
[advice]
	detachedHead = false
EOF
export GIT_TERMINAL_PROMPT=0

# Every client call gets a time limit, so a hung request fails its check instead of the run.
aws() { timeout -k 10 600 aws "$@"; }
rclone() { timeout -k 10 600 env -u AWS_CA_BUNDLE rclone "$@"; }
restic() { timeout -k 10 600 restic "$@"; }
s3cmd() { timeout -k 10 600 s3cmd --config="$WORK/s3cfg" "$@"; }
git() { timeout -k 10 600 git "$@"; }
curl() { timeout -k 10 300 curl "$@"; }

# ---------------------------------------------------------------------------------------------
# Checks: each runs in a subshell with `set -e`; `die` gives the reason. Output goes to a log
# that is shown only when the check fails.
die() { echo "REASON: $*" >&2; exit 1; }
check() {
  local name=$1
  shift
  local log=$WORK/check.log t0=$SECONDS
  (
    set -eo pipefail
    "$@"
  ) 3>&1 >"$log" 2>&1
  local rc=$?
  if ((rc == 0)); then
    echo "ok - $name # $((SECONDS - t0)) s"
    PASSED=$((PASSED + 1))
  else
    local reason
    reason=$(grep '^REASON: ' "$log" | tail -1 | sed 's/^REASON: //')
    [[ -n $reason ]] || reason="exit $rc: $(grep -v '^[[:space:]]*$' "$log" | tail -1)"
    echo "FAIL - $name: $reason"
    tail -n 25 "$log" | sed 's/^/    | /'
    FAILED=$((FAILED + 1))
  fi
}
# Runs a script that prints its own `ok - …` / `FAIL - …` lines and adds them to the counts.
run_checks() {
  local name=$1
  shift
  local log=$WORK/$name.out
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local ok bad
  ok=$(grep -c '^ok - ' "$log")
  bad=$(grep -c '^FAIL - ' "$log")
  PASSED=$((PASSED + ok))
  FAILED=$((FAILED + bad))
  if ((rc != 0 && bad == 0)); then
    echo "FAIL - $name: exited with status $rc without reporting a failed check"
    FAILED=$((FAILED + 1))
  fi
}

# ---------------------------------------------------------------------------------------------
# The server.
ENDPOINT=
ADMIN=
start_server() { # data-dir [more serve flags…]
  local data=$1
  shift
  : >"$WORK/server.out"
  "$BIN" serve --data-dir "$data" --capacity "$CAPACITY" --listen 127.0.0.1:0 \
    --admin-listen 127.0.0.1:0 --swift-listen 127.0.0.1:0 "$@" \
    --access-key "$AK" --secret-key "$SK" >"$WORK/server.out" 2>>"$WORK/server.err" &
  SERVER_PID=$!
  local i
  for ((i = 0; i < 1200; i++)); do
    # The banner: "blindfold <version> serving S3 at http://host:port".
    ENDPOINT=$(sed -n 's/^blindfold .*serving S3 at \(https\{0,1\}:[^ ]*\).*/\1/p' "$WORK/server.out")
    # and "  admin: http://host:port/ (dashboard, …)".
    ADMIN=$(sed -n 's/^  admin: \(https\{0,1\}:[^ ]*\)\/ .*/\1/p' "$WORK/server.out")
    # and "  swift: http://host:port/auth/v1.0 (TempAuth: …)".
    SWIFT_AUTH=$(sed -n 's/^  swift: \(https\{0,1\}:[^ ]*\) .*/\1/p' "$WORK/server.out")
    [[ -n $ENDPOINT && -n $ADMIN ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.05
  done
  echo "server did not become ready; its stderr:"
  tail -20 "$WORK/server.err"
  return 1
}
stop_server() { # SIGTERM, then wait up to 30 s; returns the exit status
  local pid=$SERVER_PID i
  kill -TERM "$pid" 2>/dev/null || return 1
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "server still running 30 s after SIGTERM; killing it"
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    SERVER_PID=
    return 1
  fi
  wait "$pid"
  local rc=$?
  SERVER_PID=
  return $rc
}

# Test data: a tree with nested directories, empty and block-boundary sized files, and names
# with spaces, '+', '=' and non-ASCII letters.
rand_file() { head -c "$2" /dev/urandom >"$1"; }
gen_tree() { # dir
  local d=$1
  mkdir -p "$d/a/b/c" "$d/docs/deep/er/still" "$d/x y"
  rand_file "$d/empty" 0
  rand_file "$d/one" 1
  rand_file "$d/a/block-minus" 4095
  rand_file "$d/a/block" 4096
  rand_file "$d/a/b/block-plus" 4097
  rand_file "$d/a/b/c/big" 1500000
  rand_file "$d/docs/deep/er/still/leaf.bin" 70000
  rand_file "$d/x y/with space.txt" 1234
  rand_file "$d/x y/plus+equals=.dat" 99
  rand_file "$d/docs/ünïcödé-名前.txt" 321
  local i
  for i in $(seq 1 12); do rand_file "$d/docs/small-$i.txt" $((i * 37)); done
}
# A restic source tree: a few MB with many small files.
gen_backup_tree() { # dir
  local d=$1 i
  mkdir -p "$d/small" "$d/nested/one/two" "$d/big"
  for i in $(seq 1 150); do rand_file "$d/small/f$i" $((RANDOM % 3000)); done
  for i in $(seq 1 20); do rand_file "$d/nested/one/two/g$i" $((RANDOM * 3)); done
  rand_file "$d/big/blob1" 3000000
  rand_file "$d/big/blob2" 1200000
  # Compressible data too (restic chunks and dedups it differently).
  python3 -c 'import sys; sys.stdout.write(("blindfold restic e2e line\n" * 40000)[:800000])' >"$d/big/text.txt"
}
same_tree() { # a b
  diff -r "$1" "$2" >"$WORK/diff.out" 2>&1 || { head -20 "$WORK/diff.out"; die "trees differ: $1 vs $2"; }
}
same_file() { # a b
  cmp "$1" "$2" || die "bytes differ: $1 vs $2"
}

# =============================================================================================
# aws CLI
AWSB=s3://e2e-aws
aws_mb() {
  aws --endpoint-url "$ENDPOINT" s3 mb "$AWSB"
  aws --endpoint-url "$ENDPOINT" s3 ls | grep -q ' e2e-aws$' || die "bucket not in 'aws s3 ls'"
}
aws_cp() {
  rand_file "$WORK/aws-small" 10000
  aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/aws-small" "$AWSB/small.bin"
  aws --endpoint-url "$ENDPOINT" s3 cp "$AWSB/small.bin" "$WORK/aws-small.back"
  same_file "$WORK/aws-small" "$WORK/aws-small.back"
}
aws_ls() {
  local out
  out=$(aws --endpoint-url "$ENDPOINT" s3 ls "$AWSB/")
  echo "$out"
  echo "$out" | grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} +10000 small.bin$' ||
    die "'aws s3 ls' does not show small.bin with size 10000 and a date: $out"
}
aws_head_etag() {
  local etag want
  etag=$(aws --endpoint-url "$ENDPOINT" s3api head-object --bucket e2e-aws --key small.bin \
    --query ETag --output text)
  want="\"$(md5sum "$WORK/aws-small" | cut -d' ' -f1)\""
  [[ $etag == "$want" ]] || die "ETag $etag, expected $want"
}
# Bytes `skip`.. of a file, `count` of them (no `tail | head` pipe: `head` exiting first makes
# `tail` die of SIGPIPE, exit 141 under pipefail).
byte_range() { # file skip count
  dd if="$1" bs=4096 iflag=skip_bytes,count_bytes skip="$2" count="$3" status=none
}
aws_range() {
  aws --endpoint-url "$ENDPOINT" s3api get-object --bucket e2e-aws --key small.bin \
    --range bytes=100-199 "$WORK/aws-range" >"$WORK/aws-range.json"
  cat "$WORK/aws-range.json"
  byte_range "$WORK/aws-small" 100 100 >"$WORK/aws-range.want"
  same_file "$WORK/aws-range.want" "$WORK/aws-range"
  grep -q '"ContentRange": "bytes 100-199/10000"' "$WORK/aws-range.json" || die "no/incorrect ContentRange"
  # A range crossing a 4 KiB block boundary and an open-ended suffix range.
  aws --endpoint-url "$ENDPOINT" s3api get-object --bucket e2e-aws --key small.bin \
    --range bytes=4000-8999 "$WORK/aws-range2" >/dev/null
  byte_range "$WORK/aws-small" 4000 5000 >"$WORK/aws-range2.want"
  same_file "$WORK/aws-range2.want" "$WORK/aws-range2"
  aws --endpoint-url "$ENDPOINT" s3api get-object --bucket e2e-aws --key small.bin \
    --range bytes=-300 "$WORK/aws-range3" >/dev/null
  tail -c 300 "$WORK/aws-small" >"$WORK/aws-range3.want"
  same_file "$WORK/aws-range3.want" "$WORK/aws-range3"
}
aws_sync() {
  gen_tree "$WORK/aws-tree"
  local t0=$SECONDS
  aws --endpoint-url "$ENDPOINT" s3 sync "$WORK/aws-tree" "$AWSB/tree"
  # The tree holds an empty file: botocore sends it with "Expect: 100-continue", and a gateway
  # answering that without `Connection: close` made a later PUT wait out botocore's 60 s read
  # timeout (see the boto3 check "empty PUT, then PUT on the same connection").
  ((SECONDS - t0 <= 30)) || die "uploading a 1.7 MB tree took $((SECONDS - t0)) s (a stalled request?)"
  aws --endpoint-url "$ENDPOINT" s3 sync "$AWSB/tree" "$WORK/aws-tree.back"
  same_tree "$WORK/aws-tree" "$WORK/aws-tree.back"
  local n want
  n=$(aws --endpoint-url "$ENDPOINT" s3 ls --recursive "$AWSB/tree/" | wc -l)
  want=$(find "$WORK/aws-tree" -type f | wc -l)
  ((n == want)) || die "listing shows $n objects, tree has $want files"
  # A second sync uploads nothing.
  aws --endpoint-url "$ENDPOINT" s3 sync "$WORK/aws-tree" "$AWSB/tree" >"$WORK/aws-sync2.out"
  [[ ! -s $WORK/aws-sync2.out ]] || { cat "$WORK/aws-sync2.out"; die "unchanged tree re-uploaded"; }
}
aws_sync_changes() {
  rand_file "$WORK/aws-tree/a/block" 5000
  rm "$WORK/aws-tree/docs/small-3.txt"
  rand_file "$WORK/aws-tree/a/b/new file" 777
  aws --endpoint-url "$ENDPOINT" s3 sync --delete "$WORK/aws-tree" "$AWSB/tree"
  rm -rf "$WORK/aws-tree.back2"
  aws --endpoint-url "$ENDPOINT" s3 sync "$AWSB/tree" "$WORK/aws-tree.back2"
  same_tree "$WORK/aws-tree" "$WORK/aws-tree.back2"
}
aws_multipart() {
  rand_file "$WORK/aws-64m" $((64 << 20))
  aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/aws-64m" "$AWSB/big/64m.bin"
  local etag want len
  etag=$(aws --endpoint-url "$ENDPOINT" s3api head-object --bucket e2e-aws --key big/64m.bin \
    --query ETag --output text)
  len=$(aws --endpoint-url "$ENDPOINT" s3api head-object --bucket e2e-aws --key big/64m.bin \
    --query ContentLength --output text)
  ((len == 64 << 20)) || die "ContentLength $len"
  want=$(python3 - "$WORK/aws-64m" <<'EOF'
import hashlib, sys
part = 8 << 20
digests = b""
with open(sys.argv[1], "rb") as f:
    while chunk := f.read(part):
        digests += hashlib.md5(chunk).digest()
print('"%s-%d"' % (hashlib.md5(digests).hexdigest(), len(digests) // 16))
EOF
  )
  [[ $etag == "$want" ]] || die "multipart ETag $etag, expected $want (8 MiB parts)"
  aws --endpoint-url "$ENDPOINT" s3 cp "$AWSB/big/64m.bin" "$WORK/aws-64m.back"
  same_file "$WORK/aws-64m" "$WORK/aws-64m.back"
  rm -f "$WORK/aws-64m.back"
}
aws_presign() {
  local url
  url=$(aws --endpoint-url "$ENDPOINT" s3 presign "$AWSB/small.bin" --expires-in 300)
  echo "$url"
  [[ $url == *X-Amz-Signature=* ]] || die "not a SigV4 presigned URL: $url"
  curl -fsS -o "$WORK/aws-presigned" "$url"
  same_file "$WORK/aws-small" "$WORK/aws-presigned"
  # A tampered signature is refused, and so is the signature of another key.
  local bad code last
  last=${url: -1}
  if [[ $last == 0 ]]; then bad="${url%?}1"; else bad="${url%?}0"; fi
  code=$(curl -s -o "$WORK/aws-presigned-bad" -w '%{http_code}' "$bad")
  [[ $code == 403 ]] || { cat "$WORK/aws-presigned-bad"; die "tampered presigned URL got HTTP $code, expected 403"; }
  bad=${url/small.bin/small.bix}
  code=$(curl -s -o "$WORK/aws-presigned-bad" -w '%{http_code}' "$bad")
  [[ $code == 403 ]] || { cat "$WORK/aws-presigned-bad"; die "presigned URL for another key got HTTP $code, expected 403"; }
  # Unsigned requests are refused.
  code=$(curl -s -o /dev/null -w '%{http_code}' "$ENDPOINT/e2e-aws/small.bin")
  [[ $code == 403 ]] || die "anonymous GET got HTTP $code, expected 403"
}
aws_presign_v2_refused() {
  # What aws CLI v1 makes without signature_version = s3v4: a SigV2 URL, which the gateway
  # refuses on purpose, with a message that says what to do.
  local url code
  url=$(AWS_CONFIG_FILE=/dev/null aws --endpoint-url "$ENDPOINT" s3 presign "$AWSB/small.bin" --expires-in 300)
  echo "$url"
  if [[ $url != *Signature=* || $url == *X-Amz-Signature=* ]]; then
    # A newer aws CLI presigns with SigV4 by default: make the SigV2 URL with botocore.
    url=$(python3 -c 'import sys, boto3; from botocore.config import Config
print(boto3.client("s3", endpoint_url=sys.argv[1], config=Config(signature_version="s3", s3={"addressing_style": "path"})).generate_presigned_url("get_object", Params={"Bucket": "e2e-aws", "Key": "small.bin"}, ExpiresIn=300))' "$ENDPOINT")
    echo "$url"
  fi
  [[ $url == *Signature=* && $url != *X-Amz-Signature=* ]] || die "could not make a SigV2 URL: $url"
  code=$(curl -s -o "$WORK/aws-presigned-v2" -w '%{http_code}' "$url")
  cat "$WORK/aws-presigned-v2"
  [[ $code == 403 ]] || die "SigV2 presigned URL got HTTP $code, expected 403"
  grep -q 'SigV4' "$WORK/aws-presigned-v2" || die "the refusal does not say to use SigV4"
}
aws_rm() {
  aws --endpoint-url "$ENDPOINT" s3 rm --recursive "$AWSB"
  local left
  left=$(aws --endpoint-url "$ENDPOINT" s3 ls --recursive "$AWSB/" | wc -l)
  ((left == 0)) || die "$left objects left after rm --recursive"
  aws --endpoint-url "$ENDPOINT" s3 rb "$AWSB"
  if aws --endpoint-url "$ENDPOINT" s3 ls | grep -q ' e2e-aws$'; then die "bucket still listed after rb"; fi
}

# =============================================================================================
# rclone
rclone_env() {
  export RCLONE_CONFIG_BF_TYPE=s3 RCLONE_CONFIG_BF_PROVIDER=Other RCLONE_CONFIG_BF_ENV_AUTH=false
  export RCLONE_CONFIG_BF_ACCESS_KEY_ID=$AK RCLONE_CONFIG_BF_SECRET_ACCESS_KEY=$SK
  export RCLONE_CONFIG_BF_ENDPOINT=$ENDPOINT RCLONE_CONFIG_BF_FORCE_PATH_STYLE=true
  export RCLONE_CONFIG_BF_REGION=us-east-1
}
rclone_sync() {
  rclone_env
  rclone mkdir bf:e2e-rclone
  gen_tree "$WORK/rclone-tree"
  rclone sync "$WORK/rclone-tree" bf:e2e-rclone/tree
  rclone check "$WORK/rclone-tree" bf:e2e-rclone/tree # sizes and MD5s
  rclone check --download "$WORK/rclone-tree" bf:e2e-rclone/tree # bytes
  rclone copy bf:e2e-rclone/tree "$WORK/rclone-tree.back"
  same_tree "$WORK/rclone-tree" "$WORK/rclone-tree.back"
}
rclone_resync() {
  rclone_env
  rand_file "$WORK/rclone-tree/a/b/c/big" 1600000
  rand_file "$WORK/rclone-tree/one" 2
  rm "$WORK/rclone-tree/docs/small-7.txt"
  rand_file "$WORK/rclone-tree/docs/deep/added" 5555
  rclone sync "$WORK/rclone-tree" bf:e2e-rclone/tree
  rclone check --download "$WORK/rclone-tree" bf:e2e-rclone/tree
  rm -rf "$WORK/rclone-tree.back2"
  rclone copy bf:e2e-rclone/tree "$WORK/rclone-tree.back2"
  same_tree "$WORK/rclone-tree" "$WORK/rclone-tree.back2"
}
rclone_delete() {
  rclone_env
  rclone delete bf:e2e-rclone/tree
  local left
  left=$(rclone lsf -R bf:e2e-rclone | grep -vc '/$' || true)
  ((left == 0)) || die "$left objects left after rclone delete"
  rclone rmdir bf:e2e-rclone
}

# =============================================================================================
# restic
restic_env() {
  export RESTIC_REPOSITORY="s3:$ENDPOINT/e2e-restic" RESTIC_PASSWORD=e2e-restic-password
  export RESTIC_CACHE_DIR=$WORK/restic-cache
}
restic_backup() {
  restic_env
  restic init
  gen_backup_tree "$WORK/restic/data"
  (cd "$WORK/restic" && restic backup --host e2e data)
  restic check
}
restic_restore() {
  restic_env
  rm -rf "$WORK/restic-restore"
  restic restore latest --target "$WORK/restic-restore"
  same_tree "$WORK/restic/data" "$WORK/restic-restore/data"
}
restic_second() {
  restic_env
  local d=$WORK/restic/data
  rand_file "$d/big/blob1" 2500000
  rm "$d/small/f10" "$d/small/f11"
  rand_file "$d/nested/new" 123456
  echo changed >>"$d/big/text.txt"
  (cd "$WORK/restic" && restic backup --host e2e data)
  local n
  n=$(restic snapshots --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  ((n == 2)) || die "$n snapshots, expected 2"
  restic check --read-data
  rm -rf "$WORK/restic-restore"
  restic restore latest --target "$WORK/restic-restore"
  same_tree "$d" "$WORK/restic-restore/data"
}

# =============================================================================================
# s3cmd
s3cmd_cfg() {
  local hostport=${ENDPOINT#http://}
  cat >"$WORK/s3cfg" <<EOF
[default]
access_key = $AK
secret_key = $SK
host_base = $hostport
host_bucket = $hostport
use_https = False
signature_v2 = False
bucket_location = us-east-1
check_ssl_certificate = False
guess_mime_type = False
EOF
}
s3cmd_roundtrip() {
  s3cmd_cfg
  s3cmd mb s3://e2e-s3cmd
  rand_file "$WORK/s3cmd-small" 54321
  rand_file "$WORK/s3cmd-big" $((20 << 20)) # over s3cmd's 15 MiB chunk: a multipart upload
  s3cmd put "$WORK/s3cmd-small" s3://e2e-s3cmd/dir/small
  s3cmd put "$WORK/s3cmd-big" s3://e2e-s3cmd/dir/big
  s3cmd ls s3://e2e-s3cmd/dir/ | tee "$WORK/s3cmd-ls"
  grep -Eq ' 54321 +s3://e2e-s3cmd/dir/small$' "$WORK/s3cmd-ls" || die "ls does not show small (54321 bytes)"
  grep -Eq " $((20 << 20)) +s3://e2e-s3cmd/dir/big$" "$WORK/s3cmd-ls" || die "ls does not show big"
  s3cmd get s3://e2e-s3cmd/dir/small "$WORK/s3cmd-small.back"
  s3cmd get s3://e2e-s3cmd/dir/big "$WORK/s3cmd-big.back"
  same_file "$WORK/s3cmd-small" "$WORK/s3cmd-small.back"
  same_file "$WORK/s3cmd-big" "$WORK/s3cmd-big.back"
}
s3cmd_del() {
  s3cmd_cfg
  s3cmd del s3://e2e-s3cmd/dir/small s3://e2e-s3cmd/dir/big
  local left
  left=$(s3cmd ls -r s3://e2e-s3cmd | wc -l)
  ((left == 0)) || die "$left objects left after del"
  s3cmd rb s3://e2e-s3cmd
}

# =============================================================================================
# git over S3 (git-remote-s3 uses boto3: AWS_ENDPOINT_URL points it at the gateway)
git_push_clone() {
  export AWS_ENDPOINT_URL=$ENDPOINT
  aws s3 mb s3://e2e-git
  local a=$WORK/git-a
  mkdir -p "$a/src/deep"
  git -C "$a" init -q
  echo "hello blindfold" >"$a/README"
  rand_file "$a/src/deep/blob.bin" 300000
  seq 1 5000 >"$a/src/numbers.txt"
  git -C "$a" add -A
  git -C "$a" commit -q -m "first"
  echo "second line" >>"$a/README"
  git -C "$a" commit -q -am "second"
  git -C "$a" remote add origin s3://e2e-git/repo
  git -C "$a" push -u origin main
  git clone s3://e2e-git/repo "$WORK/git-b"
  [[ $(git -C "$a" rev-parse HEAD) == "$(git -C "$WORK/git-b" rev-parse HEAD)" ]] || die "clone HEAD differs"
  diff -r --exclude=.git "$a" "$WORK/git-b" || die "clone work tree differs"
}
git_push_pull() {
  export AWS_ENDPOINT_URL=$ENDPOINT
  local a=$WORK/git-a b=$WORK/git-b
  rand_file "$a/src/another.bin" 100000
  echo "third" >>"$a/README"
  git -C "$a" add -A
  git -C "$a" commit -q -m "third"
  git -C "$a" push origin main
  git -C "$b" pull --ff-only
  [[ $(git -C "$a" rev-parse HEAD) == "$(git -C "$b" rev-parse HEAD)" ]] || die "pulled HEAD differs"
  diff -r --exclude=.git "$a" "$b" || die "pulled work tree differs"
  git -C "$b" fsck --full
}

# =============================================================================================
# Several users: `blindfold user` on the live server's data directory, the aws CLI as each.
user_keys() { # name [more `user add` flags…] → "ACCESS-KEY SECRET-KEY" of the new user
  local out
  out=$("$BIN" user add "$@" --data-dir "$WORK/data")
  printf '%s %s\n' "$(sed -n 's/^  access key: //p' <<<"$out")" \
    "$(sed -n 's/^  secret key: \([^ ]*\).*/\1/p' <<<"$out")"
}
users_policy() {
  local out keys aak ask bak bsk
  keys=$(user_keys alice --buckets 'e2e-team-*')
  read -r aak ask <<<"$keys"
  keys=$(user_keys bob --buckets e2e-team-shared --read-only)
  read -r bak bsk <<<"$keys"
  # (Output is captured before grep: `grep -q` closing the pipe early fails a pipefail.)
  local list
  list=$("$BIN" user list --data-dir "$WORK/data")
  grep -q "^bob .*e2e-team-shared (read only)" <<<"$list" || die "user list: $list"
  if grep -q "$ask" <<<"$list"; then die "user list shows a secret"; fi
  sleep 1.2 # the gateway looks at the users file once a second
  as() { env AWS_ACCESS_KEY_ID="$1" AWS_SECRET_ACCESS_KEY="$2" aws --endpoint-url "$ENDPOINT" "${@:3}"; }
  aws --endpoint-url "$ENDPOINT" s3 mb s3://e2e-admin-only
  rand_file "$WORK/users-file" 12345
  aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/users-file" s3://e2e-admin-only/secret
  as "$aak" "$ask" s3 mb s3://e2e-team-shared
  as "$aak" "$ask" s3 cp "$WORK/users-file" s3://e2e-team-shared/doc
  as "$bak" "$bsk" s3 cp s3://e2e-team-shared/doc "$WORK/users-file.back"
  same_file "$WORK/users-file" "$WORK/users-file.back"
  # Outside a policy: AccessDenied, and nothing changes.
  if as "$aak" "$ask" s3 cp s3://e2e-admin-only/secret - >/dev/null 2>"$WORK/users.err"; then
    die "alice read a bucket outside her policy"
  fi
  grep -q "Forbidden\|AccessDenied" "$WORK/users.err" || die "alice's refusal: $(cat "$WORK/users.err")"
  if as "$bak" "$bsk" s3 cp "$WORK/users-file" s3://e2e-team-shared/new 2>"$WORK/users.err"; then
    die "read-only bob wrote"
  fi
  grep -q AccessDenied "$WORK/users.err" || die "bob's refusal: $(cat "$WORK/users.err")"
  if as "$aak" "$ask" s3api copy-object --copy-source e2e-admin-only/secret --bucket e2e-team-shared \
    --key stolen 2>"$WORK/users.err"; then die "alice copied from a bucket outside her policy"; fi
  # Listings: each user sees only the buckets its policy covers.
  [[ $(as "$aak" "$ask" s3 ls | awk '{print $3}' | tr '\n' ' ') == "e2e-team-shared " ]] || die "alice's bucket list"
  [[ $(as "$bak" "$bsk" s3 ls | awk '{print $3}' | tr '\n' ' ') == "e2e-team-shared " ]] || die "bob's bucket list"
  list=$(aws --endpoint-url "$ENDPOINT" s3 ls)
  grep -q ' e2e-admin-only$' <<<"$list" || die "the administrator's list: $list"
  # Rotation and removal take effect on the running gateway.
  out=$("$BIN" user rotate alice --data-dir "$WORK/data")
  local ask2
  ask2=$(sed -n 's/^  secret key: \([^ ]*\).*/\1/p' <<<"$out")
  "$BIN" user remove bob --data-dir "$WORK/data"
  sleep 1.2
  if as "$aak" "$ask" s3 ls >/dev/null 2>&1; then die "alice's old secret still works"; fi
  list=$(as "$aak" "$ask2" s3 ls)
  grep -q ' e2e-team-shared$' <<<"$list" || die "alice's new secret: $list"
  if as "$bak" "$bsk" s3 ls >/dev/null 2>"$WORK/users.err"; then die "removed bob still signs in"; fi
  grep -q InvalidAccessKeyId "$WORK/users.err" || die "bob's refusal: $(cat "$WORK/users.err")"
  as "$aak" "$ask2" s3 rm --recursive s3://e2e-team-shared
  as "$aak" "$ask2" s3 rb s3://e2e-team-shared
  aws --endpoint-url "$ENDPOINT" s3 rb --force s3://e2e-admin-only
}

# =============================================================================================
# HTTPS: a second server with --tls self-signed; each client trusts its certificate explicitly.
TLS_CERT=
tls_banner() {
  grep -q "^blindfold .*serving S3 at https://" "$WORK/server.out" || die "banner does not say https"
  local fp want
  fp=$(sed -n 's/^  TLS: .* (SHA-256 \([0-9A-F:]*\))$/\1/p' "$WORK/server.out")
  want=$(openssl x509 -in "$TLS_CERT" -noout -fingerprint -sha256 | sed 's/.*=//')
  [[ -n $fp && $fp == "$want" ]] || die "banner fingerprint '$fp', certificate's '$want'"
  [[ $(stat -c %a "$(dirname "$TLS_CERT")/key.pem") == 600 ]] || die "key.pem is not mode 0600"
  curl -fsS --cacert "$TLS_CERT" "$ADMIN/healthz" | grep -q ok || die "admin /healthz over HTTPS"
}
tls_plain_refused() {
  local plain=${ENDPOINT/https:/http:} code
  code=$(curl -s -o "$WORK/tls-plain.out" -w '%{http_code}' "$plain/" || true)
  [[ $code == 400 ]] || die "plain HTTP on the HTTPS port got HTTP $code, expected 400"
  grep -q 'https://' "$WORK/tls-plain.out" || die "the 400 does not say to use https://"
  # Without trusting the certificate, clients refuse the gateway.
  if curl -fsS --cacert /etc/ssl/certs/ca-certificates.crt "$ENDPOINT/" -o /dev/null 2>/dev/null; then
    die "curl accepted the self-signed certificate without being told to trust it"
  fi
}
tls_aws() {
  local e=(--ca-bundle "$TLS_CERT" --endpoint-url "$ENDPOINT")
  aws "${e[@]}" s3 mb s3://e2e-tls
  rand_file "$WORK/tls-file" 3000000
  aws "${e[@]}" s3 cp "$WORK/tls-file" s3://e2e-tls/dir/file
  aws "${e[@]}" s3 cp s3://e2e-tls/dir/file "$WORK/tls-file.back"
  same_file "$WORK/tls-file" "$WORK/tls-file.back"
  grep -q ' 3000000 file$' <<<"$(aws "${e[@]}" s3 ls s3://e2e-tls/dir/)" || die "ls does not show the object"
}
tls_rclone() {
  rclone_env
  rclone --ca-cert "$TLS_CERT" mkdir bf:e2e-tls-rclone
  gen_tree "$WORK/tls-rclone-tree"
  rclone --ca-cert "$TLS_CERT" sync "$WORK/tls-rclone-tree" bf:e2e-tls-rclone/tree
  rclone --ca-cert "$TLS_CERT" check --download "$WORK/tls-rclone-tree" bf:e2e-tls-rclone/tree
}
tls_restic() {
  restic_env
  export RESTIC_REPOSITORY="s3:$ENDPOINT/e2e-tls-restic" RESTIC_CACHE_DIR=$WORK/tls-restic-cache
  restic --cacert "$TLS_CERT" init
  mkdir -p "$WORK/tls-restic"
  gen_tree "$WORK/tls-restic/data"
  (cd "$WORK/tls-restic" && restic --cacert "$TLS_CERT" backup --host e2e data)
  restic --cacert "$TLS_CERT" check --read-data
  rm -rf "$WORK/tls-restic-restore"
  restic --cacert "$TLS_CERT" restore latest --target "$WORK/tls-restic-restore"
  same_tree "$WORK/tls-restic/data" "$WORK/tls-restic-restore/data"
}
tls_s3cmd() {
  s3cmd_cfg
  sed -i -e 's/^use_https = False/use_https = True/' \
    -e 's/^check_ssl_certificate = False/check_ssl_certificate = True/' \
    -e "s|^host_base = https://|host_base = |; s|^host_bucket = https://|host_bucket = |" "$WORK/s3cfg"
  echo "ca_certs_file = $TLS_CERT" >>"$WORK/s3cfg"
  s3cmd mb s3://e2e-tls-s3cmd
  rand_file "$WORK/tls-s3cmd" 77777
  s3cmd put "$WORK/tls-s3cmd" s3://e2e-tls-s3cmd/x
  rm -f "$WORK/tls-s3cmd.back"
  s3cmd get s3://e2e-tls-s3cmd/x "$WORK/tls-s3cmd.back"
  same_file "$WORK/tls-s3cmd" "$WORK/tls-s3cmd.back"
}
tls_git() {
  export AWS_ENDPOINT_URL=$ENDPOINT AWS_CA_BUNDLE=$TLS_CERT
  aws s3 mb s3://e2e-tls-git
  local a=$WORK/tls-git-a b=$WORK/tls-git-b
  mkdir -p "$a"
  git -C "$a" init -q
  rand_file "$a/blob.bin" 100000
  echo "over https" >"$a/README"
  git -C "$a" add -A
  git -C "$a" commit -q -m "first"
  git -C "$a" remote add origin s3://e2e-tls-git/repo
  git -C "$a" push -u origin main
  git clone -q s3://e2e-tls-git/repo "$b"
  [[ $(git -C "$a" rev-parse HEAD) == "$(git -C "$b" rev-parse HEAD)" ]] || die "cloned HEAD differs"
  diff -r --exclude=.git "$a" "$b" || die "cloned work tree differs"
}
tls_reload() {
  local dir new_fp served_fp
  dir=$(dirname "$TLS_CERT")
  # A new certificate written over the files (as a renewal would), then SIGHUP.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=renewed -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$WORK/renewed-key.pem" -out "$WORK/renewed-cert.pem" 2>/dev/null
  cp "$WORK/renewed-key.pem" "$dir/key.pem"
  cp "$WORK/renewed-cert.pem" "$dir/cert.pem"
  new_fp=$(openssl x509 -in "$WORK/renewed-cert.pem" -noout -fingerprint -sha256 | sed 's/.*=//')
  kill -HUP "$SERVER_PID"
  local i
  for ((i = 0; i < 50; i++)); do
    served_fp=$(openssl s_client -connect "${ENDPOINT#https://}" </dev/null 2>/dev/null |
      openssl x509 -noout -fingerprint -sha256 2>/dev/null | sed 's/.*=//')
    [[ $served_fp == "$new_fp" ]] && break
    sleep 0.1
  done
  [[ $served_fp == "$new_fp" ]] || die "after SIGHUP the server presents '$served_fp', not the new '$new_fp'"
  grep -q "SIGHUP: reloaded the certificate" "$WORK/server.err" || die "no reload message"
  grep -q ' file$' <<<"$(aws --ca-bundle "$WORK/renewed-cert.pem" --endpoint-url "$ENDPOINT" s3 ls s3://e2e-tls/dir/)" ||
    die "listing with the renewed certificate"
  # A broken file: the reload is refused and the renewed certificate stays.
  echo broken >"$dir/key.pem"
  kill -HUP "$SERVER_PID"
  for ((i = 0; i < 50; i++)); do
    grep -q "certificate not reloaded" "$WORK/server.err" && break
    sleep 0.1
  done
  grep -q "certificate not reloaded" "$WORK/server.err" || die "a broken key was not reported"
  grep -q ' file$' <<<"$(aws --ca-bundle "$WORK/renewed-cert.pem" --endpoint-url "$ENDPOINT" s3 ls s3://e2e-tls/dir/)" ||
    die "listing with the renewed certificate"
}

# =============================================================================================
# The admin listener: probes answer anyone, everything else wants the S3 keys.
admin_probes() {
  curl -fsS "$ADMIN/healthz" | grep -q ok || die "/healthz did not answer ok"
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/metrics")
  [[ $code == 401 ]] || die "/metrics without credentials got HTTP $code, expected 401"
  curl -fsS -u "$AK:$SK" "$ADMIN/metrics" >"$WORK/metrics.txt"
  grep -q '^blindfold_info{' "$WORK/metrics.txt" || die "no blindfold_info in /metrics"
  grep -q '^blindfold_store_requests_total' "$WORK/metrics.txt" || die "no blindfold_store_requests_total in /metrics"
}

# =============================================================================================
# The Swift front end, with the real python-swiftclient (`swift`), on the same objects as S3.
swift_cli() { timeout -k 10 300 swift -A "$SWIFT_AUTH" "$@"; }
swift_as_admin() { swift_cli -U "blindfold:$AK" -K "$SK" "$@"; }
swift_roundtrip() {
  [[ -n $SWIFT_AUTH ]] || die "the banner has no swift: line"
  swift_as_admin stat
  gen_tree "$WORK/swift-src"
  (cd "$WORK/swift-src" && swift_as_admin upload e2e-swift .)
  local n
  n=$(swift_as_admin list e2e-swift | wc -l)
  [[ $n == $(cd "$WORK/swift-src" && find . -type f | wc -l) ]] || die "swift list shows $n objects"
  swift_as_admin list e2e-swift --prefix docs/ --delimiter / | grep -qx 'docs/deep/' || die "no docs/deep/ subdir in the delimited listing"
  swift_as_admin stat e2e-swift | grep -q "Objects: $n" || die "container stat: $(swift_as_admin stat e2e-swift)"
  swift_as_admin download e2e-swift -D "$WORK/swift-back"
  same_tree "$WORK/swift-src" "$WORK/swift-back"
}
swift_ranges_and_s3() {
  # A token, then raw requests: ranged GET, and the same object through S3.
  local url token
  eval "$(swift_as_admin auth)" # exports OS_STORAGE_URL and OS_AUTH_TOKEN
  url=$OS_STORAGE_URL token=$OS_AUTH_TOKEN
  curl -sf -H "X-Auth-Token: $token" -H "Range: bytes=100-1099" "$url/e2e-swift/a/b/c/big" -o "$WORK/swift-range"
  cmp "$WORK/swift-range" <(byte_range "$WORK/swift-src/a/b/c/big" 100 1000) || die "ranged GET differs"
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-Auth-Token: $token" -H "Range: bytes=9999999-" "$url/e2e-swift/a/b/c/big")
  [[ $code == 416 ]] || die "unsatisfiable range answered $code"
  aws --endpoint-url "$ENDPOINT" s3 cp "s3://e2e-swift/x y/with space.txt" "$WORK/swift-s3"
  same_file "$WORK/swift-src/x y/with space.txt" "$WORK/swift-s3"
  rand_file "$WORK/s3-to-swift" 5000
  aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/s3-to-swift" s3://e2e-swift/from-s3.bin
  swift_as_admin download e2e-swift from-s3.bin -o "$WORK/s3-to-swift.back"
  same_file "$WORK/s3-to-swift" "$WORK/s3-to-swift.back"
  # A wrong ETag stores nothing; a non-empty container is not deleted.
  code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H "X-Auth-Token: $token" -H "ETag: 00000000000000000000000000000000" --data-binary @"$WORK/s3-to-swift" "$url/e2e-swift/bad-etag")
  [[ $code == 422 ]] || die "a wrong ETag answered $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' -I -H "X-Auth-Token: $token" "$url/e2e-swift/bad-etag")
  [[ $code == 404 ]] || die "the object with the wrong ETag exists ($code)"
  code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE -H "X-Auth-Token: $token" "$url/e2e-swift")
  [[ $code == 409 ]] || die "deleting a non-empty container answered $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-Auth-Token: not-a-token" "$url/e2e-swift")
  [[ $code == 401 ]] || die "a bad token answered $code"
}
swift_users() {
  local keys sak ssk rak rsk
  keys=$(user_keys swifty --buckets 'e2e-swift*')
  read -r sak ssk <<<"$keys"
  keys=$(user_keys swiftro --buckets e2e-swift --read-only)
  read -r rak rsk <<<"$keys"
  sleep 1.2 # the gateway looks at the users file once a second
  if swift_cli -U "blindfold:$sak" -K wrong list >/dev/null 2>&1; then die "a wrong key signed in"; fi
  [[ $(swift_cli -U "blindfold:$sak" -K "$ssk" list | tr '\n' ' ') == "e2e-swift " ]] || die "swifty sees: $(swift_cli -U "blindfold:$sak" -K "$ssk" list)"
  swift_cli -U "blindfold:$rak" -K "$rsk" download e2e-swift one -o "$WORK/swift-ro"
  same_file "$WORK/swift-src/one" "$WORK/swift-ro"
  if swift_cli -U "blindfold:$rak" -K "$rsk" upload e2e-swift "$WORK/swift-ro" >"$WORK/swift-ro.err" 2>&1; then
    die "the read-only user uploaded"
  fi
  grep -q 403 "$WORK/swift-ro.err" || die "read-only refusal: $(cat "$WORK/swift-ro.err")"
  if swift_cli -U "blindfold:$sak" -K "$ssk" list e2e-aws >/dev/null 2>&1; then die "swifty listed a bucket outside its policy"; fi
  "$BIN" user remove swifty --data-dir "$WORK/data" >/dev/null
  "$BIN" user remove swiftro --data-dir "$WORK/data" >/dev/null
}
swift_delete() {
  swift_as_admin delete e2e-swift
  if swift_as_admin list | grep -qx e2e-swift; then die "the container is still listed"; fi
}

# Growing the store (blindfold grow, serve --grow-at) while the aws CLI keeps using it.
GROWB=s3://e2e-grow
grow_put() { # name → uploads a fresh 256 KiB file as $GROWB/name (kept in $WORK/grow/name)
  rand_file "$WORK/grow/$1" 262144
  aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/grow/$1" "$GROWB/$1" >/dev/null
}
grow_all_back() { # every file uploaded so far reads back byte for byte
  local f
  for f in "$WORK"/grow/*; do
    aws --endpoint-url "$ENDPOINT" s3 cp "$GROWB/$(basename "$f")" "$WORK/grow.back" >/dev/null
    same_file "$f" "$WORK/grow.back"
  done
}
grow_capacity() { python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(p["blocks"]*p["block_size"])' "$WORK/grow-data/gateway.json"; }
grow_live() {
  mkdir -p "$WORK/grow"
  aws --endpoint-url "$ENDPOINT" s3 mb "$GROWB"
  local i err
  for ((i = 0; i < 100; i++)); do
    if ! err=$(grow_put "f$i" 2>&1); then
      rm -f "$WORK/grow/f$i"
      break
    fi
  done
  ((i >= 4 && i < 100)) || die "the 2 MiB store took $i files of 256 KiB before it was full"
  echo "$err" | grep -q 'blindfold grow' || die "the full store's error does not say how to grow it: $err"
  local out
  out=$("$BIN" grow --data-dir "$WORK/grow-data" --capacity 4MiB) || die "blindfold grow failed: $out"
  echo "$out"
  echo "$out" | grep -q 'grew the store from 2 MiB to 4 MiB' || die "unexpected output: $out"
  [[ $(grow_capacity) == 4194304 ]] || die "gateway.json says $(grow_capacity) bytes"
  for ((j = 0; j < 6; j++)); do grow_put "g$j" || die "upload g$j after the growth failed"; done
  grow_all_back
  out=$("$BIN" grow --data-dir "$WORK/grow-data" --capacity 1MiB 2>&1) && die "shrinking was accepted: $out"
  echo "$out" | grep -q 'shrinking is not supported' || die "unclear refusal: $out"
}
grow_auto() {
  # Restarted with --grow-at 60: already past 60 %, it grows to 8 MiB within seconds.
  local i
  for ((i = 0; i < 100; i++)); do
    grep -q 'grew automatically at 60% full' "$WORK/server.err" && break
    sleep 0.2
  done
  grep 'grew automatically' "$WORK/server.err" || die "no automatic growth within 20 s"
  [[ $(grow_capacity) == 8388608 ]] || die "gateway.json says $(grow_capacity) bytes"
  for ((j = 0; j < 8; j++)); do grow_put "h$j" || die "upload h$j after the automatic growth failed"; done
  grow_all_back
}
grow_verify() {
  "$BIN" verify --data-dir "$WORK/grow-data"
}

# After the clients: a clean stop (in this shell: the server is its child), then verify.
STOP_STATUS=
server_stopped_cleanly() {
  [[ $STOP_STATUS == 0 ]] || die "server exited with status $STOP_STATUS on SIGTERM"
}
verify_after_clients() {
  "$BIN" verify --data-dir "$WORK/data"
}

# =============================================================================================
step "e2e: start blindfold serve"
if ! start_server "$WORK/data"; then
  echo "FAIL - server start: see above"
  FAILED=$((FAILED + 1))
else
  echo "  endpoint: $ENDPOINT"
  echo "  data dir: $WORK/data"
  if only aws; then
    step "e2e: aws CLI"
    check "aws: mb + ls buckets" aws_mb
    check "aws: cp up and down" aws_cp
    check "aws: ls shows size and date" aws_ls
    check "aws: head-object ETag is the MD5" aws_head_etag
    check "aws: ranged get-object" aws_range
    check "aws: sync a nested tree up and down" aws_sync
    check "aws: sync --delete with changes" aws_sync_changes
    check "aws: 64 MiB multipart upload, ETag, download" aws_multipart
    check "aws: presigned GET via curl (SigV4), tampered URLs refused" aws_presign
    check "aws: SigV2 presigned URL (aws CLI v1 default) refused with a clear 403" aws_presign_v2_refused
    check "aws: rm --recursive and rb" aws_rm
  fi
  if only boto3; then
    step "e2e: boto3"
    run_checks boto3 timeout -k 10 900 python3 "$ROOT/tests/e2e/boto3_check.py" \
      --endpoint "$ENDPOINT" --access-key "$AK" --secret-key "$SK"
  fi
  if only rclone; then
    step "e2e: rclone"
    check "rclone: sync a tree, check, copy back" rclone_sync
    check "rclone: modify, sync again, check" rclone_resync
    check "rclone: delete" rclone_delete
  fi
  if only restic; then
    step "e2e: restic"
    check "restic: init, backup, check" restic_backup
    check "restic: restore latest equals the source" restic_restore
    check "restic: second backup, check --read-data, restore" restic_second
  fi
  if only s3cmd; then
    step "e2e: s3cmd"
    check "s3cmd: mb, put (incl. 20 MiB multipart), ls, get" s3cmd_roundtrip
    check "s3cmd: del, rb" s3cmd_del
  fi
  if only git; then
    step "e2e: git-remote-s3"
    check "git: push to s3://, clone" git_push_clone
    check "git: push a commit, pull in the clone" git_push_pull
  fi
  if only swift; then
    step "e2e: Swift API (python-swiftclient) on the same objects"
    check "swift: stat, upload a tree, list (plain, delimited), stat, download equals the source" swift_roundtrip
    check "swift: ranged GET, 416, objects shared with S3 both ways, wrong ETag stores nothing, 409, 401" swift_ranges_and_s3
    check "swift: users' keys and policies (buckets, read-only) apply" swift_users
    check "swift: delete a container with its objects" swift_delete
  fi
  if only users; then
    step "e2e: several users (blindfold user …, the aws CLI as each)"
    check "users: policies enforced (buckets, read-only, copy source), listings filtered, rotate and remove live" users_policy
  fi
  if only observe; then
    step "e2e: admin listener under load (soak + browser)"
    echo "  admin: $ADMIN"
    check "admin: /healthz open, /metrics refused without credentials" admin_probes
    # The soak runs in the background; the browser checks run against the loaded gateway.
    python3 "$ROOT/tests/e2e/soak.py" --endpoint "$ENDPOINT" --admin "$ADMIN" \
      --access-key "$AK" --secret-key "$SK" --clients "${E2E_SOAK_CLIENTS:-256}" \
      --seconds "${E2E_SOAK_SECONDS:-45}" --max-rss-mib 2048 >"$WORK/soak-run.out" 2>&1 &
    SOAK_PID=$!
    sleep 3
    run_checks browser timeout -k 10 600 node "$ROOT/tests/browser/check.mjs" --admin "$ADMIN" \
      --user "$AK" --password "$SK" --out "$ARTEFACTS" --chromium "${CHROMIUM:-/usr/bin/chromium}"
    echo "  browser screenshots: $ARTEFACTS"
    wait "$SOAK_PID"
    SOAK_RC=$?
    run_checks soak cat "$WORK/soak-run.out"
    if ((SOAK_RC != 0)) && ! grep -q '^FAIL - ' "$WORK/soak-run.out"; then
      echo "FAIL - soak: exited with status $SOAK_RC without reporting a failed check"
      FAILED=$((FAILED + 1))
    fi
  fi
  step "e2e: stop and verify"
  stop_server >"$WORK/stop.log" 2>&1
  STOP_STATUS=$?
  check "server: clean exit on SIGTERM" server_stopped_cleanly
  check "verify: data directory after the client tests" verify_after_clients
  if ((FAILED > 0)); then
    echo "server stderr (last 40 lines):"
    tail -40 "$WORK/server.err" | sed 's/^/    | /'
  fi
fi

if only tls; then
  step "e2e: HTTPS (serve --tls self-signed), each client trusting the certificate"
  if ! start_server "$WORK/tls-data" --tls self-signed; then
    echo "FAIL - tls: server start: see above"
    FAILED=$((FAILED + 1))
  else
    TLS_CERT=$WORK/tls-data/tls/cert.pem
    echo "  endpoint: $ENDPOINT"
    check "tls: banner says https:// and the certificate's fingerprint; key 0600; admin over HTTPS" tls_banner
    check "tls: plain HTTP on the HTTPS port gets a 400 saying https; untrusted clients refuse" tls_plain_refused
    check "tls: aws CLI (--ca-bundle): mb, cp up and down, ls" tls_aws
    run_checks boto3-tls env AWS_CA_BUNDLE="$TLS_CERT" SSL_CERT_FILE="$TLS_CERT" \
      timeout -k 10 900 python3 "$ROOT/tests/e2e/boto3_check.py" --label "over HTTPS" \
      --endpoint "$ENDPOINT" --access-key "$AK" --secret-key "$SK"
    check "tls: rclone (--ca-cert): sync, check --download" tls_rclone
    check "tls: restic (--cacert): init, backup, check --read-data, restore" tls_restic
    check "tls: s3cmd (ca_certs_file): mb, put, get" tls_s3cmd
    check "tls: git-remote-s3 (AWS_CA_BUNDLE): push, clone" tls_git
    check "tls: SIGHUP reloads a renewed certificate; a broken one is refused and the old kept" tls_reload
    stop_server >"$WORK/stop.log" 2>&1
    STOP_STATUS=$?
    check "tls: clean exit on SIGTERM" server_stopped_cleanly
  fi
fi

if only grow; then
  step "e2e: growing the store while it serves (blindfold grow, serve --grow-at)"
  if ! CAPACITY=2MiB start_server "$WORK/grow-data"; then
    echo "FAIL - grow: server start: see above"
    FAILED=$((FAILED + 1))
  else
    check "grow: aws CLI fills a 2 MiB store; blindfold grow to 4 MiB while it serves; more uploads; all read back; shrinking refused" grow_live
    stop_server >"$WORK/stop.log" 2>&1
    STOP_STATUS=$?
    check "grow: clean exit on SIGTERM" server_stopped_cleanly
    if ! CAPACITY=2MiB start_server "$WORK/grow-data" --grow-at 60; then
      echo "FAIL - grow: restart with --grow-at: see above"
      FAILED=$((FAILED + 1))
    else
      check "grow: serve --grow-at 60 grows a 4 MiB store past 60 % to 8 MiB by itself; uploads go on; all read back" grow_auto
      stop_server >"$WORK/stop.log" 2>&1
      STOP_STATUS=$?
      check "grow: clean exit on SIGTERM" server_stopped_cleanly
      check "grow: blindfold verify after the growths" grow_verify
    fi
  fi
fi

# The TEE engine (seed 004): the aws CLI against `serve --engine tee`, first with the trusted
# component in the gateway's process (local files), then with it in its own process
# (`blindfold enclave`, cells in its files, reached over remote://).
tee_aws() {
  # Fresh copies: `aws s3 sync` skips files an earlier run left with the same size.
  rm -rf "$WORK/aws-tree" "$WORK/aws-tree.back" "$WORK/aws-small.back"
  aws_mb && aws_cp && aws_range && aws_sync && aws_rm
}
tee_verify() {
  "$BIN" verify --data-dir "$1"
}
ENCLAVE_PID=
start_enclave() { # dir → ENCLAVE_ADDR
  local dir=$1
  mkdir -p "$dir"
  "$BIN" init --key-file "$dir/data/key.json" >/dev/null || return 1
  "$BIN" enclave-key --key-file "$dir/data/key.json" --out "$dir/tee.key" >/dev/null || return 1
  : >"$dir/enclave.out"
  "$BIN" enclave --listen 127.0.0.1:0 --store "file://$dir/cells" --auth-key-file "$dir/auth.key" \
    --generate-auth-key --enclave-key "$dir/tee.key" --enclave-block-size 4KiB \
    >"$dir/enclave.out" 2>"$dir/enclave.err" &
  ENCLAVE_PID=$!
  local i
  for ((i = 0; i < 200; i++)); do
    ENCLAVE_ADDR=$(sed -n 's/^blindfold storage-server listening on \([^ ]*\) .*/\1/p' "$dir/enclave.out")
    [[ -n $ENCLAVE_ADDR ]] && return 0
    sleep 0.05
  done
  echo "the enclave did not start:"
  cat "$dir/enclave.err"
  return 1
}

if only tee; then
  step "e2e: the TEE engine (serve --engine tee), trusted component in the gateway"
  if ! CAPACITY=64MiB start_server "$WORK/tee-data" --engine tee --block-size 4096 --allow-overhead; then
    echo "FAIL - tee: server start: see above"
    FAILED=$((FAILED + 1))
  else
    check "tee: aws mb, cp, ranged get, sync a tree, rm, rb" tee_aws
    stop_server >"$WORK/stop.log" 2>&1
    STOP_STATUS=$?
    check "tee: clean exit on SIGTERM" server_stopped_cleanly
    check "tee: blindfold verify" tee_verify "$WORK/tee-data"
  fi
  step "e2e: the TEE engine with its trusted component in its own process (blindfold enclave)"
  if ! start_enclave "$WORK/tee2"; then
    echo "FAIL - tee: enclave start: see above"
    FAILED=$((FAILED + 1))
  elif ! CAPACITY=64MiB start_server "$WORK/tee2/data" --engine tee --block-size 4096 --allow-overhead \
    --store "remote://$ENCLAVE_ADDR?key_file=$WORK/tee2/auth.key"; then
    echo "FAIL - tee: server start over remote://: see above"
    FAILED=$((FAILED + 1))
  else
    check "tee (remote trusted component): aws mb, cp, ranged get, sync a tree, rm, rb" tee_aws
    stop_server >"$WORK/stop.log" 2>&1
    STOP_STATUS=$?
    check "tee (remote trusted component): clean exit on SIGTERM" server_stopped_cleanly
  fi
  [[ -n $ENCLAVE_PID ]] && kill "$ENCLAVE_PID" 2>/dev/null
fi

# ObliviStore (seed 001) and CURIOUS (seed 003, over levelled and over Path ORAM partitions): the aws CLI against `serve --engine …`; a SIGKILL after
# uploads, then every object acknowledged before it reads back after the restart.
oblivistore_put() {
  rm -rf "$WORK/os-objs" && mkdir -p "$WORK/os-objs"
  aws --endpoint-url "$ENDPOINT" s3 mb s3://e2e-os >/dev/null || return 1
  local i
  for i in 1 2 3 4 5 6; do
    rand_file "$WORK/os-objs/o$i" $((i * 70000))
    aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/os-objs/o$i" "s3://e2e-os/o$i" >/dev/null || return 1
  done
}
oblivistore_read_back() {
  local i
  for i in 1 2 3 4 5 6; do
    aws --endpoint-url "$ENDPOINT" s3 cp "s3://e2e-os/o$i" "$WORK/os-objs/o$i.back" >/dev/null || return 1
    same_file "$WORK/os-objs/o$i" "$WORK/os-objs/o$i.back" || return 1
  done
}

# Offline growth, then a recovery from the store and the key alone into a new directory.
part_grow_recover() { # data-dir
  local dir=$1 out
  out=$("$BIN" grow --data-dir "$dir" --capacity 128MiB 2>&1) || { echo "grow failed: $out"; return 1; }
  echo "$out" | grep -q 'grew the store from 64 MiB to 128 MiB' || { echo "$out"; return 1; }
  rm -rf "$dir-rec"
  out=$("$BIN" recover --data-dir "$dir-rec" --store "file://$dir/cells" --key-file "$dir/key.json" 2>&1) ||
    { echo "recover failed: $out"; return 1; }
  echo "$out" | grep -q "OK: start it with .*--key-file $dir/key.json" || { echo "$out"; return 1; }
  CAPACITY=128MiB start_server "$dir-rec" --key-file "$dir/key.json" || return 1
  oblivistore_read_back || { stop_server >/dev/null 2>&1; return 1; }
  stop_server >/dev/null 2>&1
}

for PART_ENGINE in oblivistore curious curious-path; do
  only "$PART_ENGINE" || continue
  step "e2e: the $PART_ENGINE engine (serve --engine $PART_ENGINE)"
  PART_DIR="$WORK/$PART_ENGINE-data"
  if ! CAPACITY=64MiB start_server "$PART_DIR" --engine "$PART_ENGINE" --block-size 4096 --allow-overhead; then
    echo "FAIL - $PART_ENGINE: server start: see above"
    FAILED=$((FAILED + 1))
    continue
  fi
  check "$PART_ENGINE: aws mb, cp, ranged get, sync a tree, rm, rb" tee_aws
  check "$PART_ENGINE: uploads before a SIGKILL" oblivistore_put
  kill -9 "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  if ! CAPACITY=64MiB start_server "$PART_DIR" --engine "$PART_ENGINE" --block-size 4096 --allow-overhead; then
    echo "FAIL - $PART_ENGINE: restart after SIGKILL: see above"
    FAILED=$((FAILED + 1))
    continue
  fi
  check "$PART_ENGINE: every acknowledged object reads back after the SIGKILL" oblivistore_read_back
  stop_server >"$WORK/stop.log" 2>&1
  STOP_STATUS=$?
  check "$PART_ENGINE: clean exit on SIGTERM" server_stopped_cleanly
  check "$PART_ENGINE: blindfold verify" tee_verify "$PART_DIR"
  check "$PART_ENGINE: blindfold grow to 128 MiB, blindfold recover into a new directory, every object reads back" \
    part_grow_recover "$PART_DIR"
done

# Distributed mode: two `blindfold node` processes (certificates from `blindfold cluster-certs`)
# and `blindfold serve --nodes` as their oblivious load balancer; the aws CLI through it.
NODE_PIDS=()
start_node() { # data-dir tls-dir [engine] → NODE_URL
  local dir=$1 tls=$2 engine=${3:-tao} i
  : >"$dir.out"
  "$BIN" node --listen 127.0.0.1:0 --data-dir "$dir" --tls-dir "$tls" --blocks 4608 --block-size 4096 \
    --engine "$engine" >"$dir.out" 2>"$dir.err" &
  NODE_PIDS+=($!)
  for ((i = 0; i < 600; i++)); do
    NODE_URL=$(sed -n 's/^blindfold node serving at \(https:[^ ]*\).*/\1/p' "$dir.out")
    [[ -n $NODE_URL ]] && return 0
    kill -0 "${NODE_PIDS[-1]}" 2>/dev/null || break
    sleep 0.05
  done
  echo "the node did not start:"
  cat "$dir.err"
  return 1
}
nodes_list() {
  aws --endpoint-url "$ENDPOINT" s3 mb "$AWSB"
  rand_file "$WORK/nodes-obj" 50000
  aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/nodes-obj" "$AWSB/a/one.bin"
  aws --endpoint-url "$ENDPOINT" s3 cp "$WORK/nodes-obj" "$AWSB/a/two.bin"
  local out
  out=$(aws --endpoint-url "$ENDPOINT" s3 ls --recursive "$AWSB/")
  echo "$out"
  [[ $(echo "$out" | grep -Ec ' 50000 a/(one|two)\.bin$') == 2 ]] || die "'aws s3 ls' does not list both objects"
  aws --endpoint-url "$ENDPOINT" s3 cp "$AWSB/a/two.bin" "$WORK/nodes-obj.back"
  same_file "$WORK/nodes-obj" "$WORK/nodes-obj.back"
  aws --endpoint-url "$ENDPOINT" s3 rm --recursive "$AWSB"
  aws --endpoint-url "$ENDPOINT" s3 rb "$AWSB"
}
nodes_verify() { # data-dir node-urls tls-dir
  local out
  # Without the nodes, a clear refusal.
  if out=$("$BIN" verify --data-dir "$1" 2>&1); then
    die "verify without --nodes succeeded: $out"
  fi
  grep -q -- "--nodes" <<<"$out" || die "verify without --nodes: unclear error: $out"
  out=$("$BIN" verify --data-dir "$1" --nodes "$2" --tls-dir "$3" 2>&1) || die "verify failed: $out"
  echo "$out"
  grep -q "OK: every stored cell is authentic" <<<"$out" || die "verify did not say OK"
}
if only nodes; then
  step "e2e: distributed mode (two blindfold node processes behind serve --nodes)"
  mkdir -p "$WORK/nodes"
  N1= N2=
  if ! "$BIN" cluster-certs --out "$WORK/nodes/certs" --nodes 127.0.0.1,127.0.0.1; then
    echo "FAIL - nodes: cluster-certs"
    FAILED=$((FAILED + 1))
  # ObliviStore's distributed setting: ObliviStore nodes (and one TaoStore node: any engine).
  elif ! start_node "$WORK/nodes/n1" "$WORK/nodes/certs/node-1" oblivistore || ! N1=$NODE_URL ||
    ! start_node "$WORK/nodes/n2" "$WORK/nodes/certs/node-2" tao || ! N2=$NODE_URL; then
    echo "FAIL - nodes: node start: see above"
    FAILED=$((FAILED + 1))
  elif ! CAPACITY=32MiB start_server "$WORK/nodes/data" --block-size 4096 --nodes "$N1,$N2" \
    --tls-dir "$WORK/nodes/certs/balancer"; then
    echo "FAIL - nodes: server start with --nodes: see above"
    FAILED=$((FAILED + 1))
  else
    check "nodes: aws mb, cp, ranged get, sync a tree, rm, rb" tee_aws
    check "nodes: aws puts, lists and gets objects" nodes_list
    stop_server >"$WORK/stop.log" 2>&1
    STOP_STATUS=$?
    check "nodes: clean exit on SIGTERM" server_stopped_cleanly
    if CAPACITY=32MiB start_server "$WORK/nodes/data" --nodes "$N2,$N1" --tls-dir "$WORK/nodes/certs/balancer"; then
      check "nodes: restart with the nodes in another order; aws mb, cp, ranged get, sync a tree, rm, rb" tee_aws
      stop_server >"$WORK/stop.log" 2>&1
      check "nodes: blindfold verify through the nodes (and a clear refusal without them)" \
        nodes_verify "$WORK/nodes/data" "$N1,$N2" "$WORK/nodes/certs/balancer"
    else
      echo "FAIL - nodes: restart: see above"
      FAILED=$((FAILED + 1))
    fi
  fi
  for pid in "${NODE_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
fi

# `blindfold report --quick`: every experiment of the thesis at toy sizes, against the tests'
# MinIO (the private cloud and the git workload) when there is one; the report's tables, plots
# and JSON are checked by tests/e2e/check_report.py.
report_quick() {
  local out=$WORK/report s3=()
  if [[ -n "${BLINDFOLD_TEST_S3_ENDPOINT:-}" ]]; then
    s3=(--s3 "s3://$BLINDFOLD_TEST_S3_BUCKET/e2e-report?endpoint=$BLINDFOLD_TEST_S3_ENDPOINT")
  fi
  AWS_ACCESS_KEY_ID=$S3_TEST_AK AWS_SECRET_ACCESS_KEY=$S3_TEST_SK \
    timeout -k 10 900 "$BIN" report --quick --quiet --out "$out" "${s3[@]}" || die "blindfold report --quick failed"
  local git=--git
  [[ ${#s3[@]} -gt 0 ]] || git=--no-git
  python3 "$ROOT/tests/e2e/check_report.py" "$out" "$git"
}
if only report; then
  step "e2e: blindfold report --quick (workloads A-E in both topologies, the git workload)"
  check "report: --quick writes the Markdown report, its plots and JSON, the thesis's figures beside ours" report_quick
fi

if only crash; then
  step "e2e: crash loop (kill -9 under concurrent writes)"
  run_checks crash-self-test python3 "$ROOT/tests/e2e/crash_loop.py" --self-test
  run_checks crash timeout -k 10 900 python3 "$ROOT/tests/e2e/crash_loop.py" \
    --bin "$BIN" --work "$WORK/crash" --pid-file "$WORK/crash.pid" \
    --rounds "${E2E_CRASH_ROUNDS:-20}" --rotate-every "${E2E_CRASH_ROTATE_EVERY:-6}" --grow-every "${E2E_CRASH_GROW_EVERY:-7}" \
    ${E2E_CRASH_SEED:+--seed "$E2E_CRASH_SEED"}
fi

finish
