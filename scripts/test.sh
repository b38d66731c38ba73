#!/usr/bin/env bash
# The test command: installs and starts what the tests need (scripts/setup.sh),
# builds once, runs the whole suite on SQLite and the tests that exercise the
# store and the engine again on PostgreSQL, then drops the databases it made.
# Works on a fresh Debian machine as root. Prints each phase's time, and the
# slowest tests of each run.
#
# Which tests run on PostgreSQL is one rule, in .config/nextest.toml (the
# `postgres` profile): everything of the integration suite but what does not
# touch the database's behaviour (the browser, the command line client, the
# Docker plumbing, the README's tour). Without cargo-nextest the suite runs
# with `cargo test`, all of it on both databases.
#
#   scripts/test.sh [ARGS…]   ARGS go to each `cargo nextest run` (a filter, say)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/phases.sh
source scripts/lib/phases.sh

phase "setup: packages and services"
pg_url=$(scripts/setup.sh | tail -n 1)
pg_port=${pg_url##*:}
pg_port=${pg_port%%/*}

drop_test_databases() {
  runuser -u postgres -- psql -q -p "$pg_port" -tAc \
    "SELECT datname FROM pg_database WHERE datname LIKE 'corbel\_t\_%'" |
    while read -r db; do
      [ -n "$db" ] && runuser -u postgres -- psql -q -p "$pg_port" -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"
    done
}
trap drop_test_databases EXIT

nextest=false
cargo nextest --version >/dev/null 2>&1 && nextest=true

phase "build: the workspace and its tests"
# Every target at once: the tests' dev-dependencies turn on features of shared
# dependencies, so binaries built alone (`--bins`) would be built again for
# the tests. The provider tests run the workspace's binaries as real
# processes. (In CI, .ci/run has built all of this already, with clippy.)
cargo build --workspace --all-targets --locked

phase "build: the process provider in release (the tour loads it)"
# The tour loads providers/process from this clone, whose corbel-provider.yaml
# builds it in release into CARGO_TARGET_DIR: its dependencies are built here
# once, so that the tour compiles only the provider's own crates.
cargo build --release --locked -p corbel-provider-process

# The slowest tests of the run just ended, from nextest's JUnit report (in
# the workspace's target/nextest, wherever CARGO_TARGET_DIR points).
slowest() {
  local report=$1
  [ -f "$report" ] || return 0
  python3 - "$report" <<'EOF' || true
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), c.get("classname", ""), c.get("name", ""))
         for c in ET.parse(sys.argv[1]).iter("testcase")]
total = sum(t for t, _, _ in cases)
print(f"    {len(cases)} tests, {total:.0f} s of test time; the slowest:")
for t, binary, name in sorted(cases, reverse=True)[:8]:
    print(f"    {t:7.1f}s  {binary} {name}")
EOF
}

status=0

phase "tests on SQLite"
if $nextest; then
  env -u CORBEL_TEST_POSTGRES_URL cargo nextest run --workspace --locked --no-fail-fast "$@" || status=1
  slowest target/nextest/default/junit.xml
else
  env -u CORBEL_TEST_POSTGRES_URL cargo test --workspace --locked --no-fail-fast "$@" || status=1
fi

phase "tests on PostgreSQL (port $pg_port)"
if $nextest; then
  CORBEL_TEST_POSTGRES_URL="$pg_url" cargo nextest run --workspace --locked --no-fail-fast \
    --profile postgres "$@" || status=1
  slowest target/nextest/postgres/junit.xml
else
  CORBEL_TEST_POSTGRES_URL="$pg_url" cargo test -p corbel --test it --locked --no-fail-fast "$@" || status=1
fi

phases_end
exit $status
