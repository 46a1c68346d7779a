// cuwarden web dashboard: constants, formatting and the element builder every module shares.
// Text that came from a process (names, command lines, frames) is set as text, never as HTML.

export const API = 'api/v1/';  // relative: the page also works behind a reverse proxy's prefix
export const WINDOW_S = { hour: 3600, day: 86400 };
export const OOM_KINDS = new Set(['refuse', 'job_refuse', 'driver_error']);
export const OOM_WHY = { refuse: 'refused (cap)', job_refuse: 'refused (job cap)', driver_error: 'out of memory (driver)' };
export const OOM_COLOR = '#d62728';

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
export function fmtAxisBytes(b) {
  return fmtBytes(b).replace(/\.0+ /, ' ').replace(/(\.\d*?)0+ /, '$1 ');
}

/** Unix seconds as the browser's local time of day, on a 24-hour clock. */
export function fmtTime(sec) {
  return new Date(sec * 1000).toLocaleTimeString([], { hour12: false });
}

/** Element builder: h('td', {class: 'num', dataset: {bytes: 5}}, 'text', child...). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'onclick') el.addEventListener('click', v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A CSS custom property of the page (style.css), or `fallback`. */
export function cssVar(name, fallback) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
}
