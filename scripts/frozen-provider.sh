#!/usr/bin/env bash
# How long a frozen (SIGSTOPped) provider takes to be declared DISCONNECTED,
# with a 1 s health interval: five rounds against the real server and the
# process provider. Needs the workspace binaries: cargo build --workspace --bins
# (or BIN=target/release after a release build). Prints one line per round.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${BIN:-target/debug}")
PORT=${PORT:-18181}
work=$(mktemp -d); trap 'kill $(cat $work/server.pid) 2>/dev/null; rm -rf $work' EXIT
git init -q --bare $work/p.git; git init -q -b main $work/w
cat > $work/w/corbel-provider.yaml <<YAML
name: process
version: 0.1.0
description: p
runtime: shell
shell:
  run: echo \$\$ > provider.pid; exec $BIN/corbel-provider-process
features: [deploy, destroy, inspect, nodes]
resource_types: [process.v1.service]
YAML
(cd $work/w && git add -A && git -c user.name=t -c user.email=t@e commit -qm p && git push -q $work/p.git main)
T=cbl_measure_token_0123456789abcdef
CORBEL_ADMIN_TOKEN=$T CORBEL_DATA_DIR=$work/d CORBEL_LISTEN=127.0.0.1:$PORT CORBEL_PROVIDER_HEALTH_INTERVAL_MS=1000 \
  $BIN/corbel serve >$work/log 2>&1 & echo $! > $work/server.pid
gql() { curl -s localhost:$PORT/graphql -H "authorization: Bearer $T" -H 'content-type: application/json' -d "$1"; }
until curl -sf localhost:$PORT/readyz >/dev/null; do sleep 0.1; done
id=$(gql "{\"query\":\"mutation { createProvider(input: {name: \\\"process\\\", gitUrl: \\\"file://$work/p.git\\\"}) { provider { id } } }\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["createProvider"]["provider"]["id"])')
status() { gql "{\"query\":\"{ provider(id: \\\"$id\\\") { status } }\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["provider"]["status"])'; }
for round in 1 2 3 4 5; do
  until [ "$(status)" = CONNECTED ]; do sleep 0.05; done
  sleep 1.$((RANDOM % 10))
  pid=$(cat $work/d/providers/$id/src/provider.pid)
  start=$(date +%s.%N); kill -STOP $pid
  until [ "$(status)" != CONNECTED ]; do sleep 0.02; done
  end=$(date +%s.%N)
  echo "round $round: frozen provider declared $(status) after $(python3 -c "print(round($end-$start,2))") s"
done
