# A repository of versioned elements: here the directory of manifests in
# docs/tour/elements (`web` requires `core`). COPY stores every manifest.
REPO=$(gql 'mutation($path: String!) {
    createRepository(input: {name: "tour", driver: {local: {path: $path}}, syncMode: COPY}) { id } }' \
  "$(jq -n --arg path "$CORBEL_SRC/docs/tour/elements" '{$path}')" | jq -r .createRepository.id)
wait_for 'query($id: ID!) { repository(id: $id) { status statusMessage } }' \
  "{\"id\": \"$REPO\"}" .repository.status ACTIVE
WEB=$(gql '{ elements(filter: {search: "web"}) { edges { node { id name version } } } }' |
  jq -r '.elements.edges[0].node.id')
# What installing `web` brings with it, dependencies first:
gql 'query($id: ID!) { resolveElement(id: $id) { elements { alreadyInstalled element { name version } } } }' \
  "{\"id\": \"$WEB\"}"
# Installing deploys each element's `resources` through the provider:
gql 'mutation($id: ID!) { installElement(id: $id) { status } }' "{\"id\": \"$WEB\"}"
wait_for 'query($id: ID!) { element(id: $id) { status statusMessage } }' \
  "{\"id\": \"$WEB\"}" .element.status ACTIVE
gql '{ elements { edges { node { name version installed dependents { name } } } } }'
