// cuwarden web dashboard: the charts, drawn by uPlot (the global from uPlot.iife.min.js): per
// GPU every process's use stacked, per process and GPU its timeline with refusals marked.

/* global uPlot */

import { WINDOW_S, OOM_COLOR, OOM_WHY, fmtBytes, fmtAxisBytes, fmtTime, h, cssVar } from './util.js';
import { model, colorOf, DEV_KEYS, gpuIndexOfOrdinal } from './model.js';

const MAX_TIMELINES = 12;  // process cards drawn; the selected process is always one of them

// Axis ticks at binary sizes (1, 2, 4 ... 512 of each unit), so labels read "4 GiB", not "4.29 GB".
const BYTE_INCRS = [];
for (let u = 0; u < 6; u++) for (let m = 1; m < 1024; m *= 2) BYTE_INCRS.push(m * 1024 ** u);


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

/** Draw (or update) one card per GPU. */
export function drawGpus() {
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

/** Draw (or update) one card per process and GPU; a click on one calls `onSelect(pid)`. */
export function drawTimelines(onSelect) {
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
        class: 'card proc-card', dataset: { pid: p.pid, gpu: d.gpuIndex }, onclick: () => onSelect(p.pid),
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
