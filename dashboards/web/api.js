// cuwarden web dashboard: what the page asks the daemon (docs/http.md): the history and the
// state document, a process's snapshot, and the event stream.

import { API } from './util.js';

// Call sites asked for at once: the table shows the ten largest, the flame graph all of these.
export const SNAPSHOT_SITES = 200;

/** GET API + path as JSON; throws an Error naming the path and the daemon's error. */
export async function getJSON(path) {
  const r = await fetch(API + path);
  if (!r.ok) {
    const body = await r.json().catch(() => null);
    throw new Error(`${path}: HTTP ${r.status}${body?.error ? `: ${body.error}` : ''}`);
  }
  return r.json();
}

/**
 * A process's snapshot as JSON with its SNAPSHOT_SITES largest call sites (no trace):
 * {status: '200' | '403' | ... | 'error', body}. Never throws.
 */
export async function fetchSnapshot(pid) {
  try {
    const r = await fetch(`${API}processes/${pid}/snapshot?format=json&top=${SNAPSHOT_SITES}`);
    return { status: String(r.status), body: await r.json().catch(() => null) };
  } catch (e) {
    return { status: 'error', body: { error: String(e.message || e) } };
  }
}

/**
 * Open the event stream: `on.state(doc)` for each state document, `on.memory(event)` for each
 * memory event, `on.conn(kind, text)` when the connection's state changes ('live',
 * 'reconnecting', 'stale' when no state came for 5 s although the stream is open). The
 * browser's EventSource reconnects by itself and resumes after the last event it had.
 */
export function connect(on) {
  const es = new EventSource(API + 'events');
  let lastStateAt = 0;
  es.addEventListener('open', () => on.conn('live', 'live'));
  es.addEventListener('error', () => on.conn('reconnecting', 'reconnecting…'));
  es.addEventListener('state', m => {
    let st;
    try { st = JSON.parse(m.data); } catch { return; }
    lastStateAt = performance.now();
    on.conn('live', 'live');
    on.state(st);
  });
  es.addEventListener('memory', m => {
    let ev;
    try { ev = JSON.parse(m.data); } catch { return; }
    on.memory(ev);
  });
  setInterval(() => {
    if (es.readyState === EventSource.OPEN && lastStateAt && performance.now() - lastStateAt > 5000) {
      on.conn('stale', 'no update for 5 s');
    }
  }, 1000);
}
