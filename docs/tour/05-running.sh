# Is it running? Kill db's process behind Corbel's back...
DB_PID=$(gql 'query($id: ID!) { deployment(id: $id) { nodes { key outputs } } }' \
  "{\"id\": \"$DEPLOYMENT\"}" | jq -r '.deployment.nodes[] | select(.key == "db") | .outputs.pid')
kill -9 "$DB_PID"
# ...Corbel hears of it at once (the process provider watches its services):
# the node is DOWN, saying why, while its state stays COMPLETE.
wait_for 'query($id: ID!) { deployment(id: $id) { health } }' \
  "{\"id\": \"$DEPLOYMENT\"}" .deployment.health DOWN
gql 'query($id: ID!) { deployment(id: $id) { nodes { key state health healthReason } } }' \
  "{\"id\": \"$DEPLOYMENT\"}" | jq -c '.deployment.nodes[] | select(.key == "db")'
# db's restart policy brings it back 2 s later, through the journal, with the
# web replicas that read its pid; the history has the HEALTH events.
wait_for 'query($id: ID!) { deployment(id: $id) { nodes { key health restarts } } }' \
  "{\"id\": \"$DEPLOYMENT\"}" \
  '.deployment.nodes[] | select(.key == "db") | "\(.health) after \(.restarts) restart"' \
  "HEALTHY after 1 restart"
# The restart is a run, as a deploy is: the deployment is IN_PROGRESS until the
# web replicas are replaced too, and COMPLETE again after.
wait_for 'query($id: ID!) { deployment(id: $id) { state } }' \
  "{\"id\": \"$DEPLOYMENT\"}" .deployment.state COMPLETE
# Run a command where db runs, as db would (its environment and working
# directory): execResource answers its output and exit code.
DB_NODE=$(gql 'query($id: ID!) { deployment(id: $id) { nodes { id key } } }' \
  "{\"id\": \"$DEPLOYMENT\"}" | jq -r '.deployment.nodes[] | select(.key == "db") | .id')
gql 'mutation($node: ID!) { execResource(nodeId: $node,
       command: ["sh", "-c", "echo db sees PORT=${PORT:-none}; exit 3"]) { stdout exitCode } }' \
  "{\"node\": \"$DB_NODE\"}"
gql 'query($id: ID!) { deployment(id: $id) { events { kind nodeKey state message } } }' \
  "{\"id\": \"$DEPLOYMENT\"}" | jq -c '.deployment.events[] | select(.kind == "HEALTH")'
