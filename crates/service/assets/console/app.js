// Vigil's web console: live alerts, the evidence drawn, rule editing and engine health, over
// the service's own HTTP API. No framework and no build step; uPlot draws the plots.
'use strict';

const PAGE_SIZE = 100;
// Alerts the page holds (the oldest resolved ones leave first).
const MAX_ALERTS = 20000;
const $ = (sel) => document.querySelector(sel);

const state = {
  token: sessionStorage.getItem('vigil-token') || '',
  alerts: new Map(), // id -> latest transition
  silenced: {}, // id -> ids of the Alertmanager silences that hold it
  page: 0,
  view: 'alerts',
  rules: [],
  rule: null,
  lastEventId: null,
  engineTimer: null,
};

// ---- API ----

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const token = state.token;
  if (token) headers.Authorization = 'Bearer ' + token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) {
    // A refusal of a token already replaced says nothing of the new one.
    if (state.token === token) askToken('The token was refused, or this Vigil needs one.');
    throw new Unauthorized('unauthorized');
  }
  const text = await response.text();
  let body = text;
  try { body = JSON.parse(text); } catch (_) { /* text, e.g. /metrics */ }
  if (!response.ok) throw new Error((body && body.error) || response.statusText);
  return body;
}

function askToken(why) {
  const dialog = $('#token-dialog');
  $('#token-why').textContent = why;
  if (!dialog.open) dialog.showModal();
  $('#token-input').focus();
}

$('#token-form').addEventListener('submit', () => {
  state.token = $('#token-input').value.trim();
  sessionStorage.setItem('vigil-token', state.token);
  $('#token-input').value = '';
  start();
});
$('#token-button').addEventListener('click', () => askToken('Set the token this tab sends.'));

// ---- Views ----

for (const button of document.querySelectorAll('nav button')) {
  button.addEventListener('click', () => show(button.dataset.view));
}

function show(view) {
  state.view = view;
  for (const b of document.querySelectorAll('nav button')) {
    if (b.dataset.view === view) b.setAttribute('aria-current', 'page'); else b.removeAttribute('aria-current');
  }
  for (const v of ['alerts', 'rules', 'engine']) $('#view-' + v).hidden = v !== view;
  clearInterval(state.engineTimer);
  if (view === 'rules') loadRules().catch(report);
  if (view === 'engine') {
    loadEngine().catch(report);
    state.engineTimer = setInterval(() => loadEngine().catch(report), 5000);
  }
}

function report(error) {
  if (error instanceof Unauthorized) return;
  console.error(error);
  const live = $('#live');
  live.textContent = String(error.message || error);
  live.classList.remove('on');
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') node.className = v; else if (k === 'text') node.textContent = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

// ---- Alerts ----

// A key as text; a series' label set as Prometheus writes one, `{cpu="0", mode="idle"}`.
function keyText(key) {
  const text = (v) => {
    if (typeof v === 'string') return v;
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      return `{${Object.entries(v).map(([n, x]) => `${n}=${JSON.stringify(String(x))}`).join(', ')}}`;
    }
    return JSON.stringify(v);
  };
  return Object.entries(key || {}).map(([k, v]) => `${k}=${text(v)}`).join(' ');
}

function newer(a, b) {
  // The later transition wins; at one time, resolved comes after firing.
  if (a.time !== b.time) return a.time > b.time;
  return a.status === 'resolved' && b.status !== 'resolved';
}

function take(alert) {
  const old = state.alerts.get(alert.id);
  if (!old || newer(alert, old)) state.alerts.set(alert.id, alert);
  if (state.alerts.size > MAX_ALERTS) {
    const oldest = [...state.alerts.values()].filter((a) => a.status === 'resolved').sort((a, b) => (a.time < b.time ? -1 : 1));
    // A tenth more than needed goes at once, so that the sort is not paid per alert at the cap.
    for (const a of oldest.slice(0, state.alerts.size - MAX_ALERTS * 0.9)) state.alerts.delete(a.id);
  }
}

function filtered() {
  const rule = $('#f-rule').value, severity = $('#f-severity').value, status = $('#f-status').value;
  const label = $('#f-label').value.trim();
  const [lk, lv] = label.includes('=') ? label.split(/=(.*)/s) : [null, null];
  const list = [...state.alerts.values()].filter((a) =>
    (!rule || a.rule === rule) && (!severity || a.severity === severity) && (!status || a.status === status) &&
    (!lk || String((a.labels || {})[lk] ?? (a.key || {})[lk] ?? (a.values || {})[lk] ?? '') === lv));
  // Firing first, then resolved; newest first within each.
  list.sort((a, b) => (a.status !== b.status ? (a.status === 'firing' ? -1 : 1) : (a.time < b.time ? 1 : -1)));
  if ($('#f-group').checked) list.sort((a, b) => (a.rule < b.rule ? -1 : a.rule > b.rule ? 1 : 0));
  return list;
}

function renderCounts() {
  const counts = {};
  for (const a of state.alerts.values()) {
    counts[a.status] = (counts[a.status] || 0) + 1;
    if (a.status === 'firing') counts[a.severity] = (counts[a.severity] || 0) + 1;
  }
  const box = $('#counts');
  box.replaceChildren();
  for (const [name, label] of [['firing', 'firing'], ['critical', 'critical firing'], ['warning', 'warning firing'], ['info', 'info firing'], ['resolved', 'resolved']]) {
    box.append(el('span', { class: 'count', 'data-count': name }, el('b', { text: String(counts[name] || 0) }), label));
  }
}

function renderAlerts() {
  renderCounts();
  const list = filtered();
  const pages = Math.max(1, Math.ceil(list.length / PAGE_SIZE));
  state.page = Math.min(state.page, pages - 1);
  const rows = list.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE);
  const body = $('#alerts tbody');
  const out = [];
  let group = null;
  for (const a of rows) {
    if ($('#f-group').checked && a.rule !== group) {
      group = a.rule;
      out.push(el('tr', { class: 'group' }, el('td', { colspan: '6', text: group })));
    }
    const silenced = a.status === 'firing' && state.silenced[a.id];
    const tr = el('tr', { tabindex: '0', 'data-id': a.id, 'data-status': a.status, 'data-rule': a.rule, 'data-silenced': silenced ? 'true' : 'false' },
      el('td', { class: 'status-' + a.status, text: silenced ? 'firing, silenced' : a.status }),
      el('td', { class: 'sev-' + a.severity, text: a.severity }),
      el('td', { text: a.rule }),
      el('td', { class: 'key', text: keyText(a.key) }),
      el('td', { text: (a.annotations || {}).summary || '' }),
      el('td', { text: a.time.replace('T', ' ').replace(/\.\d+Z$/, 'Z') }));
    tr.addEventListener('click', () => openAlert(a.id));
    tr.addEventListener('keydown', (e) => { if (e.key === 'Enter') openAlert(a.id); });
    out.push(tr);
  }
  body.replaceChildren(...out);
  $('#page').textContent = `page ${state.page + 1} of ${pages} (${list.length} alerts)`;
  $('#prev').disabled = state.page === 0;
  $('#next').disabled = state.page >= pages - 1;
  const rules = new Set([...state.alerts.values()].map((a) => a.rule).concat(state.rules.map((r) => r.name)));
  const select = $('#f-rule');
  const chosen = select.value;
  if (select.options.length - 1 !== rules.size) {
    select.replaceChildren(el('option', { value: '', text: 'all' }), ...[...rules].sort().map((r) => el('option', { text: r })));
    select.value = chosen;
  }
}

let renderQueued = false;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => { renderQueued = false; renderAlerts(); });
}

$('#prev').addEventListener('click', () => { state.page--; renderAlerts(); });
$('#next').addEventListener('click', () => { state.page++; renderAlerts(); });
for (const id of ['#f-rule', '#f-severity', '#f-status', '#f-group']) $(id).addEventListener('change', () => { state.page = 0; renderAlerts(); });
$('#f-label').addEventListener('input', () => { state.page = 0; renderAlerts(); });
$('#filters').addEventListener('submit', (e) => { e.preventDefault(); loadHistory().catch(report); });

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== '' && v != null) q.set(k, v);
  return q.toString();
}

// Pages of alerts from the store through the API's filters and cursor.
async function loadHistory() {
  const local = (v) => (v ? new Date(v).toISOString() : '');
  const label = $('#f-label').value.trim();
  const params = {
    rule: $('#f-rule').value, severity: $('#f-severity').value, status: $('#f-status').value,
    key: label.includes('=') ? label : '', from: local($('#f-from').value), to: local($('#f-to').value), limit: 1000,
  };
  let cursor = null;
  for (let n = 0; n < 10; n++) {
    const page = await api('/api/v1/alerts?' + query(Object.assign({}, params, { cursor })));
    for (const a of page.alerts) take(a);
    if (!page.next_cursor) break;
    cursor = page.next_cursor;
  }
  renderAlerts();
}

// The live stream, read with fetch so that the token goes in a header (EventSource cannot).
// `connected` is called once the server has answered: from then on every new transition comes
// through the stream, so the history read after it misses nothing.
async function stream(connected) {
  const live = $('#live');
  for (;;) {
    try {
      const headers = { Accept: 'text/event-stream' };
      const token = state.token;
      if (token) headers.Authorization = 'Bearer ' + token;
      if (state.lastEventId) headers['Last-Event-ID'] = state.lastEventId;
      const response = await fetch('/api/v1/alerts/stream', { headers });
      if (response.status === 401) {
        // A refusal of a token already replaced: connect again with the new one.
        if (state.token !== token) continue;
        started = false;
        askToken('This Vigil needs a token to read alerts.');
        connected();
        return;
      }
      if (!response.ok || !response.body) throw new Error('stream: ' + response.status);
      live.textContent = 'live';
      live.classList.add('on');
      connected();
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const chunk = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let data = '', id = null;
          for (const line of chunk.split('\n')) {
            if (line.startsWith('data:')) data += line.slice(5).trim();
            else if (line.startsWith('id:')) id = line.slice(3).trim();
          }
          if (id) state.lastEventId = id;
          if (data) { take(JSON.parse(data)); scheduleRender(); }
        }
      }
    } catch (error) {
      report(error);
    }
    live.textContent = 'reconnecting';
    live.classList.remove('on');
    await new Promise((r) => setTimeout(r, 2000));
  }
}

// ---- Alert detail ----

function kv(obj) {
  const dl = el('dl', { class: 'kv' });
  for (const [k, v] of Object.entries(obj || {})) {
    dl.append(el('dt', { text: k }), typeof v === 'string' ? el('dd', { text: v }) : el('dd', { text: fmt(v), title: JSON.stringify(v) }));
  }
  return dl;
}

async function openAlert(id) {
  const { alert, transitions } = await api('/api/v1/alerts/' + encodeURIComponent(id));
  const drawer = $('#detail');
  $('#detail-title').textContent = `${alert.rule}: ${keyText(alert.key)}`;
  const body = $('#detail-body');
  body.replaceChildren(
    el('p', { class: 'status-' + alert.status, text: `${alert.status}, ${alert.severity}, since ${alert.starts_at}` }),
    ...(state.silenced[alert.id] ? [el('p', { class: 'silenced', text: `Silenced in Alertmanager (${state.silenced[alert.id].join(', ')})` })] : []),
    el('h3', { text: 'Evidence' }), evidenceView(alert),
    el('h3', { text: 'Values' }), kv(alert.values),
    el('h3', { text: 'Labels' }), kv(alert.labels),
    el('h3', { text: 'Annotations' }), kv(alert.annotations),
    el('h3', { text: 'Transitions' }),
    el('ul', {}, ...transitions.map((t) => el('li', { text: `${t.time} ${t.status}` }))));
  drawer.hidden = false;
  $('#detail-close').focus();
}

function closeDetail() { $('#detail').hidden = true; }
$('#detail-close').addEventListener('click', closeDetail);
document.addEventListener('keydown', (e) => { if (e.key === 'Escape') closeDetail(); });

function ms(t) { return typeof t === 'number' ? t : Date.parse(t); }

function evidenceView(alert) {
  const items = alert.evidence || [];
  const box = el('div', { class: 'evidence' });
  const windows = items.filter((e) => e && e.window !== undefined && e.end);
  const events = items.filter((e) => e && e.stream && e.ts !== undefined);
  const baseline = items.find((e) => e && e.baseline);
  const cluster = items.find((e) => e && e.cluster);
  const scored = items.find((e) => e && e.thresholds);
  if (windows.length >= 2) box.append(windowPlot(alert, windows, baseline && baseline.baseline, scored));
  if (cluster) box.append(peerPlot(alert, cluster.cluster));
  if (events.length) box.append(timeline(events));
  if (scored) {
    box.append(el('h3', { text: 'Tests of the condition' }),
      el('table', {}, el('thead', {}, el('tr', {}, el('th', { text: 'test' }), el('th', { text: 'value' }), el('th', { text: 'threshold' }), el('th', { text: 'holds' }))),
        el('tbody', {}, ...scored.thresholds.map((t) => el('tr', {}, el('td', { text: t.test }), el('td', { text: fmt(t.value) }), el('td', { text: fmt(t.threshold) }), el('td', { text: t.holds ? 'yes' : 'no' }))))),
      el('h3', { text: 'Scorers and their baselines' }), kv(scored.scorers));
  }
  if (baseline) box.append(el('h3', { text: 'Baseline' }), kv(baseline.baseline));
  if (!box.childNodes.length) box.append(el('p', { text: 'No evidence kept for this alert.' }));
  return box;
}

// Numbers as people read them: whole numbers as they are, others to four significant digits,
// as the rules' templates show them. The exact values stay in the API, and in a value's title.
function readable(n) { return Number.isInteger(n) ? n : Number(n.toPrecision(4)); }
function fmt(v) {
  return typeof v === 'number' ? String(readable(v)) : JSON.stringify(v, (_, x) => (typeof x === 'number' ? readable(x) : x));
}

function plotWidth() { return Math.max(260, Math.min(720, window.innerWidth - 60)); }

// A window rule's window states over time, the baseline values as flat lines, and the firing
// span shaded.
function windowPlot(alert, windows, baseline, scored) {
  const sorted = windows.slice().sort((a, b) => ms(a.end) - ms(b.end));
  const skip = new Set(['window', 'start', 'end']);
  const fields = Object.keys(sorted[0]).filter((k) => !skip.has(k) && sorted.some((w) => typeof w[k] === 'number'));
  const xs = sorted.map((w) => ms(w.end) / 1000);
  const data = [xs, ...fields.map((f) => sorted.map((w) => (typeof w[f] === 'number' ? w[f] : null)))];
  const series = [{}, ...fields.map((f, i) => ({ label: f, stroke: ['#1565c0', '#6a1b9a', '#00838f', '#ef6c00'][i % 4], width: 2 }))];
  const lines = [];
  for (const [name, v] of Object.entries(baseline || {})) if (typeof v === 'number') lines.push([name, v]);
  if (scored) {
    for (const [name, s] of Object.entries(scored.scorers || {})) {
      for (const k of ['median', 'low', 'high']) if (typeof s[k] === 'number') lines.push([`${name} ${k}`, s[k]]);
    }
  }
  for (const [name, v] of lines) { data.push(xs.map(() => v)); series.push({ label: name, stroke: '#c0392b', dash: [6, 4], width: 1 }); }
  const from = ms(alert.starts_at) / 1000, to = (alert.ends_at ? ms(alert.ends_at) : ms(alert.time)) / 1000;
  return plot('window states', data, series, from, to);
}

// An outlier among its peers: the peers' values in rank order, the median, and the alert's own
// value marked.
function peerPlot(alert, c) {
  const peers = c.peers || [];
  const xs = peers.map((_, i) => i + 1);
  const own = Object.values(alert.values || {}).find((v) => typeof v === 'number');
  const data = [xs, peers, xs.map(() => c.median), xs.map(() => own ?? null)];
  const series = [{}, { label: 'peers', stroke: '#1565c0', width: 0, points: { show: true, size: 6 } },
    { label: 'median', stroke: '#2e7d32', dash: [6, 4] }, { label: 'this key', stroke: '#c0392b', width: 2 }];
  return plot(`peers (${c.size}), score ${fmt(c.score)}`, data, series, null, null, false);
}

function plot(title, data, series, from, to, time = true) {
  const box = el('div', { class: 'plot', 'aria-label': title });
  const shade = {
    hooks: {
      draw: [(u) => {
        if (from == null) return;
        const x0 = u.valToPos(from, 'x', true), x1 = u.valToPos(Math.max(to, from), 'x', true);
        u.ctx.save();
        u.ctx.fillStyle = 'rgba(192,57,43,0.12)';
        u.ctx.fillRect(x0, u.bbox.top, Math.max(x1 - x0, 3), u.bbox.height);
        u.ctx.restore();
      }],
    },
  };
  if (typeof uPlot === 'undefined') { box.textContent = 'uPlot did not load'; return box; }
  // eslint-disable-next-line no-new
  new uPlot({ title, width: plotWidth(), height: 240, scales: { x: { time } }, series, plugins: [shade] }, data, box);
  return box;
}

// A sequence's events on a time line.
function timeline(events) {
  const times = events.map((e) => ms(e.ts));
  const lo = Math.min(...times), hi = Math.max(...times), span = Math.max(hi - lo, 1);
  const line = el('div', { class: 'timeline', role: 'img', 'aria-label': 'events on a time line' });
  events.forEach((e, i) => {
    const left = `${((times[i] - lo) / span) * 100}%`;
    // Positions through the style object: the page's policy allows no inline style attributes.
    const dot = el('span', { class: 'dot', title: JSON.stringify(e) });
    const tick = el('span', { class: 'tick', text: `${i + 1}` });
    dot.style.left = left;
    tick.style.left = left;
    line.append(dot, tick);
  });
  const list = el('ol', {}, ...events.map((e) => el('li', { class: 'key', text: JSON.stringify(e) })));
  return el('div', {}, line, list);
}

// ---- Rules ----

function metric(text, name) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const m = line.match(/^([a-z_]+)(?:\{(.*)\})? ([^ ]+)$/);
    if (!m || m[1] !== name) continue;
    const labels = {};
    for (const part of (m[2] || '').matchAll(/([a-z_]+)="((?:[^"\\]|\\.)*)"/g)) labels[part[1]] = part[2];
    out.push({ labels, value: Number(m[3]) });
  }
  return out;
}

async function loadRules() {
  const [{ rules }, metrics] = await Promise.all([api('/api/v1/rules'), api('/metrics')]);
  state.rules = rules;
  const fired = {};
  for (const m of metric(String(metrics), 'vigil_alerts_total')) fired[m.labels.rule] = (fired[m.labels.rule] || 0) + m.value;
  const last = {};
  for (const a of state.alerts.values()) if (!last[a.rule] || a.time > last[a.rule]) last[a.rule] = a.time;
  const body = $('#rules tbody');
  body.replaceChildren(...rules.map((r) => {
    const tr = el('tr', { tabindex: '0', 'data-rule': r.name },
      el('td', { text: r.name }), el('td', { text: r.model || '' }), el('td', { text: r.description || '' }),
      el('td', { text: String(fired[r.name] || 0) }), el('td', { text: last[r.name] || '-' }));
    tr.addEventListener('click', () => openRule(r.name).catch(report));
    tr.addEventListener('keydown', (e) => { if (e.key === 'Enter') openRule(r.name).catch(report); });
    return tr;
  }));
}

async function openRule(name) {
  const { source, explain } = await api('/api/v1/rules/' + encodeURIComponent(name));
  state.rule = name;
  $('#rule-detail').hidden = false;
  $('#rule-name').textContent = name;
  $('#source').value = source;
  $('#explain').textContent = explain || '';
  $('#save-result').textContent = '';
  $('#why-result').replaceChildren();
  validate();
  $('#source').focus();
}

// ---- Why didn't it page? ----

// Asks why the open rule did not alert through a past incident, from the team's Prometheus
// history (`GET /api/v1/rules/{name}/why`), and draws each threshold test through it.
async function askWhy(event) {
  event.preventDefault();
  const out = $('#why-result');
  const from = $('#why-from').value, to = $('#why-to').value;
  if (!from || !to) { out.replaceChildren(el('p', { class: 'error', text: "Give the incident's start and end." })); return; }
  const q = new URLSearchParams({ from: new Date(from).toISOString(), to: new Date(to).toISOString() });
  for (const k of ['host', 'key', 'lookback']) {
    const v = $('#why-' + k).value.trim();
    if (v) q.set(k, v);
  }
  out.replaceChildren(el('p', { text: 'Replaying the history through the rule…' }));
  $('#why-ask').disabled = true;
  try {
    const answer = await api(`/api/v1/rules/${encodeURIComponent(state.rule)}/why?${q}`);
    out.replaceChildren(...whyView(answer));
  } catch (error) {
    out.replaceChildren(el('p', { class: 'error', text: String(error.message || error) }));
  } finally {
    $('#why-ask').disabled = false;
  }
}
$('#why').addEventListener('submit', (e) => { askWhy(e).catch(report); });

function whyView(a) {
  const parts = [el('p', { class: 'key', text: `alert ${a.condition}` })];
  if (!a.groups.length) parts.push(el('p', { text: 'The rule judged nothing in the range: no samples it reads, or none matching.' }));
  for (const g of a.groups) {
    parts.push(el('h4', { class: 'key', text: g.key }), el('p', { class: 'verdict', text: g.verdict }));
    a.tests.forEach((t, i) => { if (t.threshold != null) parts.push(testPlot(a, g, i)); });
  }
  if (a.caught) return parts;
  if (!a.changes.length) {
    parts.push(el('p', { text: 'No change of one or two thresholds makes the condition hold in a judged window.' }));
    return parts;
  }
  parts.push(el('h4', { text: 'Smallest changes of one threshold (two when no one suffices), each checked by replaying the history with it' }));
  parts.push(el('ul', { class: 'changes' }, ...a.changes.map((c) => el('li', { text: changeText(a, c) }))));
  return parts;
}

function changeText(a, c) {
  const outcome = c.caught
    ? `caught at ${new Date(c.caught.time).toISOString()} (${c.caught.severity})`
    : `still not caught: ${c.missed || 'no window judged'}`;
  const perWeek = (cost) => readable(cost.host_days > 0 ? (cost.pages * 7) / cost.host_days : 0);
  const moved = [c, ...c.also].map((m) => `${m.text} → ${readable(m.to)}`).join(' and ');
  return `${moved}: ${outcome}. Over the history: ${a.cost.alerts} → ${c.cost.alerts} alerts, `
    + `${a.cost.pages} → ${c.cost.pages} pages (${perWeek(a.cost)} → ${perWeek(c.cost)} per host per week).`;
}

// One threshold test through the incident: the value it compared in each judged window, its
// threshold, and the change found for it; the group's first alert shaded.
function testPlot(a, g, i) {
  const points = g.points.filter((p) => p.active);
  const xs = points.map((p) => p.end / 1000);
  const data = [xs, points.map((p) => p.values[i])];
  const series = [{}, { label: a.tests[i].text, stroke: '#1565c0', width: 2 }];
  data.push(xs.map(() => a.tests[i].threshold));
  series.push({ label: 'threshold', stroke: '#c0392b', dash: [6, 4], width: 1 });
  const change = a.changes.flatMap((c) => [c, ...c.also]).find((m) => m.test === i);
  if (change) {
    data.push(xs.map(() => change.to));
    series.push({ label: `changed to ${readable(change.to)}`, stroke: '#2e7d32', dash: [6, 4], width: 1 });
  }
  const alert = g.alerts.length ? g.alerts[0].time / 1000 : null;
  return plot(a.tests[i].text, data, series, alert, alert);
}

let validateTimer = null;
let validation = 0;
$('#source').addEventListener('input', () => { clearTimeout(validateTimer); validateTimer = setTimeout(validate, 250); });
$('#source').addEventListener('scroll', () => { $('#gutter').scrollTop = $('#source').scrollTop; });

function gutter(bad) {
  const n = $('#source').value.split('\n').length;
  const g = $('#gutter');
  g.replaceChildren(...Array.from({ length: n }, (_, i) => el('span', { class: bad.has(i + 1) ? 'bad' : '', 'data-line': String(i + 1), text: String(i + 1) })));
}

async function validate() {
  const mine = ++validation;
  const text = $('#source').value;
  const result = await api(`/api/v1/rules/validate?name=${encodeURIComponent(state.rule + '.saql')}`, { method: 'POST', body: text }).catch(report);
  if (!result || mine !== validation) return;
  const list = $('#diagnostics');
  const bad = new Set(result.diagnostics.map((d) => d.line));
  gutter(bad);
  $('#save').disabled = !result.valid;
  if (result.valid) {
    list.replaceChildren(el('li', { class: 'ok', text: `valid: ${result.rules.join(', ')}` }));
  } else {
    list.replaceChildren(...result.diagnostics.map((d) => el('li', { 'data-line': String(d.line), text: `${d.line}:${d.column} ${d.code} ${d.message}${d.help ? '\n  help: ' + d.help : ''}` })));
  }
}

$('#save').addEventListener('click', async () => {
  const out = $('#save-result');
  try {
    const r = await api('/api/v1/rules/' + encodeURIComponent(state.rule), { method: 'PUT', body: $('#source').value });
    out.textContent = `saved to ${r.saved}; rules that kept their state: ${r.kept_state.join(', ') || 'none'}`;
    out.className = '';
    const again = await api('/api/v1/rules/' + encodeURIComponent(state.rule));
    $('#explain').textContent = again.explain || '';
  } catch (error) {
    out.textContent = 'not saved: ' + error.message;
    out.className = 'error';
  }
});

// ---- Engine ----

function card(title, rows) {
  const table = el('table', {}, el('tbody', {}, ...rows.map(([k, v]) => el('tr', {}, el('td', { text: k }), el('td', { text: String(v) })))));
  return el('section', { class: 'card' }, el('h2', { text: title }), rows.length ? table : el('p', { text: 'none' }));
}

async function loadEngine() {
  const [text, ready, dead, webhook] = await Promise.all([
    api('/metrics'), fetch('/readyz').then((r) => r.json()).catch(() => ({})), api('/api/v1/dead-letters'), api('/api/v1/webhook'),
  ]);
  const m = (name) => metric(String(text), name);
  const byLabel = (name, label) => m(name).map((x) => [x.labels[label] || '-', x.value]);
  const cards = [
    card('Readiness', Object.entries(ready).flatMap(([k, v]) => (v && typeof v === 'object' && !Array.isArray(v)
      ? Object.entries(v).map(([k2, v2]) => [`${k} ${k2}`, v2])
      : [[k, typeof v === 'string' ? v : JSON.stringify(v)]]))),
    card('Watermark and lag', [['watermark lag (ms)', (m('vigil_watermark_lag_milliseconds')[0] || {}).value ?? '-'],
      ...m('vigil_kafka_consumer_lag').map((x) => [`${x.labels.topic}[${x.labels.partition}] lag`, x.value])]),
    card('Live keys per rule', byLabel('vigil_live_keys', 'rule')),
    card('Late events per rule', byLabel('vigil_events_late_total', 'rule')),
    card('Shed and malformed', [...byLabel('vigil_events_shed_total', 'source').map(([k, v]) => [`shed ${k}`, v]),
      ...byLabel('vigil_events_malformed_total', 'source').map(([k, v]) => [`malformed ${k}`, v])]),
    card('State', [['state bytes', (m('vigil_state_bytes')[0] || {}).value ?? '-'], ['spooled alerts', (m('vigil_spooled_alerts')[0] || {}).value ?? '-'],
      ...m('vigil_store_errors_total').map((x) => [`store errors ${x.labels.operation}`, x.value])]),
    card('Webhook deliveries', [...byLabel('vigil_webhook_deliveries_total', 'outcome').map(([k, v]) => [`attempts ${k}`, v]),
      ...Object.entries((webhook && webhook.deliveries) || {}).map(([k, v]) => [`in the outbox: ${k}`, v])]),
    card(`Dead letters (${dead.dead_letters.length})`, dead.dead_letters.slice(0, 20).map((d) => [d.source || d.time || '', d.reason || JSON.stringify(d)])),
  ];
  const redeliver = el('button', { type: 'button', id: 'redeliver', text: 'Redeliver dead webhook calls' });
  redeliver.addEventListener('click', async () => {
    const r = await api('/api/v1/webhook/redeliver', { method: 'POST' }).catch(report);
    if (r) redeliver.textContent = `redelivering: ${JSON.stringify(r)}`;
  });
  cards[6].append(redeliver);
  $('#engine').replaceChildren(...cards);
}

// ---- Start ----

let started = false;
// What the Alertmanagers hold silenced (`--alertmanager-url`), read every 10 s: Vigil keeps no
// silences of its own.
async function loadSilenced() {
  try {
    const { silenced } = await api('/api/v1/alertmanager/silenced');
    if (JSON.stringify(silenced) !== JSON.stringify(state.silenced)) {
      state.silenced = silenced;
      scheduleRender();
    }
  } catch (error) {
    report(error);
  }
}
setInterval(loadSilenced, 10000);

async function start() {
  try {
    // The stream first, so that nothing stored between the two is missed; both feed `take`.
    if (!started) {
      started = true;
      await new Promise((resolve) => { stream(resolve); });
    }
    await loadHistory();
    await loadSilenced();
    if (state.view !== 'alerts') show(state.view);
    // A link to one alert (Alertmanager's generatorURL): `/?alert=ID` opens it.
    const linked = new URLSearchParams(window.location.search).get('alert');
    if (linked) await openAlert(linked);
  } catch (error) {
    report(error);
  }
}

start();
