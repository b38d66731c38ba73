// "Run a command" in a deployed node's panel: a command over the /exec
// websocket (the session cookie, this origin), its stdout and stderr shown as
// they come, then its exit status. Closing the socket kills the command.

import { allows } from "../app.js";
import { errorSlot, field, h, invalid, note, replace } from "../dom.js";

/** Output kept in the page, its end: characters (about 1 MiB) and lines (each a layout's cost). */
const LIMIT = 1 << 20;
const LINES = 10000;
const STREAMS = { 1: "stdout", 2: "stderr" };

/** A command line's words as a shell splits a simple one: blanks, '…', "…" (\ escapes \ " $ `), \ outside quotes. */
export function shellWords(line) {
  const out = [];
  let word = null; // null: between words
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (/\s/.test(c)) {
      if (word !== null) out.push(word);
      word = null;
    } else if (c === "'" || c === '"') {
      const end = c === "'" ? line.indexOf("'", i + 1) : closing(line, i + 1);
      if (end < 0) throw invalid(`command: a ${c} is not closed`);
      const inside = line.slice(i + 1, end);
      word = (word ?? "") + (c === "'" ? inside : inside.replace(/\\([\\"$`])/g, "$1"));
      i = end;
    } else if (c === "\\" && i + 1 < line.length) {
      word = (word ?? "") + line[++i];
    } else word = (word ?? "") + c;
  }
  if (word !== null) out.push(word);
  return out;
}

const closing = (line, from) => {
  for (let i = from; i < line.length; i++) {
    if (line[i] === "\\") i++;
    else if (line[i] === '"') return i;
  }
  return -1;
};

/** Where the output kept starts in `parts` (`{ text }`, oldest first): `[index, offset]`. */
function keptFrom(parts) {
  let room = LIMIT;
  let breaks = LINES;
  for (let i = parts.length - 1; i >= 0; i--) {
    const t = parts[i].text;
    const cut = t.length - room; // ≥ 0: the characters' limit falls in this part
    for (let end = t.length; end > Math.max(cut, 0); ) {
      const nl = t.lastIndexOf("\n", end - 1);
      if (nl < Math.max(cut, 0)) break;
      if (--breaks < 0) return [i, nl + 1];
      end = nl;
    }
    if (cut >= 0) return [i, cut];
    room -= t.length;
  }
  return [0, 0];
}

/** What an exit says: its status, the signal that ended it, a timeout. */
function ending({ code, signal, timedOut }) {
  if (timedOut) return `Timed out: stopped${signal ? ` by ${signal}` : ""}`;
  return signal ? `Ended by signal ${signal}` : `Exit status ${code}`;
}

/**
 * `(node, role) =>` the node's "Run a command" (null where its provider
 * cannot exec or it is not deployed; why not, for a role below DEVELOPER),
 * one per node, kept across the panel's redraws so a command keeps
 * streaming; leaving the page stops them.
 */
export function commandRunner(scope) {
  const made = new Map(); // node id → { el, stop }
  scope.onDispose(() => made.forEach((r) => r.stop?.()));
  return (n, role) => {
    if (!n.provider?.features?.includes("exec") || !["COMPLETE", "SUSPENDED"].includes(n.state)) return null;
    if (!allows(role, "DEVELOPER")) {
      return h("div#run-command.run-command", h("h3", "Run a command"),
        h("p#exec-refused.muted", `Running a command here needs the DEVELOPER role in this deployment's project; yours is ${role ?? "none"}.`));
    }
    if (!made.has(n.id)) made.set(n.id, runner(n.id));
    return made.get(n.id).el;
  };
}

function runner(nodeId) {
  const line = h("input#exec-command", { autocomplete: "off", spellcheck: "false", required: true, placeholder: "e.g. ls -la /tmp" });
  const viaShell = h("input#exec-shell", { type: "checkbox", checked: true });
  const limit = h("input#exec-timeout", { type: "number", min: 0, step: 1, placeholder: "none", inputmode: "numeric" });
  const run = h("button#exec-run", { type: "submit" }, "Run");
  const stop = h("button#exec-stop.secondary", { type: "button", hidden: true }, "Stop");
  const slot = errorSlot({ id: "exec-error" });
  const status = h("p#exec-status", { "aria-live": "polite" });
  const dropped = h("p#exec-dropped.hint", { hidden: true }, "Earlier output was dropped: the last 1 MiB (10,000 lines at most) is kept.");
  const output = h("pre#exec-output.exec-output", { tabindex: 0, role: "log", "aria-live": "off", "aria-label": "Command output", hidden: true });
  let ws = null;
  let queued = [];
  let queuedChars = 0;
  let flushing = null;
  let pace = 30;

  // Output waits in `queued` (runs of one stream) and is drawn at most every
  // `pace` ms: a flood costs a layout per draw, not per frame, and what would
  // be dropped at once is never drawn.
  const flush = () => {
    flushing = null;
    const began = performance.now();
    const bottom = output.scrollTop + output.clientHeight >= output.scrollHeight - 8;
    const drawn = [...output.children].map((el) => ({ el, stream: el.dataset.stream, text: el.firstChild.data }));
    const parts = [...drawn, ...queued.splice(0)];
    queuedChars = 0;
    const [i, at] = keptFrom(parts);
    if (i || at) dropped.hidden = false;
    for (const p of parts.slice(0, i)) p.el?.remove();
    if (at && parts[i].el) parts[i].el.firstChild.deleteData(0, at);
    else if (at) parts[i].text = parts[i].text.slice(at);
    for (const { stream, text } of parts.slice(Math.max(i, drawn.length))) {
      const last = output.lastChild;
      if (last?.dataset.stream === stream) last.firstChild.appendData(text);
      else output.append(h(`span.${stream}`, { dataset: { stream } }, text));
    }
    if (bottom) output.scrollTop = output.scrollHeight;
    pace = Math.max(30, 2 * (performance.now() - began));
  };
  const show = (stream, text) => {
    if (!text) return;
    const last = queued.at(-1);
    if (last?.stream === stream) last.text += text;
    else queued.push({ stream, text });
    if ((queuedChars += text.length) > 2 * LIMIT) {
      // A flood between two draws: what it pushed out goes now.
      const [i, at] = keptFrom(queued);
      queued = queued.slice(i);
      queued[0].text = queued[0].text.slice(at);
      queuedChars = queued.reduce((n, q) => n + q.text.length, 0);
      dropped.hidden = false;
    }
    flushing ??= setTimeout(flush, pace);
  };
  const done = (text) => {
    const refocus = document.activeElement === stop;
    ws = null;
    clearTimeout(flushing);
    flush();
    run.disabled = false;
    stop.hidden = true;
    status.textContent = text;
    if (refocus) run.focus();
  };

  const start = (event) => {
    event.preventDefault();
    if (ws) return;
    slot.clear();
    let command;
    try {
      command = viaShell.checked ? ["sh", "-c", line.value] : shellWords(line.value);
      if (!line.value.trim() || !command.length) throw invalid("command: type the command to run");
    } catch (error) {
      return slot.show(error);
    }
    replace(output);
    queued = [];
    queuedChars = 0;
    pace = 30;
    dropped.hidden = true;
    output.hidden = false;
    const refocus = document.activeElement === run;
    run.disabled = true;
    stop.hidden = false;
    if (refocus) stop.focus();
    delete status.dataset.exit;
    status.textContent = "Starting…";
    const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const socket = (ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/exec`));
    socket.binaryType = "arraybuffer";
    let [started, ended] = [false, false];
    socket.onopen = () => socket.send(JSON.stringify({ type: "start", nodeId, command, tty: false, stdin: false, timeoutSeconds: Number(limit.value) || 0 }));
    socket.onmessage = ({ data }) => {
      if (socket !== ws) return;
      if (data instanceof ArrayBuffer) {
        const stream = STREAMS[new Uint8Array(data, 0, 1)[0]];
        if (stream) show(stream, decoders[stream].decode(new Uint8Array(data, 1), { stream: true }));
        return;
      }
      const m = JSON.parse(data);
      if (m.type === "started") {
        started = true;
        status.textContent = "Running…";
      }
      else if (m.type === "exit" || m.type === "error") {
        ended = true;
        for (const s of Object.keys(decoders)) show(s, decoders[s].decode());
        if (m.type === "error") slot.show(m);
        else status.dataset.exit = m.signal ?? m.code;
        done(m.type === "exit" ? ending(m) : started ? "Ended by the server." : "Not run.");
      }
    };
    socket.onclose = () => socket === ws && !ended && done(started ? "The connection closed before the command ended." : "Could not start: the connection closed.");
  };
  const halt = () => {
    const socket = ws;
    if (!socket) return;
    done("Stopped: the command was killed.");
    socket.close(1000);
  };
  stop.onclick = halt;

  const el = h("div#run-command.run-command", h("h3", "Run a command"),
    h("form#exec-form", { onsubmit: start },
      field("Command", line),
      h("label.check", viaShell, h("span", "Run it through ", h("code", "sh -c"), " (pipes, ;, $VARS)")),
      h("small.hint", "Unchecked, the line is split into words (quotes kept together) and run directly."),
      h("div.toolbar", field("Time limit (s)", limit), run, stop)),
    slot, status, dropped, output, note("Runs in the resource's context, no terminal or input; it is audited."));
  return { el, stop: () => ws?.close(1000) };
}
