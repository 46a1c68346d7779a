// A suspended process on the web dashboard, in a real headless Chromium, against cuwardend --http
// and the program run_suspend_live.sh suspended:
//
//   node tests/browser/suspend_test.mjs --url BASE --artefacts DIR --pid PID --trigger 'RESUME COMMAND'
//        [--timeout S]
//
// 1. The process's row says it is suspended: its State cell names the state, the bytes it
//    holds on the host (as /api/v1/state, fetched here, says: suspended_host_bytes) and since
//    when (suspended_since_ns, as the browser's local time of day, and for how long), and its
//    used bytes read 0.
// 2. How long it has been suspended grows as the state documents come, without a reload.
// 3. After the trigger (cuwarden resume) the row says running, with its bytes back on the device.
// Any JavaScript error, console error or failed request fails the test. Each step waits for a
// condition of the page, never a fixed time. Screenshots go to the artefact directory.
import { execSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const args = { timeout: 20 };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i], v = () => process.argv[++i];
  if (a === '--url') args.url = v();
  else if (a === '--artefacts') args.artefacts = v();
  else if (a === '--pid') args.pid = Number(v());
  else if (a === '--trigger') args.trigger = v();
  else if (a === '--timeout') args.timeout = Number(v());
  else { console.error(`unknown argument ${a}`); process.exit(2); }
}
for (const k of ['url', 'artefacts', 'pid', 'trigger']) {
  if (args[k] == null) { console.error(`missing --${k}`); process.exit(2); }
}
const base = args.url.endsWith('/') ? args.url : args.url + '/';
const MS = args.timeout * 1000;
mkdirSync(args.artefacts, { recursive: true });
const t0 = Date.now();
const log = msg => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${msg}`);
const check = (cond, msg) => { if (!cond) throw new Error(msg); log(`ok: ${msg}`); };

const UNITS = { B: 1, KiB: 1024, MiB: 1024 ** 2, GiB: 1024 ** 3, TiB: 1024 ** 4, PiB: 1024 ** 5 };
/** "64.0 MiB" -> bytes, or NaN when the text is not a size in binary units. */
function parseHuman(text) {
  const m = /^(-?\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB|PiB)$/.exec(text.trim());
  return m ? Number(m[1]) * UNITS[m[2]] : NaN;
}

async function processInState() {
  const r = await fetch(new URL('api/v1/state', base));
  if (!r.ok) throw new Error(`/api/v1/state: HTTP ${r.status}`);
  return (await r.json()).processes.find(p => p.pid === args.pid);
}

const errors = [];
const browser = await chromium.launch({
  executablePath: process.env.CUWARDEN_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
let failed = false, page = null;
try {
  page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on('pageerror', e => errors.push(`JavaScript error: ${e.message}`));
  page.on('console', m => { if (m.type() === 'error') errors.push(`console error: ${m.text()}`); });
  page.on('requestfailed', r => errors.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', r => { if (r.status() >= 400) errors.push(`HTTP ${r.status()}: ${r.url()}`); });
  const noErrors = where => { if (errors.length) throw new Error(`${where}:\n  ${errors.join('\n  ')}`); };

  const sp = await processInState();
  check(sp?.state === 'suspended', `the daemon says pid ${args.pid} is suspended`);
  const host = sp.suspended_host_bytes, since = sp.suspended_since_ns;
  check(host >= 64 * 1024 ** 2 && since > 0, `it holds ${host} bytes on the host since ${since} ns`);

  await page.goto(base, { waitUntil: 'load' });
  const row = `#proc-table tbody tr[data-pid="${args.pid}"]`;
  await page.waitForSelector(`${row} td.state`, { timeout: MS });
  const read = () => page.$eval(row, tr => {
    const st = tr.querySelector('td.state');
    return { cls: tr.className, state: st.dataset.state, host: st.dataset.hostBytes, since: st.dataset.sinceNs,
             text: st.textContent, used: Number(tr.querySelector('td.used').dataset.bytes) };
  });
  // 1. What the row says.
  await page.waitForFunction(sel => document.querySelector(`${sel} td.state`)?.dataset.state === 'suspended', row,
                             { timeout: MS });
  const shown = await read();
  log(`the state cell: "${shown.text}"`);
  check(/\bsuspended\b/.test(shown.cls), 'the row is marked suspended');
  check(Number(shown.host) === host, `its host bytes are the state's (${shown.host})`);
  check(Number(shown.since) === since, `its "since" is the state's (${shown.since})`);
  const m = /^suspended · (.+) on host · since (\d\d:\d\d:\d\d) \((\d+) s\)$/.exec(shown.text.trim());
  check(m != null, `it reads "suspended · SIZE on host · since HH:MM:SS (N s)"`);
  check(Math.abs(parseHuman(m[1]) - host) <= 0.01 * host, `"${m[1]}" is ${host} bytes`);
  const localSince = await page.evaluate(ns => new Date(ns / 1e6).toLocaleTimeString([], { hour12: false }), since);
  check(m[2] === localSince, `since ${m[2]}, the browser's local time of ${since} ns`);
  check(shown.used === 0, 'its used bytes read 0 while its memory is on the host');

  // 2. How long grows as state documents come.
  const first = Number(m[3]);
  await page.waitForFunction(([sel, n]) => {
    const t = document.querySelector(`${sel} td.state`)?.textContent || '';
    const k = /\((\d+) s\)/.exec(t);
    return k && Number(k[1]) > n;
  }, [row, first], { timeout: MS });
  check(true, `"${first} s" grew without a reload`);
  await page.screenshot({ path: join(args.artefacts, 'suspended.png'), fullPage: true });

  // 3. Resumed: running again, its bytes back.
  log(`trigger: ${args.trigger}`);
  execSync(args.trigger, { stdio: 'inherit', shell: '/bin/bash' });
  await page.waitForFunction(sel => {
    const tr = document.querySelector(sel);
    return tr?.querySelector('td.state').dataset.state === 'running' && Number(tr.querySelector('td.used').dataset.bytes) > 0;
  }, row, { timeout: MS });
  const after = await read();
  check(after.text.trim() === 'running' && !/\bsuspended\b/.test(after.cls), `resumed: the row says "${after.text.trim()}"`);
  check(after.used === 64 * 1024 ** 2, `its 64 MiB are back on the device (${after.used})`);
  noErrors('at the end');
  await page.screenshot({ path: join(args.artefacts, 'resumed.png'), fullPage: true });
  log(`PASS; screenshots in ${args.artefacts}`);
} catch (e) {
  failed = true;
  console.error(`FAIL: ${e.message}`);
  await page?.screenshot({ path: join(args.artefacts, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
