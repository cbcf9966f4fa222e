# shellcheck shell=bash
# Real storage servers for the tests: a throwaway MinIO (S3) and Redis on 127.0.0.1, on free
# high ports, with data in a temporary directory (under /dev/shm if there is one, else $TMPDIR;
# $BLINDFOLD_SERVERS_DIR overrides). Source this file, then:
#
#   servers_start   # installs what is missing, starts both, exports the variables below
#   servers_stop    # stops both and deletes their data (test.sh runs it from an EXIT trap)
#
# Exports for the tests (crates/blindfold-store/tests/real_servers.rs and others):
#   BLINDFOLD_TEST_S3_ENDPOINT   http://127.0.0.1:PORT
#   BLINDFOLD_TEST_S3_BUCKET     blindfold-test (created empty)
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION   MinIO's credentials
#   BLINDFOLD_TEST_REDIS_URL     redis://:PASSWORD@127.0.0.1:PORT/0
#
# MinIO is built from source with `go install` (about 5 minutes the first time) into
# $BLINDFOLD_CACHE/bin (default ~/.cache/blindfold/bin) and reused from there. Redis comes
# from apt (`redis-server`) when it is not installed. With CI=true a server that cannot be
# started is an error; otherwise the tests that need it print a notice and skip.

BLINDFOLD_CACHE="${BLINDFOLD_CACHE:-$HOME/.cache/blindfold}"
SERVERS_DIR=""
MINIO_PID=""
REDIS_PID=""

servers_log() { printf '    [servers] %s\n' "$*"; }

# A TCP port on 127.0.0.1 that nothing listens on, outside the kernel's range for the local
# ports of outgoing connections (a port one of those holds refuses the server's bind although
# nothing listens on it; CI once failed so).
servers_free_port() {
  local port lo=20000 hi=59999 elo ehi
  if read -r elo ehi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null; then
    if ((elo - 1 - lo >= 2000)); then
      hi=$((elo - 1))
    elif ((65000 - ehi >= 2000)); then
      lo=$((ehi + 1)) hi=65000
    fi
  fi
  for _ in $(seq 1 100); do
    port=$((lo + RANDOM % (hi - lo + 1)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

# Waits up to $2 seconds for command $1 to succeed.
servers_wait() {
  local deadline=$((SECONDS + $2))
  until eval "$1" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then return 1; fi
    sleep 0.2
  done
}

servers_minio_binary() {
  local bin="$BLINDFOLD_CACHE/bin/minio"
  if [[ -x "$bin" ]]; then
    echo "$bin"
    return 0
  fi
  if command -v minio >/dev/null; then
    command -v minio
    return 0
  fi
  if ! command -v go >/dev/null; then
    servers_log "installing Go (apt) to build MinIO" >&2
    apt-get update -qq >&2 && apt-get install -y -qq golang-go >&2 || return 1
  fi
  servers_log "building MinIO with 'go install github.com/minio/minio@latest' (about 5 minutes; cached in $BLINDFOLD_CACHE/bin)" >&2
  mkdir -p "$BLINDFOLD_CACHE/bin"
  GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOBIN="$BLINDFOLD_CACHE/bin" \
    go install github.com/minio/minio@latest >&2 || return 1
  echo "$bin"
}

servers_start_minio() {
  local minio port console user password
  minio=$(servers_minio_binary) || { servers_log "cannot install MinIO"; return 1; }
  port=$(servers_free_port) && console=$(servers_free_port) || return 1
  user="blindfold-test"
  password="pw-$RANDOM$RANDOM$RANDOM"
  mkdir -p "$SERVERS_DIR/minio"
  MINIO_ROOT_USER="$user" MINIO_ROOT_PASSWORD="$password" MINIO_BROWSER=off \
    "$minio" server "$SERVERS_DIR/minio" --quiet \
    --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" \
    >"$SERVERS_DIR/minio.log" 2>&1 &
  MINIO_PID=$!
  if ! servers_wait "curl -fsS http://127.0.0.1:$port/minio/health/ready" 60; then
    servers_log "MinIO did not become ready; its log:"
    tail -20 "$SERVERS_DIR/minio.log" >&2
    return 1
  fi
  # Create the test bucket with a SigV4-signed PUT (curl signs it; no MinIO client needed).
  if ! curl -fsS -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" --user "$user:$password" \
    "http://127.0.0.1:$port/blindfold-test" >/dev/null; then
    servers_log "cannot create the test bucket"
    return 1
  fi
  export BLINDFOLD_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
  export BLINDFOLD_TEST_S3_BUCKET="blindfold-test"
  export AWS_ACCESS_KEY_ID="$user"
  export AWS_SECRET_ACCESS_KEY="$password"
  export AWS_REGION="us-east-1"
  servers_log "MinIO $("$minio" --version 2>/dev/null | head -1 | awk '{print $3}') on $BLINDFOLD_TEST_S3_ENDPOINT (pid $MINIO_PID)"
}

servers_start_redis() {
  local port password
  if ! command -v redis-server >/dev/null; then
    servers_log "installing redis-server (apt)"
    { apt-get update -qq && apt-get install -y -qq redis-server; } >/dev/null ||
      { servers_log "cannot install redis-server"; return 1; }
  fi
  password="pw-$RANDOM$RANDOM$RANDOM"
  local attempt
  for attempt in 1 2 3; do
    port=$(servers_free_port) || return 1
    redis-server --bind 127.0.0.1 --port "$port" --requirepass "$password" \
      --save '' --appendonly no --dir "$SERVERS_DIR" --daemonize no \
      >"$SERVERS_DIR/redis.log" 2>&1 &
    REDIS_PID=$!
    if servers_wait "REDISCLI_AUTH=$password redis-cli -h 127.0.0.1 -p $port ping | grep -q PONG" 20; then
      break
    fi
    kill "$REDIS_PID" 2>/dev/null
    # Taken between the check and the bind: another port.
    if ((attempt < 3)) && grep -q "Address already in use" "$SERVERS_DIR/redis.log"; then
      servers_log "port $port was taken; trying another"
      continue
    fi
    servers_log "Redis did not answer; its log:"
    tail -20 "$SERVERS_DIR/redis.log" >&2
    return 1
  done
  export BLINDFOLD_TEST_REDIS_URL="redis://:$password@127.0.0.1:$port/0"
  servers_log "$(redis-server --version | awk '{print $1, $2, $3}') on 127.0.0.1:$port (pid $REDIS_PID)"
}

servers_start() {
  # The servers' data lives in memory (/dev/shm) when there is one: the tests write little, and
  # starting, running and deleting are then quick. Set BLINDFOLD_SERVERS_DIR to use a disk.
  local parent="${BLINDFOLD_SERVERS_DIR:-}"
  if [[ -z "$parent" ]]; then
    if [[ -d /dev/shm && -w /dev/shm ]]; then parent=/dev/shm; else parent="${TMPDIR:-/tmp}"; fi
  fi
  SERVERS_DIR=$(mktemp -d "$parent/blindfold-servers.XXXXXX")
  local failed=0
  servers_start_minio || failed=1
  servers_start_redis || failed=1
  if ((failed)); then
    if [[ "${CI:-}" == "true" ]]; then
      servers_log "a test server could not be started (CI=true: this is an error)"
      return 1
    fi
    servers_log "a test server could not be started; the tests that need it will skip"
  fi
  return 0
}

servers_stop() {
  local pid
  for pid in "$MINIO_PID" "$REDIS_PID"; do
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  MINIO_PID=""
  REDIS_PID=""
  if [[ -n "$SERVERS_DIR" ]]; then
    rm -rf "$SERVERS_DIR"
    SERVERS_DIR=""
  fi
}
