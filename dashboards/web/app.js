// cuwarden web dashboard: the entry module. It loads the history (/api/v1/history?range=hour|
// day) and the state document (/api/v1/state), then follows the event stream (/api/v1/events:
// `state` each second, `memory` for each memory event) into the model (model.js) and draws
// from it: charts.js (GPUs, timelines; uPlot), tables.js (processes, jobs, events, header),
// callsites.js and flame.js (the selected process's snapshot; d3-flame-graph); api.js asks the
// daemon. No framework, no build step: the browser loads these files as ES modules.

/* global uPlot */

import { model, loadHistory, applyState, applyEvent } from './model.js';
import { getJSON, fetchSnapshot, connect } from './api.js';
import { drawGpus, drawTimelines } from './charts.js';
import { drawTable, drawJobs, drawEvents, drawHeader } from './tables.js';
import { drawCallsites } from './callsites.js';
import { drawFlame } from './flame.js';

const RENDER_EVERY_MS = 500;  // a busy stream redraws at most this often

function select(pid) {
  if (model.selected === pid && model.snapshot.pid === pid) return;
  model.selected = pid;
  history.replaceState(null, '', `#pid=${pid}`);
  takeSnapshot(pid);
  scheduleRender(true);
}

function drawSnapshot() {
  const pid = model.snapshot.pid;
  const sites = drawCallsites(document.getElementById('callsites'), model.snapshot, model.procs.get(pid)?.name,
                              () => takeSnapshot(pid));
  drawFlame(document.getElementById('flame'), sites, pid);
}

async function takeSnapshot(pid) {
  model.snapshot = { pid, status: 'loading', body: null };
  drawSnapshot();
  const { status, body } = await fetchSnapshot(pid);
  if (model.selected !== pid) return;  // another process was selected meanwhile
  model.snapshot = { pid, status, body };
  drawSnapshot();
}

let renderTimer = null, lastRender = 0;

function render() {
  renderTimer = null;
  lastRender = performance.now();
  drawHeader();
  drawGpus();
  drawTable(select);
  drawTimelines(select);
  drawJobs();
  drawEvents();
  // The call sites are drawn when their answer comes (redrawing them each time would undo a
  // user's text selection or unfolded sites).
  if (model.snapshot.pid !== model.selected && model.selected != null) takeSnapshot(model.selected);
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

function setConn(state, text) {
  const el = document.getElementById('conn');
  el.dataset.conn = state;
  el.textContent = text;
}

function start() {
  const m = /pid=(\d+)/.exec(location.hash);
  if (m) model.selected = Number(m[1]);
  for (const b of document.querySelectorAll('#range button')) {
    b.addEventListener('click', () => { if (b.dataset.range !== model.range) load(b.dataset.range); });
  }
  load('hour').then(() => connect({
    conn: setConn,
    state: st => { applyState(st); scheduleRender(); },
    memory: ev => { applyEvent(ev); scheduleRender(); },
  }));
}

if (typeof uPlot === 'undefined') banner('uPlot.iife.min.js is missing from the web root: the charts cannot be drawn.');
else start();
