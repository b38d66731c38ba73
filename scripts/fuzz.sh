#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers that take outside input (fuzz/): builds
# the targets with cargo-fuzz (libFuzzer, on stable Rust: no sanitizer) and runs
# each for a set time, then prints per target: execs, execs/s, time, coverage
# and crashes found.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Seeds come from fuzz/corpus/<target> and fuzz/regressions/<target> (read
# only); what the fuzzer finds goes to fuzz/corpus-run/<target> (not committed)
# and crashes to fuzz/artifacts/<target>/. A crash stops that target's run; to
# reproduce one: `cd fuzz && cargo fuzz run --sanitizer none -O <target> <file>`.
# Exit status is 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${1:-60}
shift || true
all=(version constraint inventory manifest blueprint template provider_metadata)
targets=("${@:-${all[@]}}")

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

dict_of() {
  case $1 in
    version | constraint) echo dict/version.dict ;;
    inventory) echo dict/json.dict ;;
    template) echo dict/template.dict ;;
    *) echo dict/yaml.dict ;;
  esac
}

echo "==> building ${#targets[@]} targets" >&2
start=$SECONDS
cargo fuzz build --sanitizer none -O
echo "==> built in $((SECONDS - start)) s" >&2

mkdir -p logs
rows=()
failed=0
for t in "${targets[@]}"; do
  mkdir -p "corpus-run/$t" "regressions/$t" "artifacts/$t"
  log="logs/$t.log"
  echo "==> $t for ${seconds} s" >&2
  began=$SECONDS
  status=0
  cargo fuzz run --sanitizer none -O "$t" "corpus-run/$t" "corpus/$t" "regressions/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -dict="$(dict_of "$t")" -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
    >"$log" 2>&1 || status=$?
  took=$((SECONDS - began))
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -n 1)
  rate=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" | tail -n 1)
  cov=$(grep -oP '^#[0-9]+\s.*\bcov: \K[0-9]+' "$log" | tail -n 1)
  ft=$(grep -oP '^#[0-9]+\s.*\bft: \K[0-9]+' "$log" | tail -n 1)
  corp=$(grep -oP '^#[0-9]+\s.*\bcorp: \K[0-9]+' "$log" | tail -n 1)
  artifact=$(grep -oP 'Test unit written to \K\S+' "$log" | tail -n 1 || true)
  if [ "$status" -ne 0 ] || [ -n "$artifact" ]; then
    failed=1
    crashes=1
    echo "    $t: crash or hang, see fuzz/$log${artifact:+ and fuzz/$artifact}" >&2
  else
    crashes=0
  fi
  rows+=("$(printf '%-18s %12s %9s %6s %6s %7s %6s %s' "$t" "${execs:-?}" "${rate:-?}" \
    "${took}s" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes${artifact:+ ($artifact)}")")
done

printf '\n%-18s %12s %9s %6s %6s %7s %6s %s\n' target execs execs/s time cov features corpus crashes
for row in "${rows[@]}"; do echo "$row"; done
exit "$failed"
