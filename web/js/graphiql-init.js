// Starts the vendored GraphiQL against this server: queries over POST
// /graphql, subscriptions over /graphql/ws (graphql-transport-ws). The session
// cookie goes with both, so a signed-in console user needs no token here; a
// script's token can be set in GraphiQL's headers editor instead.
(function () {
  "use strict";
  var scheme = location.protocol === "https:" ? "wss" : "ws";
  var wsClient = graphqlWs.createClient({
    url: scheme + "://" + location.host + "/graphql/ws",
    lazy: true,
  });
  var fetcher = GraphiQL.createFetcher({ url: "/graphql", wsClient: wsClient });
  var example =
    "# Corbel's API. Signed in to the console, you are signed in here too.\n" +
    "query {\n  serverInfo { version database }\n  me { username }\n}\n\n" +
    "# subscription { serverEvents { __typename } }\n";
  ReactDOM.render(
    React.createElement(GraphiQL, {
      fetcher: fetcher,
      defaultQuery: example,
      defaultEditorToolsVisibility: true,
    }),
    document.getElementById("graphiql"),
  );
  fetch("/graphql", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    credentials: "same-origin",
    body: JSON.stringify({ query: "{ me { username } }" }),
  })
    .then(function (r) { return r.json(); })
    .then(function (body) {
      var who = document.getElementById("who");
      who.textContent = body.data && body.data.me
        ? "Signed in as " + body.data.me.username
        : "Not signed in: sign in to the console, or send a token in the headers editor.";
    })
    .catch(function () {});
})();
