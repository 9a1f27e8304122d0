// The sluice live page: opens on the server's last five minutes of readings
// (/v1/live/history), then polls /v1/live, keeps the readings in memory,
// plots rates between readings, switches gate modes through
// POST /v1/gates/{name} and, with the admin token typed in, shows the
// tenants behind the labels (POST /v1/tenants/lookup). No dependencies.
'use strict';

const EVERY_MS = 1000;   // poll period
const HISTORY = 300;     // readings kept: five minutes at one a second
const TOP = 10;          // tenants listed per table
const TOP_PLOTTED = 5;   // tenants plotted
const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf', '#7f7f7f', '#bcbd22'];
const SVGNS = 'http://www.w3.org/2000/svg';

const history = []; // {t: seconds, d: reading}
let polls = 0;
// keys maps a label to the tenant behind it, as the operator's lookups
// answered; it lives only as long as the page.
const keys = new Map();
// missed holds when a label was last asked about in vain (a tenant the
// server no longer holds, or one it keeps only by digest): asked again
// after MISS_MS, not at every poll.
const missed = new Map();
const MISS_MS = 30000;

const $ = (sel, el = document) => el.querySelector(sel);
const fmt = (v) => (v == null || Number.isNaN(v) ? '–' : Math.round(v).toLocaleString('en-US'));
const fmtRate = (v) => (v == null || Number.isNaN(v) ? '–' : v >= 100 ? Math.round(v).toLocaleString('en-US') : v.toFixed(1));

function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// rate is the per-second change of get() between the last two readings.
function rate(get) {
  if (history.length < 2) return null;
  const a = history[history.length - 2], b = history[history.length - 1];
  return perSecond(a, b, get);
}

// perSecond is null where either reading lacks the value (a tenant that
// just entered the list has no rate yet), and never negative (a series
// dropped with an idle tenant's label is not a negative rate).
function perSecond(a, b, get) {
  const dt = b.t - a.t, va = get(a.d), vb = get(b.d);
  if (va == null || vb == null) return null;
  if (dt <= 0) return 0;
  return Math.max(0, (vb - va) / dt);
}

// series turns a getter into the rates over the history.
function series(get) {
  const out = [];
  for (let i = 1; i < history.length; i++) out.push({ t: history[i].t, v: perSecond(history[i - 1], history[i], get) });
  return out;
}

// level plots a value as read (a gauge), not as a rate.
function level(get) {
  return history.map((h) => ({ t: h.t, v: get(h.d) ?? 0 }));
}

// drawChart draws lines ({name, points, color, dash, width}) in order, the
// later over the earlier, against one y axis in the chart's data-unit.
function drawChart(node, lines) {
  node.replaceChildren();
  const w = node.clientWidth || 420, h = node.clientHeight || 170;
  const left = 44, right = 8, top = 14, bottom = 34;
  node.setAttribute('viewBox', `0 0 ${w} ${h}`);
  const pts = lines.flatMap((l) => l.points).filter((p) => p.v != null);
  // The window grows with the readings, from 30 s to the five minutes kept.
  const now = history.length ? history[history.length - 1].t : 0;
  const span = Math.min((HISTORY * EVERY_MS) / 1000, Math.max(30, history.length ? now - history[0].t : 0));
  const t0 = now - span;
  const ymax = Math.max(1, ...pts.map((p) => p.v)) * 1.1;
  const x = (t) => left + ((t - t0) / (now - t0 || 1)) * (w - left - right);
  const y = (v) => top + (1 - v / ymax) * (h - top - bottom);
  if (node.dataset.unit) node.append(svg('text', { class: 'unit', x: 2, y: 9 }, node.dataset.unit));
  node.append(svg('line', { class: 'axis', x1: left, y1: y(0), x2: w - right, y2: y(0) }));
  node.append(svg('line', { class: 'axis', x1: left, y1: top, x2: left, y2: y(0) }));
  for (const f of [0, 0.5, 1]) {
    const v = (ymax / 1.1) * f;
    node.append(svg('text', { x: left - 4, y: y(v) + 3, 'text-anchor': 'end' }, v >= 10 ? Math.round(v).toLocaleString('en-US') : v.toFixed(1)));
  }
  for (let i = 5; i >= 0; i--) {
    const ago = (span * i) / 5;
    const label = ago === 0 ? 'now' : ago >= 60 ? `-${(ago / 60).toFixed(ago % 60 ? 1 : 0)}m` : `-${Math.round(ago)}s`;
    node.append(svg('text', { x: x(now - ago), y: h - bottom + 12, 'text-anchor': 'middle' }, label));
  }
  let lx = left;
  lines.forEach((l, i) => {
    const color = l.color || PALETTE[i % PALETTE.length];
    if (l.points.length > 1) {
      const d = l.points.filter((p) => p.v != null && p.t >= t0).map((p, j) => `${j ? 'L' : 'M'}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join('');
      const attrs = { class: 'series', d, stroke: color, 'data-name': l.name, 'data-points': String(l.points.filter((p) => p.v != null && p.t >= t0).length) };
      if (l.dash) attrs['stroke-dasharray'] = l.dash;
      if (l.width) attrs['stroke-width'] = l.width;
      node.append(svg('path', attrs));
    }
    const label = svg('text', { x: lx + 12, y: h - 4 }, l.name);
    node.append(svg('rect', { x: lx, y: h - 12, width: 9, height: 9, fill: color }), label);
    lx += 20 + 6.2 * l.name.length;
  });
}

const sum = (obj) => Object.values(obj || {}).reduce((a, b) => a + b, 0);
const classOf = (d, name) => (d.classes || []).find((c) => c.class === name);
const tenantOf = (top, label) => (top.tenants || []).find((t) => t.tenant === label);
const parts = (obj) => Object.entries(obj || {}).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${fmt(v)}`).join(', ');

function renderTotals(d) {
  for (const key of ['offered', 'admitted', 'useful', 'rejected', 'consumed_units']) {
    $(`#totals [data-field="${key}"]`).textContent = fmtRate(rate((x) => x.totals[key]));
  }
  $('#totals [data-field="inflight"]').textContent = fmt(d.totals.inflight);
}

function renderClasses(d) {
  const body = $('#classes tbody');
  body.replaceChildren();
  for (const c of d.classes) {
    const tr = el('tr', { 'data-class': c.class });
    const cell = (field, text, cls) => tr.append(el('td', { 'data-field': field, ...(cls ? { class: cls } : {}) }, text));
    cell('class', c.class || '(none)');
    cell('offered', fmt(c.offered));
    cell('admitted', fmt(c.admitted));
    cell('useful', fmt(c.completed.useful || 0));
    cell('rejected', fmt(sum(c.rejected)));
    cell('reasons', parts(c.rejected) + (c.shadow ? ` (shadow: ${parts(c.shadow)})` : ''), 'reasons');
    cell('consumed', fmt(c.units.consumed || 0));
    cell('inflight', fmt(c.inflight));
    cell('offered_rate', fmtRate(rate((x) => classOf(x, c.class)?.offered)));
    cell('rejected_rate', fmtRate(rate((x) => { const k = classOf(x, c.class); return k ? sum(k.rejected) : null; })));
    cell('units_rate', fmtRate(rate((x) => classOf(x, c.class)?.units.consumed)));
    body.append(tr);
  }
}

// tenantCell shows a label, and the key behind it once a lookup found it.
function tenantCell(label) {
  const td = el('td', { 'data-field': 'tenant' });
  const key = keys.get(label);
  if (key != null) {
    td.dataset.key = key;
    td.append(el('span', { class: 'key' }, key), el('span', { class: 'lbl' }, label));
  } else {
    td.textContent = label;
  }
  return td;
}

function renderTop(id, top, key, extra) {
  const body = $(`#${id} tbody`);
  body.replaceChildren();
  for (const t of top.tenants || []) {
    const tr = el('tr', { 'data-tenant': t.tenant });
    tr.append(tenantCell(t.tenant));
    tr.append(el('td', { 'data-field': 'count' }, fmt(t.count)));
    tr.append(el('td', { 'data-field': 'error' }, t.error ? fmt(t.error) : '0'));
    tr.append(el('td', { 'data-field': 'rate' }, fmtRate(rate((x) => tenantOf(x.tenants[key], t.tenant)?.count))));
    tr.append(el('td', { 'data-field': 'by', class: 'reasons' }, extra(t)));
    body.append(tr);
  }
  $(`#${id}-note`).textContent = `${fmt(top.total)} in all; the sketch keeps ${top.capacity} tenants, each count within ± its error (at most ${fmt(top.capacity ? top.total / top.capacity : 0)}).`;
}

function gateState(g) {
  const out = [];
  if (g.level) out.push(`ladder ${g.level}`);
  if (g.shed_fraction != null) out.push(`shed ${(100 * g.shed_fraction).toFixed(1)}%`);
  if (g.limit != null) out.push(`limit ${g.limit}, in flight ${g.inflight}`);
  if (g.queue) out.push(`queue ${g.queue.waiting} waiting, oldest ${g.queue.oldest_seconds.toFixed(3)} s, dropped ${fmt(g.queue.dropped)}`);
  if (g.store_failures != null) out.push(`store failures ${fmt(g.store_failures)} (${g.failure_policy})`);
  return out.join(' · ') || '–';
}

function renderGates(d) {
  const body = $('#gates tbody');
  const names = d.gates.map((g) => g.name);
  for (const tr of [...body.children]) if (!names.includes(tr.dataset.gate)) tr.remove();
  d.gates.forEach((g, i) => {
    let tr = [...body.children].find((r) => r.dataset.gate === g.name);
    if (!tr) {
      tr = el('tr', { 'data-gate': g.name });
      tr.append(el('td', { 'data-field': 'name' }, g.name), el('td', { 'data-field': 'mode', class: 'mode' }), el('td', { 'data-field': 'state', class: 'state' }));
      const sel = el('select', { 'aria-label': `mode of ${g.name}`, class: 'mode-select' });
      for (const m of ['enforce', 'shadow', 'off']) sel.append(el('option', { value: m }, m));
      sel.value = g.mode;
      const btn = el('button', { type: 'button', class: 'apply' }, 'apply');
      btn.addEventListener('click', () => switchMode(g.name, sel.value));
      const td = el('td', { 'data-field': 'switch' });
      td.append(sel, btn);
      tr.append(td);
    }
    if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    const mode = $('[data-field="mode"]', tr);
    mode.textContent = g.mode;
    mode.className = `mode ${g.mode}`;
    $('[data-field="state"]', tr).textContent = gateState(g);
  });
}

function renderCharts(d) {
  // useful is at most admitted, often equal: admitted is drawn over it,
  // thin and dashed, so that both show.
  drawChart($('#chart-requests'), [
    { name: 'offered', color: '#7f7f7f', points: series((x) => x.totals.offered) },
    { name: 'useful', color: '#2ca02c', width: 3.5, points: series((x) => x.totals.useful) },
    { name: 'admitted', color: '#1f77b4', dash: '5 3', points: series((x) => x.totals.admitted) },
    { name: 'rejected', color: '#d62728', points: series((x) => x.totals.rejected) },
  ]);
  const reasons = [...new Set(history.flatMap((h) => h.d.classes.flatMap((c) => Object.keys(c.rejected))))].sort();
  drawChart($('#chart-reasons'), reasons.map((r) => ({ name: r, points: series((x) => x.classes.reduce((a, c) => a + (c.rejected[r] || 0), 0)) })));
  drawChart($('#chart-units'), d.classes.map((c) => ({ name: c.class || '(none)', points: series((x) => classOf(x, c.class)?.units.consumed) })));
  drawChart($('#chart-tenants'), (d.tenants.rejected.tenants || []).slice(0, TOP_PLOTTED).map((t) => ({
    name: keys.get(t.tenant) ?? t.tenant, points: series((x) => tenantOf(x.tenants.rejected, t.tenant)?.count),
  })));
  const gate = (x, name) => x.gates.find((g) => g.name === name);
  drawChart($('#chart-queues'), d.gates.filter((g) => g.queue).map((g) => ({
    name: g.name, points: level((x) => gate(x, g.name)?.queue?.oldest_seconds),
  })));
  drawChart($('#chart-inflight'), [
    { name: 'in flight', color: '#1f77b4', points: level((x) => x.totals.inflight) },
    ...d.gates.filter((g) => g.limit != null).map((g, i) => ({
      name: `${g.name} limit`, color: PALETTE[(i + 2) % PALETTE.length], dash: '4 2', points: level((x) => gate(x, g.name)?.limit),
    })),
  ]);
}

function setStatus(text, error) {
  const s = $('#status');
  s.textContent = text;
  s.classList.toggle('error', !!error);
}

function render(d) {
  renderTotals(d);
  renderClasses(d);
  renderTop('top-rejected', d.tenants.rejected, 'rejected', (t) => parts(t.by));
  renderTop('top-consumed', d.tenants.consumed, 'consumed', (t) => {
    const done = sum(t.by);
    return done ? `${((100 * (t.by.useful || 0)) / done).toFixed(1)}%` : '–';
  });
  renderGates(d);
  renderCharts(d);
}

// lookup asks the admin API about labels and keys with the token typed
// in; it returns the answer's tenants, or throws.
async function lookup(body) {
  const token = $('#token').value.trim();
  if (!token) throw new Error('type the admin token first');
  const r = await fetch('/v1/tenants/lookup', {
    method: 'POST', cache: 'no-store',
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  const out = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(out.error || `answered ${r.status}`);
  for (const t of out.tenants) {
    if (t.known) keys.set(t.label, t.key);
    else missed.set(t.label, Date.now());
  }
  return out.tenants;
}

// resolve looks up the listed labels not yet resolved, when a token is
// typed in; a wrong token shows in the find box's status.
async function resolve(d) {
  if (!$('#token').value.trim()) return;
  const labels = [...new Set([...(d.tenants.rejected.tenants || []), ...(d.tenants.consumed.tenants || [])].map((t) => t.tenant))]
    .filter((l) => !keys.has(l) && !(Date.now() - (missed.get(l) ?? -Infinity) < MISS_MS)).slice(0, 100);
  if (!labels.length) return;
  try {
    await lookup({ labels });
  } catch (e) {
    const out = $('#find-result');
    out.textContent = `tenant lookup: ${e.message}`;
    out.className = 'result error';
  }
}

async function find() {
  const out = $('#find-result');
  const v = $('#find').value.trim();
  if (!v) return;
  try {
    const [asLabel, asKey] = await lookup({ labels: [v], keys: [v] });
    if (asLabel.known) out.textContent = `${asLabel.label} is ${asLabel.key}`;
    else out.textContent = `${v} has label ${asKey.label}${asKey.known ? '' : ' (not among the tenants the metrics hold now)'}`;
    out.className = 'result ok';
    if (history.length) render(history[history.length - 1].d);
  } catch (e) {
    out.textContent = e.message;
    out.className = 'result error';
  }
}

// keep adds a reading to the history, oldest first, at most HISTORY + 1.
function keep(d) {
  const t = Date.parse(d.time) / 1000;
  if (history.length && t <= history[history.length - 1].t) return; // already kept
  history.push({ t, d });
  if (history.length > HISTORY + 1) history.shift();
}

// loadHistory fills the history with the server's last readings, so that
// the charts open on the last minutes.
async function loadHistory() {
  try {
    const r = await fetch('/v1/live/history', { cache: 'no-store' });
    if (!r.ok) return;
    const body = await r.json();
    for (const d of body.readings || []) keep(d);
    document.body.dataset.history = String(history.length);
  } catch (e) {
    // An older server without a history: the charts fill as the page polls.
  }
}

async function poll() {
  try {
    const r = await fetch(`/v1/live?n=${TOP}`, { cache: 'no-store' });
    if (!r.ok) throw new Error(`/v1/live answered ${r.status}`);
    const d = await r.json();
    keep(d);
    await resolve(d);
    render(d);
    polls++;
    document.body.dataset.polls = String(polls);
    document.body.dataset.time = d.time;
    setStatus(`policy ${d.policy} · read ${new Date(d.time).toLocaleTimeString()} · ${polls} readings`);
  } catch (e) {
    setStatus(`cannot read /v1/live: ${e.message}`, true);
  }
  setTimeout(poll, EVERY_MS);
}

async function switchMode(name, mode) {
  const out = $('#switch-result');
  const token = $('#token').value.trim();
  if (!token) {
    out.textContent = 'type the admin token first';
    out.className = 'result error';
    return;
  }
  try {
    const r = await fetch(`/v1/gates/${encodeURIComponent(name)}`, {
      method: 'POST', headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' }, body: JSON.stringify({ mode }),
    });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || `answered ${r.status}`);
    out.textContent = `${body.name} is now in ${body.mode} mode`;
    out.className = 'result ok';
  } catch (e) {
    out.textContent = `${name}: ${e.message}`;
    out.className = 'result error';
  }
}

$('#find-go').addEventListener('click', find);
$('#find').addEventListener('keydown', (e) => { if (e.key === 'Enter') find(); });
loadHistory().then(poll);
