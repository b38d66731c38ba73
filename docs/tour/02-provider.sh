# The process provider (resources as local processes), loaded from this
# clone's providers/process. Its first load builds it: with the server's
# build directory shared, only the provider's own crates (about a minute).
PROVIDER=$(gql 'mutation($src: String!) {
    createProvider(input: {name: "process", gitUrl: $src, path: "providers/process"}) {
      provider { id } } }' "$(jq -n --arg src "$CORBEL_SRC" '{$src}')" |
  jq -r .createProvider.provider.id)
# FETCHING → BUILDING → STARTING → REGISTERING → CONNECTED:
wait_for 'query($id: ID!) { provider(id: $id) { status statusMessage } }' \
  "{\"id\": \"$PROVIDER\"}" .provider.status CONNECTED
gql 'query($id: ID!) { provider(id: $id) { resolvedCommit resourceTypes nodes { name capacity } } }' \
  "{\"id\": \"$PROVIDER\"}"
