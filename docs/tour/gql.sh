# The tour's two shell helpers (bash, with curl and jq). Source this file after
# setting CORBEL (the server's URL) and TOKEN (the admin token it printed).

# gql QUERY [VARIABLES]: one GraphQL request with the token; prints `data`, or
# the errors, and fails, if there are any.
gql() {
  jq -n --arg query "$1" --argjson variables "${2:-null}" '{$query, $variables}' |
    curl -sS "$CORBEL/graphql" -H "authorization: Bearer $TOKEN" \
      -H 'content-type: application/json' --data-binary @- |
    jq -e 'if .errors then (.errors | tostring + "\n" | halt_error) else .data end'
}

# wait_for QUERY VARIABLES FIELD WANTED: asks QUERY every second until FIELD (a
# jq path into the answer) is WANTED, saying each new value; fails, printing
# the answer, when it becomes FAILED or ERROR.
wait_for() {
  local seen="" now
  while :; do
    now=$(gql "$1" "$2" | jq -r "$3")
    [ "$now" = "$seen" ] || echo "$3: $now"
    seen=$now
    case $now in
      "$4") return 0 ;;
      FAILED | ERROR) gql "$1" "$2" >&2; return 1 ;;
    esac
    sleep 1
  done
}
