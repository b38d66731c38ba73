#!/usr/bin/env bash
# Installs and starts what the test suite needs, on a fresh Debian machine as
# root; does nothing for what is already there. Run by scripts/test.sh (and by
# .ci/run, before the first compile). Needs: PostgreSQL (the server), nginx
# (repository tests), Chromium and chromedriver (the web console's tests),
# Python 3 with grpcio (the Python example provider), a Docker engine (the
# docker runtime's and the docker provider's tests; they fail without it) and
# busybox-static (their container image). The partition test runs replicas and
# PostgreSQL (the package's binaries, mounted from the host's /usr) in
# containers of that image.
#
# Prints, as its last line, the URL of a PostgreSQL role the tests may make
# databases with (`CORBEL_TEST_POSTGRES_URL`).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

need_apt=()
command -v pg_ctlcluster >/dev/null 2>&1 || need_apt+=(postgresql)
[ -x /usr/sbin/nginx ] || need_apt+=(nginx)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# The console's tests drive Chromium through WebDriver.
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
command -v git >/dev/null 2>&1 || need_apt+=(git)
# The README's tour (tests/it/tour.rs) is bash with curl and jq.
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v jq >/dev/null 2>&1 || need_apt+=(jq)
# git2's https and ssh transports build against OpenSSL.
dpkg -s libssl-dev >/dev/null 2>&1 || need_apt+=(libssl-dev pkg-config)
# The docker runtime's tests build images FROM scratch (no registry is needed)
# with a stripped provider binary.
command -v docker >/dev/null 2>&1 || need_apt+=(docker.io)
command -v strip >/dev/null 2>&1 || need_apt+=(binutils)
# The docker provider's tests run containers of Debian's static busybox on
# nothing (tests/it/support/docker.rs builds the image).
[ -x /bin/busybox ] || need_apt+=(busybox-static)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# The Python example provider (providers/examples/python) needs grpcio and
# grpcio-tools; Debian's python3 is "externally managed", hence the flag.
if ! python3 -m pip --version >/dev/null 2>&1; then
  log "installing python3 and pip from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3 python3-pip >/dev/null
fi
if ! python3 -c 'import grpc, grpc_tools' >/dev/null 2>&1; then
  log "installing grpcio and grpcio-tools from PyPI"
  python3 -m pip install -q grpcio grpcio-tools 2>/dev/null ||
    python3 -m pip install -q --break-system-packages grpcio grpcio-tools
fi

# The Docker engine: used if it answers, else started here (its log in /tmp).
if ! docker info >/dev/null 2>&1; then
  log "starting the Docker engine"
  if command -v systemctl >/dev/null 2>&1 && systemctl start docker 2>/dev/null; then
    :
  else
    nohup dockerd >/tmp/corbel-test-dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "the Docker engine did not start; see /tmp/corbel-test-dockerd.log" >&2; exit 1; }
fi

# PostgreSQL: the Debian cluster, started if it is not running, and a role for us.
pg_version=$(ls /etc/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h | awk -v v="$pg_version" '$1 == v && $2 == "main" && $4 == "online"' | grep -q .; then
  log "starting PostgreSQL $pg_version"
  pg_ctlcluster "$pg_version" main start
fi
pg_port=$(pg_lsclusters -h | awk -v v="$pg_version" '$1 == v && $2 == "main" { print $3 }')
runuser -u postgres -- psql -q -p "$pg_port" -tAc \
  "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'corbel_test') THEN
     CREATE ROLE corbel_test LOGIN PASSWORD 'corbel_test' CREATEDB; END IF; END \$\$;"
echo "postgres://corbel_test:corbel_test@127.0.0.1:${pg_port}/postgres"
