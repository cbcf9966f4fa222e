#!/usr/bin/env bash
# Runs every check blindfold has: formatting, lints (warnings are errors), the whole test
# suite (model, conformance, tamper and obliviousness tests), and a tiny benchmark smoke run so
# the harness never rots. Installs what it needs; safe to run on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain"
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (https://rustup.rs) first" >&2
  exit 1
fi
cargo --version
for tool in rustfmt cargo-clippy; do
  command -v "$tool" >/dev/null || rustup component add "${tool#cargo-}"
done

export CARGO_TERM_COLOR=never
export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked 2>&1 | tee target/test-output.txt

step "benchmark smoke run (tiny sizes; real figures come from 'blindfold bench')"
cargo run --quiet --locked -p blindfold -- bench path --blocks 2^10 --block-size 256 --ops 500 \
  --quiet --json target/bench-smoke.json
rm -rf target/bench-smoke-store
cargo run --quiet --locked -p blindfold -- bench path --blocks 2^10 --block-size 256 --ops 200 \
  --recursive 64 --cache-levels 2 --store "file://$PWD/target/bench-smoke-store" --quiet

# One closing line that counts every test cargo ran.
passed=$(grep -E '^test result:' target/test-output.txt | awk '{s+=$4} END {print s+0}')
failed=$(grep -E '^test result:' target/test-output.txt | awk '{s+=$6} END {print s+0}')
echo
echo "${passed} passed, ${failed} failed"
