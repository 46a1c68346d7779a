// cuwarden web dashboard: the selected process's live bytes by call site as a flame graph (an
// icicle: the outermost frame on top), drawn by d3-flame-graph (the globals `d3` and
// `flamegraph` from d3.min.js and d3-flamegraph.min.js). Each site's stack is folded as the
// table prints it, from what the snapshot JSON gives: outward of the outermost printed frame
// the user's own frames (main) as they are and each run of other frames (the interpreter,
// libc) as one node naming their classes, then the printed frames (the frames that tell the
// site apart, then its head) with the frames between them as one "(+N frames)" node, then the
// frames inner to the head as one node named by the daemon's fold line.

/* global d3, flamegraph */

import { fmtBytes, h } from './util.js';

const CLASS_COLOR = {
  user: '#4e79a7', framework: '#f28e2b', cuda: '#59a14f', interpreter: '#b07aa1',
  libc: '#9c9c9c', cuwarden: '#c7c7c7', fold: '#e2e2e2', root: '#d9d9d9',
};

function plural(n, one) { return `${n} ${one}${n === 1 ? '' : 's'}`; }

/** A site's folded stack, outermost first: [{name, cls}]. */
export function foldedPath(s) {
  const frames = s.frames || [];
  if (s.id === 0 || !frames.length) return [{ name: s.id === 0 ? '(no call site)' : '(frames unknown)', cls: 'fold' }];
  const inner = s.calling_order?.length === frames.length ? s.calling_order : frames.map((_, i) => i);
  const order = inner.slice().reverse();
  const printed = new Map();  // frame index -> its printed text
  for (const v of s.label_via || []) printed.set(v.frame, v.text);
  if (s.head_frame >= 0) printed.set(s.head_frame, s.label_head ?? frames[s.head_frame].text);
  const first = order.findIndex(i => printed.has(i));
  const headPos = order.indexOf(s.head_frame);
  const out = [];
  let run = [], runStart = -1;
  const flush = () => {
    if (!run.length) return;
    let name;
    if (runStart === headPos + 1 && headPos >= 0 && s.label_folded) {
      name = `(${s.label_folded})`;  // the frames inner to the head, as the table's fold line
    } else if (first >= 0 && runStart > first) {
      name = `(+${plural(run.length, 'frame')})`;  // between two printed frames, as the table counts them
    } else {  // outward of every printed frame: the interpreter, libc and the like, by class
      const classes = [...new Set(run.map(i => frames[i].class || '?'))].join(', ');
      name = `(+${run.length} ${classes} frame${run.length === 1 ? '' : 's'})`;
    }
    out.push({ name, cls: 'fold' });
    run = [];
  };
  order.forEach((i, k) => {
    // Shown: the printed frames, and outward of them the user's own (main and its callers).
    const shown = printed.has(i) || (first >= 0 ? k < first && frames[i].class === 'user' : true);
    if (shown) {
      flush();
      out.push({ name: printed.get(i) ?? frames[i].text ?? frames[i].function ?? '??', cls: frames[i].class || 'user' });
    } else {
      if (!run.length) runStart = k;
      run.push(i);
    }
  });
  flush();
  return out;
}

/** The tree d3-flame-graph draws: each node's value is the live bytes under it. */
export function flameTree(sites, rootName) {
  const root = { name: rootName, cls: 'root', value: 0, children: [] };
  for (const s of sites) {
    root.value += s.live_bytes;
    let node = root;
    for (const step of foldedPath(s)) {
      let child = node.children.find(c => c.name === step.name);
      if (!child) {
        child = { name: step.name, cls: step.cls, value: 0, children: [] };
        node.children.push(child);
      }
      child.value += s.live_bytes;
      node = child;
    }
    (node.sites ||= []).push(s.id);
  }
  return root;
}

/** Draw `sites` (the snapshot's, with live bytes) into `box`; null or [] clears it. */
export function drawFlame(box, sites, pid) {
  if (!sites || !sites.length) {
    box.replaceChildren();
    box.dataset.status = 'none';
    return;
  }
  if (typeof flamegraph === 'undefined' || typeof d3 === 'undefined') {
    box.replaceChildren(h('p', { class: 'notice' }, 'd3.min.js or d3-flamegraph.min.js is missing from the web root: the flame graph cannot be drawn.'));
    box.dataset.status = 'missing';
    return;
  }
  const total = sites.reduce((a, s) => a + s.live_bytes, 0);
  const graph = h('div', { class: 'flame-graph' });
  box.replaceChildren(h('h3', {}, 'Live bytes by call site ',
    h('span', { class: 'muted' }, '(outermost frame on top; click a frame to zoom, the top row to zoom out)')), graph);
  const width = Math.max(300, graph.clientWidth || box.clientWidth || 800);
  const tag = () => d3.select(graph).selectAll('g.frame')
    .attr('data-sites', d => (d.data.sites ? d.data.sites.join(' ') : null))
    .attr('data-depth', d => d.depth);
  const chart = flamegraph.default()
    .width(width)
    .cellHeight(18)
    .inverted(true)
    .sort(true)
    .transitionDuration(0)
    .setColorMapper(d => CLASS_COLOR[d.data.cls] || CLASS_COLOR.user)
    .setLabelHandler(d => `${d.data.name}: ${fmtBytes(d.value)} (${(100 * d.value / total).toFixed(1)}%)`)
    .onClick(() => tag());
  d3.select(graph).datum(flameTree(sites, `live memory of ${pid}: ${fmtBytes(total)}`)).call(chart);
  tag();
  box.dataset.status = 'drawn';
  box.dataset.total = String(total);
}
