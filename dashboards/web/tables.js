// cuwarden web dashboard: the process table, the jobs, the recent events and the header, drawn
// from the last state document and the events the model keeps.

import { OOM_KINDS, fmtBytes, fmtTime, h } from './util.js';
import { model, colorOf } from './model.js';

function usedBar(used, cap, total) {
  const of = cap ?? total;
  const frac = of ? Math.min(1, used / of) : 0;
  const bar = h('span', { class: 'bar', title: of ? `${(100 * used / of).toFixed(1)}% of ${cap != null ? 'cap' : 'GPU'}` : '' },
    h('span', { class: 'fill' + (cap != null && frac > 0.9 ? ' hot' : '') }));
  bar.firstChild.style.width = `${(100 * frac).toFixed(1)}%`;
  return bar;
}

/** "42 s", "3 min 5 s", "2 h 10 min": how long, for people. */
function fmtSpan(s) {
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor(s % 3600 / 60)} min`;
}

/** The State cell: a suspended process also says what it holds on the host and since when
 *  (the state's suspended_host_bytes and suspended_since_ns; its device bytes read 0). */
function stateCell(sp) {
  if (sp.state !== 'suspended') return h('td', { class: 'state', dataset: { state: sp.state } }, sp.state);
  const since = sp.suspended_since_ns;
  const host = sp.suspended_host_bytes;
  const secs = since != null ? Math.max(0, Math.round(model.now - since / 1e9)) : null;
  return h('td', {
    class: 'state suspended',
    dataset: { state: 'suspended', hostBytes: host ?? '', sinceNs: since ?? '' },
    title: `its device memory is on the host${sp.suspended_by ? `; suspended by ${sp.suspended_by}` : ''}`,
  }, 'suspended', h('span', { class: 'muted' },
    ` · ${fmtBytes(host)} on host`,
    since != null ? h('span', { class: 'since' }, ` · since ${fmtTime(since / 1e9)} (${fmtSpan(secs)})`) : null));
}

/** The process table, a row per process and GPU; a click on a row calls `onSelect(pid)`. */
export function drawTable(onSelect) {
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
        class: (sel ? 'selected ' : '') + (sp.state === 'suspended' ? 'suspended' : sp.state !== 'running' ? 'exited' : ''),
        dataset: { pid: sp.pid, gpu: sd.gpu_index }, tabindex: 0,
        onclick: () => onSelect(sp.pid),
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
      stateCell(sp)));
    }
  }
  tbody.replaceChildren(...rows);
  document.getElementById('proc-table').hidden = rows.length === 0;
  document.getElementById('no-procs').hidden = rows.length > 0;
}

/** The jobs table, a row per job and GPU. */
export function drawJobs() {
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

/** The last memory events, newest first. */
export function drawEvents() {
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

/** The header: host, version, the state's time, the range switch. */
export function drawHeader() {
  const st = model.state;
  document.getElementById('host').textContent = st ? `${st.hostname} · cuwarden ${st.version}` : '';
  document.getElementById('updated').textContent = st ? `state at ${fmtTime(model.now)}` : '';
  document.body.dataset.stateTimeNs = st ? String(st.time_ns) : '';
  document.body.dataset.range = model.loadedRange || '';
  for (const b of document.querySelectorAll('#range button')) b.setAttribute('aria-pressed', String(b.dataset.range === model.range));
}
