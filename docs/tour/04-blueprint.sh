# A blueprint from a file: its YAML goes in as a GraphQL variable.
BLUEPRINT=$(gql 'mutation($source: String!) {
    createBlueprint(input: {name: "web", source: $source}) { id warnings } }' \
  "$(jq -n --rawfile source "$CORBEL_SRC/docs/tour/blueprint.yaml" '{$source}')" |
  jq -r .createBlueprint.id)
# Deploy it with 3 web replicas; a failure rolls back what the run made.
DEPLOYMENT=$(gql 'mutation($blueprint: ID!) {
    deployBlueprint(input: {blueprintId: $blueprint, name: "web-1", variables: {replicas: 3},
                            onFailure: ROLLBACK}) { id state } }' \
  "{\"blueprint\": \"$BLUEPRINT\"}" | jq -r .deployBlueprint.id)
wait_for 'query($id: ID!) { deployment(id: $id) { state error } }' \
  "{\"id\": \"$DEPLOYMENT\"}" .deployment.state COMPLETE
gql 'query($id: ID!) { deployment(id: $id) { nodes { key replica node state outputs } } }' \
  "{\"id\": \"$DEPLOYMENT\"}"
# Its history, as `deploymentEvents` streams it live:
gql 'query($id: ID!) { deployment(id: $id) { events { kind nodeKey state message } } }' \
  "{\"id\": \"$DEPLOYMENT\"}" | jq -c '.deployment.events[]'
