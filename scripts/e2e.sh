#!/usr/bin/env bash
# End-to-end tests: real S3 and Swift clients against a live `blindfold serve`, looped over every
# engine and over HTTPS, then users, the admin listener under load, growth, `blindfold report
# --quick`, a crash loop and the deploy/ folder (promtool, systemd-analyze, a live Prometheus). The checks are Python: tests/e2e/suite.py (see tests/e2e/README.md);
# this script installs what they need, builds the binary and runs them.
#
# Installs the clients it needs when missing (apt: rclone restic s3cmd git curl; pip: awscli boto3
# git-remote-s3 python-swiftclient, into a virtualenv under the cargo target dir if the system
# Python is managed by apt; chromium, nodejs and npm for the browser checks, and `npm ci` in
# tests/browser), builds the `blindfold` binary (debug profile; honours CARGO_TARGET_DIR) unless
# BLINDFOLD_BIN names one, then execs the suite, which prints one line per check (`ok - name` or
# `FAIL - name: reason`) and a closing `N passed, M failed`, and exits non-zero if any failed.
#
# Knobs (environment), read by the suite: BLINDFOLD_BIN, E2E_ONLY (targets: tao tls path-oram tee
# tee-enclave oblivistore curious curious-path nodes; clients: aws boto3 rclone restic s3cmd git
# swift; extras: users versions observe grow report crash crash-store crash-nodes disk-full deploy), E2E_KEEP=1, E2E_SOAK_SECONDS, E2E_ARTEFACTS,
# E2E_CRASH_ROUNDS, E2E_CRASH_SEED, E2E_COUNTS_FILE ("passed failed" goes there; scripts/test.sh),
# E2E_LANES=1 (everything in one suite process; by default, with E2E_ONLY unset, the suite runs
# in three lanes side by side and then `observe` alone: see the end of this script).
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
command -v openssl >/dev/null || apt_need+=(openssl) # certificates for the tls target
if only deploy; then
  # promtool and prometheus (the suite runs its own on 127.0.0.1; a service the package may
  # start on a machine with systemd is left alone), and systemd-analyze for the unit.
  { command -v prometheus && command -v promtool; } >/dev/null || apt_need+=(prometheus)
  command -v systemd-analyze >/dev/null || apt_need+=(systemd)
  command -v strace >/dev/null || apt_need+=(strace) # the unit's system call filter, checked
fi
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

for tool in aws s3cmd git-remote-s3 swift rclone restic git curl node prometheus promtool systemd-analyze strace; do
  printf '  %-14s %s\n' "$tool" "$(command -v "$tool" || echo MISSING)"
done
printf '  %-14s %s\n' boto3 "$(python3 -c 'import boto3; print(boto3.__version__)' 2>&1)"
only observe && printf '  %-14s %s\n' chromium "${CHROMIUM:-MISSING}"

# ---------------------------------------------------------------------------------------------
step "e2e: build"
build_failed() { # reason: one failed check, counted as the suite would count it
  echo "FAIL - build: $*"
  if [[ -n ${E2E_COUNTS_FILE:-} ]]; then echo "0 1" >"$E2E_COUNTS_FILE"; else echo "0 passed, 1 failed"; fi
  exit 1
}
if [[ -n "${BLINDFOLD_BIN:-}" ]]; then
  BIN=$BLINDFOLD_BIN
else
  TARGET_DIR=${CARGO_TARGET_DIR:-target}
  [[ $TARGET_DIR == /* ]] || TARGET_DIR=$ROOT/$TARGET_DIR
  cargo build --quiet --locked -p blindfold || build_failed "cargo build"
  BIN=$TARGET_DIR/debug/blindfold
fi
[[ -x $BIN ]] || build_failed "no binary at $BIN"
echo "  clients and build: $(($(date +%s) - START_TIME)) s"

# ---------------------------------------------------------------------------------------------
step "e2e: the suite (tests/e2e/suite.py)"
if [[ -n ${E2E_ONLY:-} || ${E2E_LANES:-} == 1 ]]; then
  exec python3 "$ROOT/tests/e2e/suite.py" --bin "$BIN"
fi

# The whole suite in three lanes side by side, then the load-sensitive part alone. Most of
# the suite waits on clients, the store and kill -9 restarts rather than on the CPU, so three
# lanes on two cores take about 60 % of one lane's time. Each lane is its own suite process
# (its own work directory, ports and store prefixes); the soak and the browser (`observe`),
# whose checks measure latency and memory under load, run after them with the machine to
# themselves. E2E_LANES=1 runs everything in one process, in the suite's order.
LANES=(
  "tao tls path-oram tee tee-enclave oblivistore curious versions"
  "crash-store deploy crash-nodes disk-full"
  "crash curious-path nodes grow users report"
)
# Every target and extra of the suite must be in a lane (or be `observe`): one left out
# would silently not run.
left_out=$(python3 - "$ROOT/tests/e2e" "${LANES[*]} observe" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import features
import suite
laned = set(sys.argv[2].split())
print(" ".join(w for w in [t.name for t in suite.TARGETS] + list(features.EXTRAS) if w not in laned))
PY
)
lanes=$(mktemp -d "${TMPDIR:-/tmp}/blindfold-e2e-lanes.XXXXXX")
lane_pids=()
stop_lanes() {
  for pid in "${lane_pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$lanes"
}
trap stop_lanes EXIT
run_lane() { # number, words
  E2E_ONLY=$2 E2E_COUNTS_FILE=$lanes/$1.counts python3 "$ROOT/tests/e2e/suite.py" --bin "$BIN"
}
for i in "${!LANES[@]}"; do
  echo "  lane $((i + 1)): ${LANES[i]}"
done
echo "  (the lanes after the first run in the background; their lines follow lane 1's)"
background=("${!LANES[@]}")
background=("${background[@]:1}")
for i in "${background[@]}"; do
  run_lane "$i" "${LANES[i]}" >"$lanes/$i.out" 2>&1 &
  lane_pids+=($!)
done
run_lane 0 "${LANES[0]}"
for i in "${background[@]}"; do
  wait "${lane_pids[i - 1]}"
  printf '\n==> e2e: lane %d (%s)\n' $((i + 1)) "${LANES[i]}"
  cat "$lanes/$i.out"
done
lane_pids=()
step "e2e: observe, alone (the soak and the browser measure under load)"
observe_run=${#LANES[@]}
run_lane "$observe_run" observe

# One count for the lanes and `observe`; a run that left no count failed before counting (one
# failure).
passed=0
failed=0
if [[ -n $left_out ]]; then
  echo "FAIL - e2e lanes: '$left_out' in no lane of scripts/e2e.sh (add to LANES)"
  failed=1
fi
for ((i = 0; i <= observe_run; i++)); do
  if [[ -s $lanes/$i.counts ]]; then
    read -r p f <"$lanes/$i.counts"
    passed=$((passed + p))
    failed=$((failed + f))
  else
    echo "FAIL - e2e run $((i + 1)): it left no count (it crashed before its closing line)"
    failed=$((failed + 1))
  fi
done
echo
echo "e2e took $(($(date +%s) - START_TIME)) s"
if [[ -n ${E2E_COUNTS_FILE:-} ]]; then
  echo "$passed $failed" >"$E2E_COUNTS_FILE"
  echo "e2e checks: $passed ok, $failed failed"
else
  echo "$passed passed, $failed failed"
fi
((failed == 0))
