# Destroy the deployment (dependents first) and uninstall the elements
# (refused while another installed element depends on one).
gql 'mutation($id: ID!) { destroyDeployment(id: $id) { state } }' "{\"id\": \"$DEPLOYMENT\"}"
wait_for 'query($id: ID!) { deployment(id: $id) { state error } }' \
  "{\"id\": \"$DEPLOYMENT\"}" .deployment.state DESTROYED
CORE=$(gql '{ elements(filter: {search: "core"}) { edges { node { id } } } }' |
  jq -r '.elements.edges[0].node.id')
gql 'mutation($id: ID!) { uninstallElement(id: $id) { status } }' "{\"id\": \"$CORE\"}" ||
  echo "refused, as expected: web depends on core"
gql 'mutation($id: ID!) { uninstallElement(id: $id) { installed } }' "{\"id\": \"$WEB\"}"
gql 'mutation($id: ID!) { uninstallElement(id: $id) { installed } }' "{\"id\": \"$CORE\"}"
