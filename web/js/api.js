// GraphQL over HTTP and one WebSocket, with the session cookie.

export class ApiError extends Error {
  constructor(message, code = "ERROR", extensions = {}) {
    super(message);
    this.code = code;
    this.extensions = extensions;
  }
}

const listeners = new Set();
export function onUnauthenticated(fn) {
  listeners.add(fn);
}

function fail(errors) {
  const first = errors[0];
  const code = first.extensions?.code ?? "ERROR";
  const message = errors.map((e) => e.message).join("; ");
  const error = new ApiError(message, code, first.extensions ?? {});
  if (code === "UNAUTHENTICATED") for (const fn of listeners) fn(error);
  return error;
}

export async function gql(query, variables = {}, headers = {}) {
  const request = { method: "POST", headers: { "Content-Type": "application/json", ...headers }, credentials: "same-origin", body: JSON.stringify({ query, variables }) };
  const response = await fetch("/graphql", request).catch((e) => {
    throw new ApiError(`cannot reach the server: ${e.message}`, "NETWORK");
  });
  const body = await response.json().catch(() => {
    throw new ApiError(`the server answered ${response.status} without JSON`, "BAD_RESPONSE");
  });
  if (body.errors?.length) throw fail(body.errors);
  return body.data;
}

// One socket, reopened after a growing pause.
let socket = null;
let ready = false;
let nextId = 1;
let retry = 0;
const active = new Map(); // id -> { payload, sink }

function open() {
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/graphql/ws`;
  const ws = new WebSocket(url, "graphql-transport-ws");
  socket = ws;
  ready = false;
  ws.onopen = () => ws.send(JSON.stringify({ type: "connection_init", payload: {} }));
  ws.onmessage = (event) => {
    if (ws !== socket) return; // a socket closed on purpose since
    const message = JSON.parse(event.data);
    const entry = active.get(message.id);
    switch (message.type) {
      case "connection_ack":
        ready = true;
        retry = 0;
        for (const id of active.keys()) start(id);
        break;
      case "ping":
        ws.send(JSON.stringify({ type: "pong" }));
        break;
      case "next":
        if (message.payload.errors?.length) entry?.sink.error?.(fail(message.payload.errors));
        else entry?.sink.next(message.payload.data);
        break;
      case "error":
        active.delete(message.id);
        entry?.sink.error?.(fail(message.payload));
        break;
      case "complete":
        active.delete(message.id);
        entry?.sink.complete?.();
        break;
    }
  };
  ws.onclose = () => {
    if (ws !== socket) return; // closed when its last subscription ended
    socket = null;
    ready = false;
    if (active.size === 0) return;
    for (const { sink } of active.values()) sink.reconnecting?.();
    retry = Math.min(retry + 1, 6);
    setTimeout(() => active.size && !socket && open(), 250 * 2 ** retry);
  };
}

function start(id) {
  const entry = active.get(id);
  if (!entry || !socket || !ready) return;
  socket.send(JSON.stringify({ id, type: "subscribe", payload: entry.payload }));
  entry.sink.started?.();
}

/** `sink`: `next(data)`, and optional `error`, `complete`, `reconnecting`, `started`. Returns its end. */
export function subscribe(query, variables, sink) {
  const id = String(nextId++);
  const payload = { query, variables };
  active.set(id, { payload, sink });
  if (!socket) open();
  else start(id);
  return () => {
    if (active.delete(id) && socket && ready) socket.send(JSON.stringify({ id, type: "complete" }));
    if (active.size === 0 && socket) {
      const closing = socket;
      socket = null;
      ready = false;
      closing.close(1000);
    }
  };
}
