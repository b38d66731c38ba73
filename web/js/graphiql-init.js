// Starts the vendored GraphiQL against this server: queries over POST
// /graphql, subscriptions over /graphql/ws (graphql-transport-ws). The session
// cookie goes with both, so a signed-in console user needs no token here; a
// script's token can be set in GraphiQL's headers editor instead.
"use strict";
{
  const wsClient = graphqlWs.createClient({ url: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/graphql/ws`, lazy: true });
  const defaultQuery =
    "# Corbel's API. Signed in to the console, you are signed in here too.\n" +
    "query {\n  serverInfo { version database }\n  me { username }\n}\n\n" +
    "# subscription { serverEvents { __typename } }\n";
  const fetcher = GraphiQL.createFetcher({ url: "/graphql", wsClient });
  ReactDOM.render(React.createElement(GraphiQL, { fetcher, defaultQuery, defaultEditorToolsVisibility: true }), document.getElementById("graphiql"));
  fetch("/graphql", { method: "POST", headers: { "Content-Type": "application/json" }, credentials: "same-origin", body: JSON.stringify({ query: "{ me { username } }" }) })
    .then((r) => r.json())
    .then(({ data }) => {
      document.getElementById("who").textContent = data?.me
        ? `Signed in as ${data.me.username}`
        : "Not signed in: sign in to the console, or send a token in the headers editor.";
    })
    .catch(() => {});
}
