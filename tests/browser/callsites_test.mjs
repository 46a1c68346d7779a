// The call-site table and the flame graph of the web dashboard in a real headless Chromium,
// against cuwardend --http --http-snapshots and the programs run_callsites_live.sh starts:
//
//   node tests/browser/callsites_test.mjs --url BASE --artefacts DIR
//        --chain-pid PID --chain-lines '{"load_weights": N, "load_weights_2": N, "make_buffers": N}'
//        --py-pid PID --py-file NAME --py-lines ALLOC,CALL1,CALL2 [--timeout S]
//
// 1. The native program's three sites through one 12-deep helper chain print the same head
//    (chain_12, the innermost user frame) and are told apart on the page by their differing
//    frame: load_weights at its two lines, make_buffers; the chain's frames are folded away.
// 2. A click on a site unfolds it: every frame of its stack shows, with its class.
// 3. The Python program's two sites, one function called from two lines, show both lines.
// 4. The flame graph draws a rectangle per site whose width, against the whole graph's, is
//    the site's share of the live bytes; the differing frame is a frame of the graph.
// Any JavaScript error, console error or failed request fails the test. Each step waits for a
// condition of the page, never a fixed time. Screenshots go to the artefact directory.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const args = { timeout: 20 };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i], v = () => process.argv[++i];
  if (a === '--url') args.url = v();
  else if (a === '--artefacts') args.artefacts = v();
  else if (a === '--chain-pid') args.chainPid = Number(v());
  else if (a === '--chain-lines') args.chainLines = JSON.parse(v());
  else if (a === '--py-pid') args.pyPid = Number(v());
  else if (a === '--py-file') args.pyFile = v();
  else if (a === '--py-lines') args.pyLines = v().split(',').map(Number);
  else if (a === '--timeout') args.timeout = Number(v());
  else { console.error(`unknown argument ${a}`); process.exit(2); }
}
for (const k of ['url', 'artefacts', 'chainPid', 'chainLines', 'pyPid', 'pyFile', 'pyLines']) {
  if (args[k] == null) { console.error(`missing --${k}`); process.exit(2); }
}
const base = args.url.endsWith('/') ? args.url : args.url + '/';
const MS = args.timeout * 1000;
mkdirSync(args.artefacts, { recursive: true });
const t0 = Date.now();
const log = msg => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${msg}`);
const check = (cond, msg) => { if (!cond) throw new Error(msg); log(`ok: ${msg}`); };
const escRe = s => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The snapshot the page shows, as the test reads it itself (the same route and size). */
async function snapshot(pid) {
  const r = await fetch(new URL(`api/v1/processes/${pid}/snapshot?format=json&top=200`, base));
  if (!r.ok) throw new Error(`snapshot of ${pid}: HTTP ${r.status}`);
  return r.json();
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

  await page.goto(base, { waitUntil: 'domcontentloaded' });

  /** Select `pid` in the process table; wait until its snapshot and flame graph are drawn. */
  async function open(pid) {
    await page.click(`#proc-table tbody tr[data-pid="${pid}"]`, { timeout: MS });
    await page.waitForFunction(p => {
      const b = document.getElementById('callsites'), f = document.getElementById('flame');
      // d3-flame-graph grows new rectangles to their width (a transition of its own); each
      // frame's label box is set to that width at once, so they agree when it is done.
      return b.dataset.pid === String(p) && b.dataset.status === '200' && f.dataset.status === 'drawn'
        && [...f.querySelectorAll('g.frame')].every(g => {
          const w = Number(g.querySelector('rect')?.getAttribute('width'));
          return w > 0 && Math.abs(w - Number(g.querySelector('foreignObject')?.getAttribute('width'))) < 0.01;
        });
    }, pid, { timeout: MS });
    noErrors(`the call sites of ${pid}`);
  }

  /** What a site's row shows while folded (innerText: what is rendered, not what is hidden). */
  const rowText = (id) => page.$eval(`#callsites tr[data-site="${id}"] td.site`, td => td.innerText);

  /** Each site's rectangle in the flame graph, as a share of the root's width. */
  async function flameShares(sites) {
    return page.evaluate(ids => {
      const root = document.querySelector('#flame g.frame[data-depth="0"] rect');
      const w = Number(root.getAttribute('width'));
      return Object.fromEntries(ids.map(id => {
        const g = [...document.querySelectorAll('#flame g.frame[data-sites]')]
          .filter(e => e.dataset.sites.split(' ').includes(String(id)));
        return [id, g.length === 1 ? Number(g[0].querySelector('rect').getAttribute('width')) / w : -g.length];
      }));
    }, sites.map(s => s.id));
  }

  async function checkFlame(snap, what) {
    const sites = snap.sites.filter(s => s.live_bytes > 0);
    const total = sites.reduce((a, s) => a + s.live_bytes, 0);
    const shares = await flameShares(sites);
    for (const s of sites) {
      const want = s.live_bytes / total;
      check(shares[s.id] >= 0 && Math.abs(shares[s.id] - want) < 0.002,
            `${what}: the flame graph's rectangle of site ${s.id} (${s.live_bytes} bytes) is ${(100 * want).toFixed(2)}% ` +
            `of its width (${(100 * shares[s.id]).toFixed(2)}%)`);
    }
    const names = await page.$$eval('#flame g.frame', gs => gs.map(g => g.getAttribute('name')));
    for (const s of sites) {
      for (const v of s.label_via) check(names.includes(v.text), `${what}: the flame graph has the frame "${v.text}"`);
      if (s.label_folded) check(names.includes(`(${s.label_folded})`), `${what}: the flame graph folds site ${s.id}'s inner frames`);
    }
  }

  // ---- the native program: three sites through one helper chain ----
  await open(args.chainPid);
  const chain = await snapshot(args.chainPid);
  const bySize = mib => chain.sites.find(s => s.live_bytes === mib * 1024 * 1024);
  const wanted = { 3: ['load_weights', args.chainLines.load_weights], 2: ['load_weights', args.chainLines.load_weights_2],
                   1: ['make_buffers', args.chainLines.make_buffers] };
  const heads = new Set(), texts = new Set();
  for (const [mib, [fn, line]] of Object.entries(wanted)) {
    const s = bySize(Number(mib));
    check(s != null, `the chain's ${mib} MiB site is in the snapshot`);
    const text = await rowText(s.id);
    const head = text.split('\n')[0];
    heads.add(head);
    texts.add(text);
    check(/^chain_12\b.* \(.*snapshot_app\.cpp:\d+\)$/.test(head), `the ${mib} MiB site's head is chain_12 ("${head}")`);
    check(new RegExp(`< ${fn}\\b.* \\(.*snapshot_app\\.cpp:${line}\\)\\s+\\(\\+11 frames\\)`).test(text),
          `the ${mib} MiB site shows its differing frame, ${fn} at line ${line} (+11 frames) (${JSON.stringify(text)})`);
    // A frame's function starts its line (after "< " when unfolded): matching the whole text
    // would find "main" in a checkout path such as ~/src/main/tests/.
    check(!/(^|\n)(< )?(chain_5|main)\b/.test(text), `the ${mib} MiB site does not list the folded chain or main`);
    if (s.label_folded) check(text.includes(`(${s.label_folded})`), `the ${mib} MiB site folds its inner frames into one line`);
  }
  check(heads.size === 1 && texts.size === 3, 'the three sites share their head and are told apart on the page');
  const panel = await page.$eval('#callsites', b => b.innerText);
  check(!/\b(null|undefined|NaN)\b|\[object /.test(panel), 'the panel shows no placeholder of a missing value');

  // A click unfolds the whole stack, each frame with its class; a second click folds it back.
  const s3 = bySize(3);
  await page.click(`#callsites tr[data-site="${s3.id}"]`);
  await page.waitForFunction(id => document.querySelector(`#callsites tr[data-site="${id}"]`).dataset.open === '1', s3.id,
                             { timeout: MS });
  const unfolded = await rowText(s3.id);
  const items = await page.$$eval(`#callsites tr[data-site="${s3.id}"] .stack li`, lis => lis.map(li => li.innerText));
  check(items.length === s3.frames.length, `unfolded: all ${s3.frames.length} frames listed (${items.length})`);
  for (const f of s3.frames) check(unfolded.includes(f.text), `unfolded: "${f.text}" shown`);
  const order = s3.calling_order;
  check(items.every((t, k) => t.trim() === `${s3.frames[order[k]].text} [${s3.frames[order[k]].class}]`),
        `unfolded: in calling order, innermost first, each frame with its class (${JSON.stringify(items.slice(-2))})`);
  check(/\bchain_5\b.*\[user\]/.test(unfolded) && /\[libc\]/.test(unfolded), 'unfolded: the chain is the user\'s, libc\'s frames are libc\'s');
  await page.click(`#callsites tr[data-site="${s3.id}"]`);
  await page.waitForFunction(id => document.querySelector(`#callsites tr[data-site="${id}"] .stack`).hidden, s3.id,
                             { timeout: MS });
  check(!/\bchain_5\b/.test(await rowText(s3.id)), 'a second click folds it again');
  await checkFlame(chain, 'native');
  await page.screenshot({ path: join(args.artefacts, 'callsites-native.png'), fullPage: true });

  // ---- the Python program: one function called from two lines ----
  await open(args.pyPid);
  const py = await snapshot(args.pyPid);
  const [allocLine, ...callLines] = args.pyLines;
  const pySites = [3, 5].map(mib => py.sites.find(s => s.live_bytes === mib * 1024 * 1024));
  check(pySites.every(Boolean), 'the Python sites of 3 and 5 MiB are in the snapshot');
  const file = escRe(args.pyFile);
  for (const [i, s] of pySites.entries()) {
    const text = await rowText(s.id);
    check(new RegExp(`^alloc \\(.*${file}:${allocLine}\\)`).test(text), `Python site ${i + 1}: the head is alloc at line ${allocLine}`);
    check(new RegExp(`< <module> \\(.*${file}:${callLines[i]}\\)`).test(text), `Python site ${i + 1}: its calling line ${callLines[i]} shows`);
  }
  await checkFlame(py, 'Python');
  noErrors('at the end');
  await page.screenshot({ path: join(args.artefacts, 'callsites-python.png'), fullPage: true });
  log(`PASS; screenshots in ${args.artefacts}`);
} catch (e) {
  failed = true;
  console.error(`FAIL: ${e.message}`);
  await page?.screenshot({ path: join(args.artefacts, 'failure.png'), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
