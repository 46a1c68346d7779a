// cuwarden web dashboard: one model fed by the daemon's HTTP API (docs/http.md) and drawn
// from it. At start the history (/api/v1/history?range=hour|day) and the state document
// (/api/v1/state); then the event stream (/api/v1/events): `state` each second, `memory` for
// each memory event. No framework; uPlot (the global from uPlot.iife.min.js) draws the charts.
//
// The page never trusts the clock of the browser: "now" is the time of the last state
// document, so a page on a laptop in another timezone, or a replayed recording, draws the same.
// Text that came from a process (names, command lines, frames) is set as text, never as HTML.

/* global uPlot */

const API = 'api/v1/';  // relative: the page also works behind a reverse proxy's prefix
const WINDOW_S = { hour: 3600, day: 86400 };
const OOM_KINDS = new Set(['refuse', 'job_refuse', 'driver_error']);
const OOM_WHY = { refuse: 'refused (cap)', job_refuse: 'refused (job cap)', driver_error: 'out of memory (driver)' };
const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#ff9da7', '#9c755f',
                 '#8cd17d', '#499894', '#d37295', '#86bcb6'];
const OOM_COLOR = '#d62728';
const MAX_TIMELINES = 12;    // process cards drawn; the selected process is always one of them
const EVENT_LOG = 30;        // memory events listed
const RENDER_EVERY_MS = 500; // a busy stream redraws at most this often

// ---- formatting -------------------------------------------------------------------------

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** Bytes for people, in powers of 1024 (as the CLI writes sizes); null: no value. */
export function fmtBytes(b) {
  if (b == null) return '–';
  let v = Math.abs(b), i = 0;
  while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
  const s = i === 0 ? String(v) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0);
  return (b < 0 ? '-' : '') + s + ' ' + UNITS[i];
}

/** An axis label: "96 GiB", "2.5 GiB" (no trailing zeros). */
function fmtAxisBytes(b) {
  return fmtBytes(b).replace(/\.0+ /, ' ').replace(/(\.\d*?)0+ /, '$1 ');
}

function fmtTime(sec) {
  return new Date(sec * 1000).toLocaleTimeString([], { hour12: false });
}

// Axis ticks at binary sizes (1, 2, 4 ... 512 of each unit), so labels read "4 GiB", not "4.29 GB".
const BYTE_INCRS = [];
for (let u = 0; u < 6; u++) for (let m = 1; m < 1024; m *= 2) BYTE_INCRS.push(m * 1024 ** u);

/** Element builder: h('td', {class: 'num', dataset: {bytes: 5}}, 'text', child...). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'onclick') el.addEventListener('click', v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function cssVar(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}

// ---- the model ----------------------------------------------------------------------------

/** Columns of values over time, stored as the daemon stores them: a point only on change. */
class Series {
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

const DEV_KEYS = ['used', 'reserved', 'peak', 'limit'];

const model = {
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

function colorOf(pid) {
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
function loadHistory(hist) {
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
function applyState(st) {
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
function applyEvent(ev) {
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

function gpuIndexOfOrdinal(p, ordinal) {
  for (const d of p.devs.values()) if (d.ordinal === ordinal) return d.gpuIndex;
  return null;
}

// ---- charts ---------------------------------------------------------------------------------

/** The times of all `arrays` and now, sorted, none before the window (a series keeps the one
 * point before it, which gives its value where the window begins). */
function timeAxis(arrays) {
  const from = model.now - WINDOW_S[model.range];
  const all = [model.now];
  for (const a of arrays) for (const x of a) all.push(Math.max(x, from));
  all.sort((a, b) => a - b);
  const out = [];
  for (const x of all) if (!out.length || out[out.length - 1] !== x) out.push(x);
  return out;
}

// Time labels on a 24-hour clock, the date under the first tick of each day (uPlot's table:
// tick step, label, then the label when the year, month, day, hour, minute or second rolls over).
const TIME_VALUES = [
  [86400 * 28, '{MMM}', '\n{YYYY}', null, null, null, null, null, 1],
  [86400, '{M}/{D}', '\n{YYYY}', null, null, null, null, null, 1],
  [3600, '{HH}:{mm}', '\n{YYYY}-{MM}-{DD}', null, '\n{MM}-{DD}', null, null, null, 1],
  [60, '{HH}:{mm}', '\n{YYYY}-{MM}-{DD}', null, '\n{MM}-{DD}', null, null, null, 1],
  [1, '{HH}:{mm}:{ss}', '\n{YYYY}-{MM}-{DD}', null, '\n{MM}-{DD}', null, null, null, 1],
];

// Time ticks: whole seconds at least (the data has a point a second at most).
const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                    86400, 2 * 86400, 7 * 86400, 28 * 86400];

function axes() {
  const fg = cssVar('--fg-muted', '#555');
  const grid = { stroke: cssVar('--grid', '#e5e5e5'), width: 1 };
  return [
    { stroke: fg, grid, ticks: grid, values: TIME_VALUES, incrs: TIME_INCRS },
    { stroke: fg, grid, ticks: grid, size: 64, incrs: BYTE_INCRS, values: (u, splits) => splits.map(fmtAxisBytes) },
  ];
}

const X_SERIES = { value: '{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}' };
const NO_POINTS = { show: false };

const stepped = () => uPlot.paths.stepped({ align: 1 });

/** A chart that keeps its uPlot while its series stay the same and is rebuilt when they change. */
class Chart {
  constructor(container) {
    this.container = container;
    this.plot = null;
    this.key = '';
    // The grid gives the card its width once its neighbours are in (and on every resize).
    this.observer = new ResizeObserver(() => {
      if (this.plot && Math.abs(this.plot.width - this.width()) > 1) this.resize();
    });
    this.observer.observe(container);
  }

  width() { return Math.max(300, this.container.clientWidth || 600); }

  update(key, makeOpts, data) {
    if (this.plot && key === this.key) {
      this.plot.setData(data);
      return;
    }
    this.plot?.destroy();
    this.key = key;
    this.plot = new uPlot(makeOpts(this.width()), data, this.container);
  }

  resize() { this.plot?.setSize({ width: this.width(), height: this.plot.height }); }

  destroy() {
    this.observer.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}

/** One GPU: every process's use stacked (step areas), each cap dashed, the device's memory. */
function gpuChartData(g) {
  const procs = [...model.procs.values()]
    .filter(p => p.devs.has(g.index) && p.devs.get(g.index).s.t.length)
    .sort((a, b) => a.pid - b.pid);
  const devs = procs.map(p => p.devs.get(g.index));
  const xs = timeAxis(devs.map(d => d.s.t));
  const raw = devs.map(d => d.s.sample('used', xs).map(v => v ?? 0));
  const stacked = [];
  const acc = new Array(xs.length).fill(0);
  for (const r of raw) stacked.push(r.map((v, i) => (acc[i] += v)));
  const capped = procs.map((p, i) => ({ p, caps: devs[i].s.sample('limit', xs) }))
    .filter(c => c.caps.some(v => v != null));
  const total = xs.map(() => g.total);
  const key = ['gpu', g.index, procs.map(p => p.pid).join(','), capped.map(c => c.p.pid).join(',')].join('|');
  const data = [xs, ...stacked, ...capped.map(c => c.caps), total];
  return { key, data, procs, raw, capped };
}

function gpuChartOpts(d, holder) {
  return width => {
    const series = [X_SERIES];
    const bands = [];
    d.procs.forEach((p, i) => {
      const c = colorOf(p.pid);
      series.push({
        label: `${p.pid} ${p.name}`,
        stroke: c, fill: c + '99', width: 1, paths: stepped(), points: NO_POINTS,
        // The legend shows the process's own bytes, not the stacked sum.
        value: (u, v, si, idx) => (idx == null ? '–' : fmtBytes(holder.raw[si - 1]?.[idx])),
      });
      if (i > 0) bands.push({ series: [i + 1, i] });
    });
    for (const c of d.capped) {
      series.push({ label: `cap ${c.p.pid}`, stroke: colorOf(c.p.pid), width: 1.5, dash: [6, 4],
                    paths: stepped(), points: NO_POINTS, value: (u, v) => fmtBytes(v) });
    }
    series.push({ label: 'GPU memory', stroke: cssVar('--fg-muted', '#888'), width: 1, points: NO_POINTS,
                  value: (u, v) => fmtBytes(v) });
    return {
      width, height: 240, series, bands, axes: axes(),
      scales: { y: { range: (u, lo, hi) => [0, Math.max(hi, 1024)] } },
      legend: { live: true }, cursor: { points: { show: false } },
    };
  };
}

/** One process on one GPU: used (area), reserved, peak, cap; OOM marks drawn on top. */
function timelineData(p, d) {
  const xs = timeAxis([d.s.t]);
  const data = [xs, ...DEV_KEYS.map(k => d.s.sample(k, xs))];
  const ooms = p.ooms.filter(o => gpuIndexOfOrdinal(p, o.ordinal) === d.gpuIndex);
  return { key: 'proc', data, ooms };
}

function oomMarks(getMarks) {
  return {
    hooks: {
      draw: u => {
        const ctx = u.ctx, dpr = devicePixelRatio || 1, { left, top, width, height } = u.bbox;
        ctx.save();
        ctx.strokeStyle = ctx.fillStyle = OOM_COLOR;
        ctx.lineWidth = dpr;
        ctx.setLineDash([3 * dpr, 3 * dpr]);
        for (const m of getMarks()) {
          const x = Math.round(u.valToPos(m.t, 'x', true));
          if (x < left || x > left + width) continue;
          ctx.beginPath();
          ctx.moveTo(x, top);
          ctx.lineTo(x, top + height);
          ctx.stroke();
          ctx.beginPath();
          ctx.moveTo(x - 5 * dpr, top);
          ctx.lineTo(x + 5 * dpr, top);
          ctx.lineTo(x, top + 8 * dpr);
          ctx.fill();
        }
        ctx.restore();
      },
    },
  };
}

function timelineOpts(p, holder) {
  return width => {
    const c = colorOf(p.pid), fmt = (u, v) => fmtBytes(v);
    return {
      width, height: 170, axes: axes(),
      series: [
        X_SERIES,
        { label: 'used', stroke: c, fill: c + '55', width: 1.5, paths: stepped(), points: NO_POINTS, value: fmt },
        { label: 'reserved', stroke: cssVar('--fg-muted', '#888'), width: 1, paths: stepped(), points: NO_POINTS, value: fmt },
        { label: 'peak', stroke: c, width: 1, dash: [2, 3], paths: stepped(), points: NO_POINTS, value: fmt },
        { label: 'cap', stroke: OOM_COLOR, width: 1.5, dash: [6, 4], paths: stepped(), points: NO_POINTS, value: fmt },
      ],
      scales: { y: { range: (u, lo, hi) => [0, Math.max(hi, 1024)] } },
      legend: { live: true }, cursor: { points: { show: false } },
      plugins: [oomMarks(() => holder.ooms)],
    };
  };
}

// ---- drawing --------------------------------------------------------------------------------

const charts = new Map();  // key ("gpu:0", "proc:4242:0") -> {card, chart, holder}

function chartCard(key, parent, makeCard) {
  let c = charts.get(key);
  if (!c) {
    const body = h('div', { class: 'chart' });
    const card = makeCard(body);
    c = { card, chart: new Chart(body), holder: { ooms: [] } };
    charts.set(key, c);
  }
  parent.append(c.card);  // (re)ordered on each draw; append moves an existing node
  return c;
}

function dropChartsExcept(prefix, keep) {
  for (const [key, c] of charts) {
    if (key.startsWith(prefix) && !keep.has(key)) {
      c.chart.destroy();
      c.card.remove();
      charts.delete(key);
    }
  }
}

function drawGpus() {
  const parent = document.getElementById('gpu-cards');
  const keep = new Set();
  for (const g of [...model.gpus.values()].sort((a, b) => a.index - b.index)) {
    const key = `gpu:${g.index}`;
    keep.add(key);
    const c = chartCard(key, parent, body => h('article', { class: 'card gpu-card', dataset: { gpu: g.index } },
      h('h3', {}, h('span', { class: 'gpu-title' }), ' ', h('span', { class: 'muted gpu-sum' })), body));
    const doc = g.doc;
    c.card.querySelector('.gpu-title').textContent = `GPU ${g.index} · ${g.name}`;
    c.card.querySelector('.gpu-sum').textContent = doc
      ? `${fmtBytes(doc.used_bytes)} used by ${doc.processes} process${doc.processes === 1 ? '' : 'es'} (${doc.capped_processes} capped) of ${fmtBytes(g.total)}`
      + (doc.driver_used_bytes != null ? ` · driver: ${fmtBytes(doc.driver_used_bytes)} in use` : '')
      : `${fmtBytes(g.total)}`;
    const d = gpuChartData(g);
    c.card.dataset.points = String(d.data[0].length);
    c.card.dataset.processes = d.procs.map(p => p.pid).join(' ');
    c.holder.raw = d.raw;  // read by the legend (the chart outlives one draw's arrays)
    c.chart.update(d.key, gpuChartOpts(d, c.holder), d.data);
  }
  dropChartsExcept('gpu:', keep);
}

function usedBar(used, cap, total) {
  const of = cap ?? total;
  const frac = of ? Math.min(1, used / of) : 0;
  const bar = h('span', { class: 'bar', title: of ? `${(100 * used / of).toFixed(1)}% of ${cap != null ? 'cap' : 'GPU'}` : '' },
    h('span', { class: 'fill' + (cap != null && frac > 0.9 ? ' hot' : '') }));
  bar.firstChild.style.width = `${(100 * frac).toFixed(1)}%`;
  return bar;
}

function drawTable() {
  const tbody = document.querySelector('#proc-table tbody');
  const rows = [];
  const procs = (model.state?.processes || []).slice().sort((a, b) => a.pid - b.pid);
  for (const sp of procs) {
    const devices = (sp.devices || []).slice().sort((a, b) => a.gpu_index - b.gpu_index);
    for (const sd of devices) {
      const sel = sp.pid === model.selected;
      const bytes = (cls, v) => h('td', { class: `num ${cls}`, title: v == null ? 'none' : `${v} bytes`,
                                          dataset: { bytes: v == null ? '' : v } }, fmtBytes(v));
      rows.push(h('tr', {
        class: (sel ? 'selected ' : '') + (sp.state !== 'running' ? 'exited' : ''),
        dataset: { pid: sp.pid, gpu: sd.gpu_index }, tabindex: 0,
        onclick: () => select(sp.pid),
      },
      h('td', { class: 'pid' }, h('span', { class: 'swatch', style: `background:${colorOf(sp.pid)}` }), sp.pid),
      h('td', {}, sp.user),
      h('td', { class: 'name', title: sp.cmdline }, sp.process_name),
      h('td', {}, sp.job || ''),
      h('td', {}, sd.gpu_index),
      h('td', { class: 'num used', title: `${sd.used_bytes} bytes`, dataset: { bytes: sd.used_bytes } },
        usedBar(sd.used_bytes, sd.limit_bytes, sd.memory_total_bytes), ' ', fmtBytes(sd.used_bytes)),
      bytes('reserved', sd.reserved_bytes),
      bytes('peak', sd.peak_bytes),
      bytes('cap', sd.limit_bytes),
      h('td', { class: 'num ooms' + (sd.ooms ? ' hot' : ''), dataset: { ooms: sd.ooms } }, sd.ooms),
      h('td', { class: 'state' }, sp.state)));
    }
  }
  tbody.replaceChildren(...rows);
  document.getElementById('proc-table').hidden = rows.length === 0;
  document.getElementById('no-procs').hidden = rows.length > 0;
}

function drawTimelines() {
  const parent = document.getElementById('timelines');
  const keep = new Set();
  const live = new Set((model.state?.processes || []).map(p => p.pid));
  let procs = [...model.procs.values()].filter(p => live.has(p.pid) || p.pid === model.selected);
  procs.sort((a, b) => (a.pid === model.selected ? -1 : b.pid === model.selected ? 1 : a.pid - b.pid));
  procs = procs.slice(0, MAX_TIMELINES);
  for (const p of procs) {
    for (const d of [...p.devs.values()].sort((a, b) => a.gpuIndex - b.gpuIndex)) {
      if (!d.s.t.length) continue;
      const key = `proc:${p.pid}:${d.gpuIndex}`;
      keep.add(key);
      const c = chartCard(key, parent, body => h('article', {
        class: 'card proc-card', dataset: { pid: p.pid, gpu: d.gpuIndex }, onclick: () => select(p.pid),
      }, h('h3', {}, h('span', { class: 'swatch', style: `background:${colorOf(p.pid)}` }), h('span', { class: 'title' })),
      body, h('ul', { class: 'oom-list' })));
      c.card.classList.toggle('selected', p.pid === model.selected);
      c.card.querySelector('.title').textContent =
        `${p.pid} ${p.name} · ${p.user}${p.job ? ` · job ${p.job}` : ''} · GPU ${d.gpuIndex}${p.gone ? ' · gone' : p.state !== 'running' ? ` · ${p.state}` : ''}`;
      const td = timelineData(p, d);
      c.holder.ooms = td.ooms;
      c.card.dataset.ooms = String(td.ooms.length);
      c.card.dataset.points = String(td.data[0].length);
      c.chart.update(td.key, timelineOpts(p, c.holder), td.data);
      const list = c.card.querySelector('.oom-list');
      list.replaceChildren(...td.ooms.slice(-5).reverse().map(o =>
        h('li', {}, `${fmtTime(o.t)}: ${fmtBytes(o.bytes)} ${OOM_WHY[o.kind] || o.kind}`)));
    }
  }
  dropChartsExcept('proc:', keep);
}

function drawJobs() {
  const tbody = document.querySelector('#job-table tbody');
  const rows = [];
  for (const j of model.state?.jobs || []) {
    const members = (j.members || []).map(m => `${m.pid} ${m.process_name || ''}`.trim()).join(', ');
    const disagree = j.caps_disagree
      ? h('span', { class: 'warn', title: 'members asked for different caps; the lowest applies' }, ' (caps disagree)') : null;
    for (const g of j.gpus || []) {
      rows.push(h('tr', { dataset: { job: j.name, gpu: g.gpu_index ?? '' } },
        h('td', {}, j.name, disagree),
        h('td', {}, j.user),
        h('td', {}, g.gpu_index ?? '?'),
        h('td', { class: 'num used', dataset: { bytes: g.used_bytes } }, fmtBytes(g.used_bytes)),
        h('td', { class: 'num cap', dataset: { bytes: g.limit_bytes ?? '' } }, fmtBytes(g.limit_bytes)),
        h('td', {}, usedBar(g.used_bytes, g.limit_bytes, g.memory_total_bytes)),
        h('td', { class: 'name' }, members),
        h('td', { class: 'num' + (j.refusals ? ' hot' : '') }, j.refusals)));
    }
  }
  tbody.replaceChildren(...rows);
  document.getElementById('job-table').hidden = rows.length === 0;
  document.getElementById('no-jobs').hidden = rows.length > 0;
}

function drawEvents() {
  const log = document.getElementById('event-log');
  log.replaceChildren(...model.events.slice().reverse().map(e => {
    const oom = OOM_KINDS.has(e.kind);
    let what = `${e.kind} ${fmtBytes(e.bytes)}`;
    if (e.kind === 'limit_change') what = `cap ${fmtBytes(e.old_limit ?? null)} → ${fmtBytes(e.new_limit ?? null)}${e.by ? ` by ${e.by}` : ''}`;
    return h('li', { class: oom ? 'oom' : '', dataset: { seq: e.seq } },
      h('span', { class: 'muted' }, fmtTime(e.time_ns / 1e9)), ' ',
      h('span', { class: 'swatch', style: `background:${colorOf(e.pid)}` }), `${e.pid} `,
      h('b', {}, what), ` ${e.api}`, e.used_after != null && !oom && e.kind !== 'limit_change' ? ` → ${fmtBytes(e.used_after)} used` : '');
  }));
}

function drawHeader() {
  const st = model.state;
  document.getElementById('host').textContent = st ? `${st.hostname} · cuwarden ${st.version}` : '';
  document.getElementById('updated').textContent = st ? `state at ${fmtTime(model.now)}` : '';
  document.body.dataset.stateTimeNs = st ? String(st.time_ns) : '';
  document.body.dataset.range = model.loadedRange || '';
  for (const b of document.querySelectorAll('#range button')) b.setAttribute('aria-pressed', String(b.dataset.range === model.range));
}

// ---- call sites of the selected process ------------------------------------------------------

function select(pid) {
  if (model.selected === pid && model.snapshot.pid === pid) return;
  model.selected = pid;
  history.replaceState(null, '', `#pid=${pid}`);
  fetchSnapshot(pid);
  scheduleRender(true);
}

async function fetchSnapshot(pid) {
  model.snapshot = { pid, status: 'loading', body: null };
  drawCallsites();
  let status, body;
  try {
    const r = await fetch(`${API}processes/${pid}/snapshot?format=json&top=10`);
    status = r.status;
    body = await r.json().catch(() => null);
  } catch (e) {
    status = 'error';
    body = { error: String(e.message || e) };
  }
  if (model.selected !== pid) return;  // another process was selected meanwhile
  model.snapshot = { pid, status: String(status), body };
  drawCallsites();
}

function frameText(f) {
  const where = f.file ? `${f.file}${f.line ? `:${f.line}` : ''}` : f.module ? `${f.module}+0x${Number(f.offset || 0).toString(16)}` : '';
  return `${f.python ? '[py] ' : ''}${f.function || '??'}${where ? ` (${where})` : ''}`;
}

function drawCallsites() {
  const box = document.getElementById('callsites');
  const { pid, status, body } = model.snapshot;
  const p = model.procs.get(pid);
  document.getElementById('sel-title').textContent = pid != null ? `· ${pid} ${p?.name || ''}` : '';
  box.dataset.status = status;
  box.dataset.pid = pid ?? '';
  const refresh = h('button', { type: 'button', onclick: () => fetchSnapshot(pid) }, 'Refresh');
  if (pid == null) { box.replaceChildren(h('p', { class: 'muted' }, 'Select a process in the table.')); return; }
  if (status === 'loading') { box.replaceChildren(h('p', { class: 'muted' }, 'Taking a snapshot…')); return; }
  if (status === '403') {
    box.replaceChildren(h('p', { class: 'notice' },
      'This daemon does not serve snapshots over HTTP: they name the program\'s source files and functions, ',
      'and HTTP cannot tell who asks. Start cuwardend with --http-snapshots to see call sites here, ',
      `or run "cuwarden snapshot ${pid}" on the machine as the process's owner or root.`), refresh);
    return;
  }
  if (status !== '200' || !body) {
    const why = body?.error || (status === '404' ? 'no such process' : `HTTP ${status}`);
    box.replaceChildren(h('p', { class: 'notice' }, `No snapshot of ${pid}: ${why}.`), refresh);
    return;
  }
  const sites = (body.sites || []).filter(s => s.live_bytes > 0).sort((a, b) => b.live_bytes - a.live_bytes).slice(0, 10);
  const live = (body.devices || []).reduce((a, d) => a + (d.live_bytes || 0), 0);
  const head = h('p', {},
    `${fmtBytes(live)} live in ${(body.devices || []).reduce((a, d) => a + (d.live_allocations || 0), 0)} allocations at `,
    fmtTime(body.time_ns / 1e9), body.exact === false ? ' (not exact: events were lost)' : '',
    body.callsite_frames ? '' : '. Call sites are off for this process: run it with CUWARDEN_CALLSITES=16 (cuwarden run --callsites 16).');
  const rows = sites.map(s => h('tr', { dataset: { site: s.id } },
    h('td', { class: 'num', dataset: { bytes: s.live_bytes } }, fmtBytes(s.live_bytes)),
    h('td', { class: 'num' }, s.live_allocations),
    h('td', { class: 'frames' }, s.id === 0 ? h('span', { class: 'muted' }, '(no call site recorded)')
      : (s.frames || []).slice(0, 4).map(f => h('div', {}, frameText(f))))));
  box.replaceChildren(head, sites.length ? h('table', { class: 'sites' },
    h('thead', {}, h('tr', {}, h('th', { class: 'num' }, 'Live'), h('th', { class: 'num' }, 'Allocations'), h('th', {}, 'Call site (innermost first)'))),
    h('tbody', {}, rows)) : h('p', { class: 'muted' }, 'No live allocations.'), refresh);
}

// ---- data flow ------------------------------------------------------------------------------

let renderTimer = null, lastRender = 0;

function render() {
  renderTimer = null;
  lastRender = performance.now();
  drawHeader();
  drawGpus();
  drawTable();
  drawTimelines();
  drawJobs();
  drawEvents();
  // The call sites are drawn when their answer comes (redrawing them each time would undo a
  // user's text selection in them).
  if (model.snapshot.pid !== model.selected && model.selected != null) fetchSnapshot(model.selected);
}

/** Draw soon: at once for a click, else at most every RENDER_EVERY_MS. */
function scheduleRender(now = false) {
  if (renderTimer != null && !now) return;
  clearTimeout(renderTimer);
  const wait = now ? 0 : Math.max(0, RENDER_EVERY_MS - (performance.now() - lastRender));
  renderTimer = setTimeout(render, wait);
}

function banner(text) {
  const b = document.getElementById('banner');
  b.textContent = text || '';
  b.hidden = !text;
}

async function getJSON(path) {
  const r = await fetch(API + path);
  if (!r.ok) {
    const body = await r.json().catch(() => null);
    throw new Error(`${path}: HTTP ${r.status}${body?.error ? `: ${body.error}` : ''}`);
  }
  return r.json();
}

let loading = 0;

/** (Re)load the history of `range` and the current state; the stream keeps running. */
async function load(range) {
  const my = ++loading;
  model.range = range;
  try {
    const [hist, st] = await Promise.all([getJSON(`history?range=${range}`), getJSON('state')]);
    if (my !== loading) return;  // the user switched again meanwhile
    loadHistory(hist);
    applyState(st);
    model.loadedRange = range;
    banner('');
  } catch (e) {
    if (my !== loading) return;
    banner(`Cannot read the daemon's API (${e.message}); trying again in 5 s.`);
    setTimeout(() => { if (my === loading) load(range); }, 5000);
  }
  scheduleRender(true);
}

let lastStateAt = 0;

function setConn(state, text) {
  const el = document.getElementById('conn');
  el.dataset.conn = state;
  el.textContent = text;
}

function connect() {
  const es = new EventSource(API + 'events');
  es.addEventListener('open', () => setConn('live', 'live'));
  es.addEventListener('error', () => setConn('reconnecting', 'reconnecting…'));  // EventSource retries
  es.addEventListener('state', m => {
    let st;
    try { st = JSON.parse(m.data); } catch { return; }
    lastStateAt = performance.now();
    setConn('live', 'live');
    applyState(st);
    scheduleRender();
  });
  es.addEventListener('memory', m => {
    let ev;
    try { ev = JSON.parse(m.data); } catch { return; }
    applyEvent(ev);
    scheduleRender();
  });
  // No state for a while although the stream is open: say so rather than show old numbers as live.
  setInterval(() => {
    if (es.readyState === EventSource.OPEN && lastStateAt && performance.now() - lastStateAt > 5000) setConn('stale', 'no update for 5 s');
  }, 1000);
}

function start() {
  const m = /pid=(\d+)/.exec(location.hash);
  if (m) model.selected = Number(m[1]);
  for (const b of document.querySelectorAll('#range button')) {
    b.addEventListener('click', () => { if (b.dataset.range !== model.range) load(b.dataset.range); });
  }
  load('hour').then(connect);
}

if (typeof uPlot === 'undefined') banner('uPlot.iife.min.js is missing from the web root: the charts cannot be drawn.');
else start();
