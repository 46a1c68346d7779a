// cuwarden web dashboard: the selected process's call sites, each in the printed form of the
// text views (docs/callsites.md, "How a call site reads"), as the daemon's snapshot JSON gives
// it: the head (the innermost user frame), the frames inner to it as one line, the frames
// that tell it from another site with the same head. A click on a site unfolds its stack.

import { fmtBytes, fmtTime, h } from './util.js';

const TABLE_SITES = 10;  // rows in the table; the flame graph takes every site of the answer

/** The snapshot's sites holding live bytes, the largest first. */
export function liveSites(body) {
  return (body?.sites || []).filter(s => s.live_bytes > 0).sort((a, b) => b.live_bytes - a.live_bytes);
}

function plural(n, one) { return `${n} ${one}${n === 1 ? '' : 's'}`; }

/** The site's printed form: head, fold line, the frames that tell it apart. */
function printedForm(s) {
  if (s.id === 0) return [h('div', { class: 'label-head muted' }, '(no call site recorded)')];
  return [
    h('div', { class: 'label-head' }, s.label_head ?? s.label),
    s.label_folded ? h('div', { class: 'label-folded muted' }, `(${s.label_folded})`) : null,
    (s.label_via || []).map(v => h('div', { class: 'label-via' }, `< ${v.text}`,
      v.skipped ? h('span', { class: 'muted' }, `  (+${plural(v.skipped, 'frame')})`) : null)),
  ];
}

/** Every frame of the site in calling order, innermost first, each with its class. */
function wholeStack(s) {
  const frames = s.frames || [];
  const order = s.calling_order?.length === frames.length ? s.calling_order : frames.map((_, i) => i);
  const via = new Set((s.label_via || []).map(v => v.frame));
  return h('ol', { class: 'stack', hidden: true }, order.map(i => {
    const f = frames[i];
    const mark = i === s.head_frame ? 'head' : via.has(i) ? 'via' : '';
    return h('li', { class: mark, dataset: { class: f.class || '' } },
      f.python ? h('span', { class: 'py' }, 'py ') : null, f.text ?? f.function ?? '??',
      ' ', h('span', { class: `cls cls-${f.class}` }, `[${f.class || '?'}]`));
  }));
}

function toggle(row) {
  const open = row.dataset.open !== '1';
  row.dataset.open = open ? '1' : '0';
  row.setAttribute('aria-expanded', String(open));
  row.querySelector('.stack').hidden = !open;
  for (const el of row.querySelectorAll('.label-folded')) el.hidden = open;
}

function siteRow(s) {
  const row = h('tr', { dataset: { site: s.id, open: '0' }, tabindex: 0, 'aria-expanded': 'false',
                        title: s.id === 0 ? null : 'Click to unfold every frame' },
    h('td', { class: 'num', dataset: { bytes: s.live_bytes }, title: `${s.live_bytes} bytes` }, fmtBytes(s.live_bytes)),
    h('td', { class: 'num' }, s.live_allocations),
    h('td', { class: 'site' }, printedForm(s), s.id === 0 ? null : wholeStack(s)));
  if (s.id !== 0) {
    row.addEventListener('click', e => { if (!window.getSelection()?.toString()) toggle(row); e.stopPropagation(); });
    row.addEventListener('keydown', e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); toggle(row); } });
  }
  return row;
}

/**
 * Draw the call-site panel of `snap` ({pid, status, body}: the model's snapshot) into `box`;
 * `name` is the process's name, `onRefresh()` asks for a new snapshot. Returns the sites
 * holding live bytes (for the flame graph), or null when there is no snapshot to draw.
 */
export function drawCallsites(box, snap, name, onRefresh) {
  const { pid, status, body } = snap;
  document.getElementById('sel-title').textContent = pid != null ? `· ${pid} ${name || ''}` : '';
  box.dataset.status = status;
  box.dataset.pid = pid ?? '';
  const refresh = h('button', { type: 'button', class: 'refresh', onclick: onRefresh }, 'Refresh');
  if (pid == null) { box.replaceChildren(h('p', { class: 'muted' }, 'Select a process in the table.')); return null; }
  if (status === 'loading') { box.replaceChildren(h('p', { class: 'muted' }, 'Taking a snapshot…')); return null; }
  if (status === '403') {
    box.replaceChildren(h('p', { class: 'notice' },
      'This daemon does not serve snapshots over HTTP: they name the program\'s source files and functions, ',
      'and HTTP cannot tell who asks. Start cuwardend with --http-snapshots to see call sites here, ',
      `or run "cuwarden snapshot ${pid}" on the machine as the process's owner or root.`), refresh);
    return null;
  }
  if (status !== '200' || !body) {
    const why = body?.error || (status === '404' ? 'no such process' : `HTTP ${status}`);
    box.replaceChildren(h('p', { class: 'notice' }, `No snapshot of ${pid}: ${why}.`), refresh);
    return null;
  }
  const sites = liveSites(body);
  const live = (body.devices || []).reduce((a, d) => a + (d.live_bytes || 0), 0);
  const head = h('p', {},
    `${fmtBytes(live)} live in ${(body.devices || []).reduce((a, d) => a + (d.live_allocations || 0), 0)} allocations at `,
    fmtTime(body.time_ns / 1e9), body.exact === false ? ' (not exact: events were lost)' : '',
    body.callsite_frames ? '' : '. Call sites are off for this process: run it with CUWARDEN_CALLSITES=16 (cuwarden run --callsites 16).');
  const note = body.segments_note ? h('p', { class: 'notice segments-note' }, body.segments_note) : null;
  const table = sites.length ? h('table', { class: 'sites' },
    h('thead', {}, h('tr', {}, h('th', { class: 'num' }, 'Live'), h('th', { class: 'num' }, 'Allocations'),
      h('th', {}, 'Call site: the program\'s own frame first (click to unfold)'))),
    h('tbody', {}, sites.slice(0, TABLE_SITES).map(siteRow)))
    // With call sites off the head says so; the live total may still be above zero.
    : !body.callsite_frames ? null
    : h('p', { class: 'muted' }, live ? 'No call site holds live bytes.' : 'No live allocations.');
  box.replaceChildren(...[head, note, table, refresh].filter(Boolean));
  return sites;
}
