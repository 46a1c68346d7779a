// The web dashboard in a real headless Chromium, against a daemon (or a replay of one):
//
//   node tests/browser/dashboard_test.mjs --url http://127.0.0.1:9477/ --artefacts DIR
//        [--trigger 'SHELL COMMAND'] [--expect-ooms] [--timeout S]
//
// 1. loads the page; any JavaScript error, console error or failed request fails the test
//    (but the 403 a daemon without --http-snapshots answers for a snapshot: the page says so);
// 2. the process table shows every process of /api/v1/state (fetched here) with its pid and
//    its used, peak and cap bytes, in human units;
// 3. runs --trigger (something that makes the workload allocate; for a replay, nothing: the
//    recording moves on by itself) and waits until the state changes and the page shows the new
//    numbers without reloading; with --expect-ooms, also until a new refusal shows in the
//    table and as a mark on the process's timeline;
// 4. each process's call-site panel answers (200 with call sites, or 403 explained), and the
//    flame graph of one with call sites is drawn;
// 5. the range switch loads the day; screenshots (PNG) go to the artefact directory.
// Chromium is the system's (/usr/bin/chromium, or CUWARDEN_CHROMIUM); none is downloaded.
import { execSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const args = { timeout: 12, expectOoms: false, trigger: null, url: null, artefacts: null };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a === '--url') args.url = process.argv[++i];
  else if (a === '--artefacts') args.artefacts = process.argv[++i];
  else if (a === '--trigger') args.trigger = process.argv[++i];
  else if (a === '--timeout') args.timeout = Number(process.argv[++i]);
  else if (a === '--expect-ooms') args.expectOoms = true;
  else { console.error(`unknown argument ${a}`); process.exit(2); }
}
if (!args.url || !args.artefacts) {
  console.error('usage: dashboard_test.mjs --url BASE --artefacts DIR [--trigger CMD] [--expect-ooms] [--timeout S]');
  process.exit(2);
}
const base = args.url.endsWith('/') ? args.url : args.url + '/';
mkdirSync(args.artefacts, { recursive: true });
const t0 = Date.now();
const log = msg => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${msg}`);

const UNITS = { B: 1, KiB: 1024, MiB: 1024 ** 2, GiB: 1024 ** 3, TiB: 1024 ** 4, PiB: 1024 ** 5 };
/** "6.00 GiB" -> bytes, or NaN when the text is not a size in binary units. */
function parseHuman(text) {
  const m = /^(-?\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB|PiB)$/.exec(text.trim());
  return m ? Number(m[1]) * UNITS[m[2]] : NaN;
}

async function getState() {
  const r = await fetch(new URL('api/v1/state', base));
  if (!r.ok) throw new Error(`/api/v1/state: HTTP ${r.status}`);
  return r.json();
}

const sleep = ms => new Promise(r => setTimeout(r, ms));

// A snapshot refused (403: no --http-snapshots) or of a process gone (404) is an answer the page
// explains, not a failure; Chromium still logs it as a failed resource.
const SNAPSHOT = /\/api\/v1\/processes\/\d+\/snapshot\?/;
const errors = [];
let watching = true;

const browser = await chromium.launch({
  executablePath: process.env.CUWARDEN_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
let failed = false, page = null;
try {
  page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on('pageerror', e => watching && errors.push(`JavaScript error: ${e.message}`));
  page.on('console', m => {
    if (!watching || m.type() !== 'error') return;
    const where = m.location()?.url || '';
    if (SNAPSHOT.test(where) && /status of 40[34]/.test(m.text())) return;
    errors.push(`console error: ${m.text()} (${where})`);
  });
  page.on('requestfailed', r => watching && errors.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', r => {
    if (!watching || r.status() < 400) return;
    if (SNAPSHOT.test(r.url()) && (r.status() === 403 || r.status() === 404)) return;
    errors.push(`HTTP ${r.status()}: ${r.url()}`);
  });
  const noErrors = where => {
    if (errors.length) throw new Error(`${where}:\n  ${errors.join('\n  ')}`);
  };

  /** What the process table shows: {"pid:gpu": {used, usedText, peak, cap, ooms}}. */
  const readTable = () => page.$$eval('#proc-table tbody tr', trs => Object.fromEntries(trs.map(tr => {
    const cell = c => tr.querySelector(`td.${c}`);
    const bytes = c => (cell(c).dataset.bytes === '' ? null : Number(cell(c).dataset.bytes));
    return [`${tr.dataset.pid}:${tr.dataset.gpu}`, {
      used: bytes('used'), usedText: cell('used').textContent.trim(), peak: bytes('peak'), cap: bytes('cap'),
      ooms: Number(cell('ooms').dataset.ooms),
    }];
  })));

  /** Why the page does not show `st` (empty: it does). */
  function mismatch(st, rows) {
    const out = [];
    for (const p of st.processes) {
      for (const d of p.devices) {
        const key = `${p.pid}:${d.gpu_index}`, r = rows[key];
        if (!r) { out.push(`no row for pid ${p.pid} on GPU ${d.gpu_index}`); continue; }
        if (r.used !== d.used_bytes) out.push(`${key} used ${r.used}, state says ${d.used_bytes}`);
        const shown = parseHuman(r.usedText);
        if (!(Math.abs(shown - d.used_bytes) <= Math.max(1, 0.01 * d.used_bytes)))
          out.push(`${key} used shown as "${r.usedText}" for ${d.used_bytes} bytes`);
        if (r.peak !== d.peak_bytes) out.push(`${key} peak ${r.peak}, state says ${d.peak_bytes}`);
        if (r.cap !== d.limit_bytes) out.push(`${key} cap ${r.cap}, state says ${d.limit_bytes}`);
        if (r.ooms !== d.ooms) out.push(`${key} OOMs ${r.ooms}, state says ${d.ooms}`);
      }
    }
    return out;
  }

  /** Wait until the page shows a state document for which `accept(state)` holds. */
  async function waitShown(what, accept, seconds) {
    const until = Date.now() + seconds * 1000;
    let why = ['nothing read yet'];
    while (Date.now() < until) {
      noErrors(what);
      const st = await getState();
      if (accept(st)) {
        why = mismatch(st, await readTable());
        if (!why.length) return st;
      } else {
        why = ['the state has not changed yet'];
      }
      await sleep(250);
    }
    throw new Error(`${what}: not shown within ${seconds} s: ${why.join('; ')}`);
  }

  const used = st => JSON.stringify(st.processes.map(p => [p.pid, p.devices.map(d => d.used_bytes)]));
  const ooms = st => st.processes.reduce((a, p) => a + p.devices.reduce((b, d) => b + d.ooms, 0), 0);

  await page.goto(base, { waitUntil: 'domcontentloaded' });
  await page.evaluate(() => { window.__cuwardenTestLoaded = true; });
  await page.waitForSelector('#proc-table tbody tr', { timeout: args.timeout * 1000 });
  const first = await waitShown('the processes of /api/v1/state', st => st.processes.length > 0, args.timeout);
  log(`shown: ${first.processes.map(p => p.pid).join(', ')} (${used(first)})`);
  for (const g of first.gpus) {
    const n = await page.$$eval(`.gpu-card[data-gpu="${g.index}"] canvas`, c => c.length);
    if (!n) throw new Error(`no chart for GPU ${g.index}`);
  }

  if (args.trigger) {
    log(`trigger: ${args.trigger}`);
    execSync(args.trigger, { stdio: 'inherit', shell: '/bin/bash' });
  }
  const changed = await waitShown('the state after the workload allocated', st => used(st) !== used(first), args.timeout);
  log(`updated: ${used(changed)}`);
  if (args.expectOoms) {
    const before = ooms(first);
    const st = await waitShown('a new refusal', s => ooms(s) > before, args.timeout);
    // Every refusal the daemon counts for a process is a mark on its timeline (history + stream).
    const until = Date.now() + args.timeout * 1000;
    let marks = {};
    for (;;) {
      marks = await page.$$eval('.proc-card', cs => {
        const m = {};
        for (const c of cs) m[c.dataset.pid] = (m[c.dataset.pid] || 0) + Number(c.dataset.ooms);
        return m;
      });
      const missing = st.processes.filter(p => (marks[p.pid] || 0) < p.devices.reduce((a, d) => a + d.ooms, 0));
      if (!missing.length) break;
      if (Date.now() > until) throw new Error(`OOM marks ${JSON.stringify(marks)} fewer than the state's counts`);
      await sleep(250);
    }
    log(`refusals shown: ${ooms(st)} counted, marks ${JSON.stringify(marks)}`);
  }
  if (!(await page.evaluate(() => window.__cuwardenTestLoaded === true))) throw new Error('the page reloaded');

  // Call sites: every process's panel answers with call sites or says why there are none.
  const statuses = {};
  for (const p of changed.processes) {
    await page.click(`#proc-table tbody tr[data-pid="${p.pid}"]`);
    await page.waitForFunction(pid => {
      const b = document.getElementById('callsites');
      return b.dataset.pid === String(pid) && !['loading', 'none'].includes(b.dataset.status);
    }, p.pid, { timeout: args.timeout * 1000 });
    const { status, text, sites } = await page.$eval('#callsites', b => ({
      status: b.dataset.status, text: b.textContent, sites: b.querySelectorAll('tr[data-site]').length }));
    statuses[p.pid] = status;
    if (status === '200' && !sites && !/No live allocations|Call sites are off/.test(text))
      throw new Error(`call sites of ${p.pid}: 200 but no site shown`);
    if (/Call sites are off/.test(text) && /No live allocations/.test(text) && !/^0 B live/.test(text))
      throw new Error(`call sites of ${p.pid}: "No live allocations" under a live total: ${text}`);
    if (status === '403' && !text.includes('--http-snapshots'))
      throw new Error(`call sites of ${p.pid}: 403 without the explanation`);
    if (!['200', '403', '404'].includes(status)) throw new Error(`call sites of ${p.pid}: ${status}: ${text}`);
  }
  log(`call-site panels: ${JSON.stringify(statuses)}`);
  const withSites = Object.keys(statuses).find(pid => statuses[pid] === '200');
  if (withSites) {
    await page.click(`#proc-table tbody tr[data-pid="${withSites}"]`);
    // ... and its flame graph, once d3-flame-graph has grown each rectangle to its width (its
    // label box has that width at once).
    await page.waitForFunction(pid => document.getElementById('callsites').dataset.status === '200'
      && document.querySelector(`#proc-table tr.selected[data-pid="${pid}"]`)
      && document.getElementById('flame').dataset.status === 'drawn'
      && [...document.querySelectorAll('#flame g.frame')].every(g => {
        const w = Number(g.querySelector('rect')?.getAttribute('width'));
        return w > 0 && Math.abs(w - Number(g.querySelector('foreignObject')?.getAttribute('width'))) < 0.01;
      }), withSites);
  }
  noErrors('after the call-site panels');
  await page.screenshot({ path: join(args.artefacts, 'dashboard.png'), fullPage: true });

  await page.click('#range button[data-range="day"]');
  await page.waitForFunction(() => document.body.dataset.range === 'day', null, { timeout: args.timeout * 1000 });
  await sleep(300);
  noErrors('after switching to the day');
  await page.screenshot({ path: join(args.artefacts, 'dashboard-day.png'), fullPage: true });
  watching = false;
  log(`PASS; screenshots in ${args.artefacts}`);
} catch (e) {
  failed = true;
  console.error(`FAIL: ${e.message}`);
  await page?.screenshot({ path: join(args.artefacts, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  watching = false;
  await browser.close();
}
process.exit(failed ? 1 : 0);
