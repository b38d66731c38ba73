#!/usr/bin/env bash
# The crash tests (tests/it/crash.rs), long: many more faults than CI injects,
# a random seed, every violation counted instead of stopping at the first.
# Prints each test's summary line, e.g.
#   chaos: seed=123 kills=50 violations=0 elapsed=412.7s test=the_server_killed_at_random_moments_converges
# and exits non-zero if any violation was found. Runs on SQLite, and again on
# PostgreSQL when CORBEL_TEST_POSTGRES_URL names a server (see scripts/test.sh).
#
# Usage: scripts/soak.sh [SERVER_KILLS [PROVIDER_FAULTS]]
#   SERVER_KILLS     rounds of the server test (default 60; recovery kills come on top)
#   PROVIDER_FAULTS  faults of the provider test (default 20)
#   CORBEL_CHAOS_SEED=n   repeat a run's choices (the seed is printed either way)
# The full output goes to target/soak-<seed>.log.
set -uo pipefail
cd "$(dirname "$0")/.."

server_kills=${1:-60}
provider_faults=${2:-20}
seed=${CORBEL_CHAOS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
log="target/soak-${seed}.log"
mkdir -p target
: >"$log"
echo "soak: seed=$seed server kills=$server_kills provider faults=$provider_faults; log: $log"

if cargo nextest --version >/dev/null 2>&1; then
  run() { cargo nextest run -p corbel --no-capture --no-fail-fast -E "test(=crash::$1)"; }
else
  run() { cargo test -p corbel --test it -- --exact --nocapture "crash::$1"; }
fi

# The tests run the workspace's binaries (the server and the provider).
cargo build --workspace --bins >>"$log" 2>&1 || { echo "soak: the build failed; see $log"; exit 2; }

status=0
soak() { # database, test, faults
  echo "soak: $1: $2, $3 faults"
  CORBEL_CHAOS_SOAK=1 CORBEL_CHAOS_SEED=$seed CORBEL_CHAOS_KILLS=$3 run "$2" >>"$log" 2>&1 || status=1
  summary=$(grep -E "^chaos: seed=.* test=$2\$" "$log" | tail -n 1)
  echo "soak: $1: ${summary:-no summary: the test failed outright (see $log)}"
}

pg_url=${CORBEL_TEST_POSTGRES_URL:-}
for db in sqlite ${pg_url:+postgres}; do
  if [ "$db" = postgres ]; then
    export CORBEL_TEST_POSTGRES_URL=$pg_url
  else
    unset CORBEL_TEST_POSTGRES_URL
  fi
  soak "$db" the_server_killed_at_random_moments_converges "$server_kills"
  soak "$db" the_provider_killed_or_frozen_mid_deploy_converges "$provider_faults"
done

if [ $status -ne 0 ]; then
  echo "soak: violations found, or a test failed; details in $log"
fi
exit $status
