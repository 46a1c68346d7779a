// cuwarden web dashboard: the model the page draws, fed by the daemon's history, state
// documents and memory events (docs/http.md). "Now" is the time of the last state document,
// never the browser's clock, so a page on a machine whose clock is off, or a replayed
// recording, draws the same.

import { WINDOW_S, OOM_KINDS } from './util.js';

const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#ff9da7', '#9c755f',
                 '#8cd17d', '#499894', '#d37295', '#86bcb6'];
const EVENT_LOG = 30;  // memory events kept for the list

/** Columns of values over time, stored as the daemon stores them: a point only on change. */
export class Series {
  constructor(keys) {
    this.keys = keys;
    this.t = [];
    this.v = Object.fromEntries(keys.map(k => [k, []]));
  }

  push(t, vals) {
    const n = this.t.length;
    if (n && t < this.t[n - 1]) return;  // older than what we hold: the history covers it
    if (n && t === this.t[n - 1]) {
      for (const k of this.keys) this.v[k][n - 1] = vals[k] ?? null;
      return;
    }
    if (n && this.keys.every(k => this.v[k][n - 1] === (vals[k] ?? null))) return;  // unchanged
    this.t.push(t);
    for (const k of this.keys) this.v[k].push(vals[k] ?? null);
  }

  last(k) { return this.t.length ? this.v[k][this.t.length - 1] : null; }

  /** Drop points before `from`, keeping the one that gives the value at `from`. */
  trim(from) {
    let i = 0;
    while (i + 1 < this.t.length && this.t[i + 1] <= from) i++;
    if (i > 0) {
      this.t.splice(0, i);
      for (const k of this.keys) this.v[k].splice(0, i);
    }
  }

  /** The values at each of the sorted times `xs`, each the last point at or before it. */
  sample(k, xs) {
    const out = new Array(xs.length);
    let j = -1;
    for (let i = 0; i < xs.length; i++) {
      while (j + 1 < this.t.length && this.t[j + 1] <= xs[i]) j++;
      out[i] = j >= 0 ? this.v[k][j] : null;
    }
    return out;
  }
}

export const DEV_KEYS = ['used', 'reserved', 'peak', 'limit'];

export const model = {
  range: 'hour',      // the range asked for
  loadedRange: null,  // the range whose history is drawn
  now: 0,            // unix seconds of the last state document
  state: null,       // the last state document
  gpus: new Map(),   // gpu index -> {index, uuid, name, total, doc: its entry in the state}
  procs: new Map(),  // pid -> {pid, startTime, name, user, job, state, gone, devs: Map, ooms: []}
  colors: new Map(), // pid -> colour, kept for the page's life
  events: [],        // the last memory events, newest last
  selected: null,    // pid whose call sites are shown
  snapshot: { pid: null, status: 'none', body: null },
};

/** The colour of a process, kept for the page's life. */
export function colorOf(pid) {
  if (!model.colors.has(pid)) model.colors.set(pid, PALETTE[model.colors.size % PALETTE.length]);
  return model.colors.get(pid);
}

function procEntry(pid, startTime) {
  let p = model.procs.get(pid);
  if (!p || (startTime != null && p.startTime != null && p.startTime !== startTime)) {
    // A new process, or its pid used again by another: the old one's series go with it.
    p = { pid, startTime, name: '', user: '', job: '', state: 'running', gone: false, devs: new Map(), ooms: [] };
    model.procs.set(pid, p);
  }
  return p;
}

function devEntry(p, gpuIndex, ordinal) {
  let d = p.devs.get(gpuIndex);
  if (!d) {
    d = { gpuIndex, ordinal, s: new Series(DEV_KEYS), row: null };
    p.devs.set(gpuIndex, d);
  }
  if (ordinal != null) d.ordinal = ordinal;
  return d;
}

function gpuEntry(index) {
  let g = model.gpus.get(index);
  if (!g) {
    g = { index, uuid: '', name: '', total: null, doc: null };
    model.gpus.set(index, g);
  }
  return g;
}

/** Rebuild the model from a history answer (docs/http.md, "History"). */
export function loadHistory(hist) {
  model.gpus.clear();
  model.procs.clear();
  model.now = Math.max(model.now, hist.time_ns / 1e9);
  for (const g of hist.gpus || []) {
    const e = gpuEntry(g.index);
    Object.assign(e, { uuid: g.uuid, name: g.name, total: g.memory_total_bytes });
  }
  for (const hp of hist.processes || []) {
    const p = procEntry(hp.pid, hp.start_time);
    Object.assign(p, { name: hp.process_name, user: hp.user, job: hp.job, state: hp.state });
    for (const hd of hp.devices || []) {
      const d = devEntry(p, hd.gpu_index, hd.ordinal);
      for (let i = 0; i < hd.t.length; i++) {
        d.s.push(hd.t[i], { used: hd.used_bytes[i], reserved: hd.reserved_bytes[i], peak: hd.peak_bytes[i],
                            limit: hd.limit_bytes[i] });
      }
    }
    for (const o of hp.ooms || []) p.ooms.push({ t: o.time_ns / 1e9, ordinal: o.ordinal, bytes: o.bytes, kind: o.kind });
  }
}

/** Apply a state document (the daemon's, once a second). */
export function applyState(st) {
  model.state = st;
  const t = st.time_ns / 1e9;
  model.now = Math.max(model.now, t);
  for (const g of st.gpus || []) {
    const e = gpuEntry(g.index);
    Object.assign(e, { uuid: g.uuid, name: g.name, total: g.memory_total_bytes, doc: g });
  }
  const seen = new Set();
  for (const sp of st.processes || []) {
    const p = procEntry(sp.pid, sp.start_time);
    seen.add(sp.pid);
    Object.assign(p, { name: sp.process_name, user: sp.user, job: sp.job, state: sp.state, gone: false, doc: sp });
    for (const sd of sp.devices || []) {
      const d = devEntry(p, sd.gpu_index, sd.ordinal);
      d.doc = sd;
      d.s.push(t, { used: sd.used_bytes, reserved: sd.reserved_bytes, peak: sd.peak_bytes, limit: sd.limit_bytes });
    }
  }
  for (const p of model.procs.values()) {
    if (seen.has(p.pid) || p.gone) continue;
    // Gone from the daemon's list: it holds nothing from now on.
    p.gone = true;
    p.doc = null;
    for (const d of p.devs.values()) d.s.push(t, { used: 0, reserved: 0, peak: d.s.last('peak'), limit: d.s.last('limit') });
  }
  if (model.selected == null || !model.procs.has(model.selected)) model.selected = biggestPid();
  trimToWindow();
}

/** Apply one memory event (the objects `cuwarden events --json` prints). */
export function applyEvent(ev) {
  model.events.push(ev);
  if (model.events.length > EVENT_LOG) model.events.splice(0, model.events.length - EVENT_LOG);
  const p = model.procs.get(ev.pid);
  if (!p) return;  // a process the next state document will bring
  if (OOM_KINDS.has(ev.kind)) p.ooms.push({ t: ev.time_ns / 1e9, ordinal: ev.device, bytes: ev.bytes, kind: ev.kind });
}

function trimToWindow() {
  const from = model.now - WINDOW_S[model.range];
  for (const [pid, p] of model.procs) {
    for (const d of p.devs.values()) d.s.trim(from);
    p.ooms = p.ooms.filter(o => o.t >= from);
    const lastT = Math.max(0, ...[...p.devs.values()].map(d => d.s.t[d.s.t.length - 1] ?? 0));
    // A process gone before the window began has nothing left to draw.
    if (p.gone && lastT < from && pid !== model.selected) model.procs.delete(pid);
  }
}

function biggestPid() {
  let best = null, bestUsed = -1;
  for (const sp of model.state?.processes || []) {
    const used = (sp.devices || []).reduce((a, d) => a + (d.used_bytes || 0), 0);
    if (sp.state === 'running' && used > bestUsed) { best = sp.pid; bestUsed = used; }
  }
  return best;
}

/** The GPU index of a process's device `ordinal`; null: unknown. */
export function gpuIndexOfOrdinal(p, ordinal) {
  for (const d of p.devs.values()) if (d.ordinal === ordinal) return d.gpuIndex;
  return null;
}
