// The first page: shows serverInfo. Talks only to this server's /graphql.

export async function gql(query, variables = {}) {
  const response = await fetch("/graphql", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    credentials: "same-origin",
    body: JSON.stringify({ query, variables }),
  });
  const body = await response.json();
  if (body.errors && body.errors.length) {
    throw new Error(body.errors.map((e) => e.message).join("; "));
  }
  return body.data;
}

async function showServerInfo() {
  const list = document.getElementById("server-info");
  try {
    const { serverInfo } = await gql(
      "query ServerInfo { serverInfo { version instanceId database startedAt } }",
    );
    for (const [field, value] of Object.entries(serverInfo)) {
      const cell = list.querySelector(`[data-field="${field}"]`);
      if (cell) cell.textContent = value;
    }
    list.dataset.state = "ready";
  } catch (error) {
    list.dataset.state = "error";
    const message = document.getElementById("server-error");
    message.textContent = `Cannot reach the server: ${error.message}`;
    message.hidden = false;
  }
}

showServerInfo();
