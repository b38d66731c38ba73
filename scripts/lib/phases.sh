# Timed phases, for CI and the test command (sourced, not run).
#
#   phase NAME     ends the phase under way, printing its time, and starts NAME
#   phase_done     ends the phase under way
#   phases_end     ends the last phase and prints every phase with its time and
#                  its share of the whole
#
# The phases go to $CORBEL_PHASES (a file), so that a script that runs another
# (.ci/run runs scripts/test.sh) prints one table of both at the end.

export CORBEL_PHASES=${CORBEL_PHASES:-$(mktemp -t corbel-phases.XXXXXX)}
_phase_name=
_phase_start=

phase() {
  _phase_close
  _phase_name=$1
  _phase_start=$(date +%s)
  printf '\n==> %s  (%s)\n' "$1" "$(date +%T)"
}

_phase_close() {
  [ -n "$_phase_name" ] || return 0
  local took=$(($(date +%s) - _phase_start))
  printf '%s\t%s\n' "$took" "$_phase_name" >>"$CORBEL_PHASES"
  printf '==> %s: %ss\n' "$_phase_name" "$took"
  _phase_name=
}

phase_done() {
  _phase_close
}

phases_end() {
  _phase_close
  local total
  total=$(awk -F'\t' '{ s += $1 } END { print s + 0 }' "$CORBEL_PHASES")
  printf '\n==> phases (%ss in all)\n' "$total"
  awk -F'\t' -v total="$total" \
    '{ printf "  %5ss %4.0f%%  %s\n", $1, (total ? 100 * $1 / total : 0), $2 }' "$CORBEL_PHASES"
}
