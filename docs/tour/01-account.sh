# Anyone may ask what the server is; everything else needs a token.
curl -sS "$CORBEL/graphql" -H 'content-type: application/json' \
  -d '{"query": "{ serverInfo { version database } }"}'; echo
gql '{ me { username } }'
# A password, for signing in to the web UI (or `login` for a session token):
gql 'mutation { setPassword(newPassword: "correct horse battery") }'
gql 'mutation { login(username: "admin", password: "correct horse battery") { user { username } } }'
# A token of its own for a script or CI, shown only this once:
gql 'mutation { createApiToken(name: "ci") { token } }' | jq -r .createApiToken.token
