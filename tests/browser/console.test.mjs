// The web console in a real browser: Debian's Chromium, headless, driven by playwright-core,
// against a real `vigil serve` on SQLite that replayed the bundled sample. Screenshots go to
// target/browser-artifacts (VIGIL_BROWSER_ARTIFACTS). Run by scripts/test.sh:
//   node --test tests/browser/console.test.mjs   (VIGIL_BIN, CHROMIUM to override the paths)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, cpSync, mkdirSync, rmSync, readFileSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { gunzipSync } from 'node:zlib';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const ROOT = path.resolve(import.meta.dirname, '../..');
const VIGIL = process.env.VIGIL_BIN || path.join(ROOT, 'target/debug/vigil');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const ARTIFACTS = process.env.VIGIL_BROWSER_ARTIFACTS || path.join(ROOT, 'target/browser-artifacts');
const SAMPLE_ALERTS = 17;

/// Starts `vigil serve` on a copy of the shipped rules, replaying the sample; resolves with its URL.
async function serve(extra = []) {
  const dir = mkdtempSync(path.join(tmpdir(), 'vigil-console-'));
  cpSync(path.join(ROOT, 'rules'), path.join(dir, 'rules'), { recursive: true });
  const args = ['serve', '--replay', path.join(ROOT, 'samples/datacenter.jsonl'), '--rules', path.join(dir, 'rules'),
    '--database-url', `sqlite://${dir}/vigil.db`, '--spool-dir', `${dir}/spool`, '--ingest-log-dir', `${dir}/ingest`,
    '--http-addr', '127.0.0.1:0', ...extra];
  const child = spawn(VIGIL, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('vigil serve did not start:\n' + output)), 60000);
    const read = (d) => {
      output += d;
      const m = output.match(/listening on (http:\/\/[0-9.]+:[0-9]+)\n/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    };
    child.stdout.on('data', read);
    child.stderr.on('data', read);
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`vigil serve exited with ${code}:\n${output}`)); });
  });
  return {
    url,
    stop() { child.kill('SIGTERM'); rmSync(dir, { recursive: true, force: true }); },
  };
}

let browser, service, page;
const errors = [];

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  service = await serve();
  page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); if (process.env.VIGIL_BROWSER_DEBUG) console.log('page:', m.text()); });
});

after(async () => {
  await browser?.close();
  service?.stop();
});

const rows = (p = page) => p.locator('#alerts tbody tr[data-id]');
const shot = (name, p = page) => p.screenshot({ path: path.join(ARTIFACTS, name + '.png') });

/// Polls `check` from here until it is true: the page's own policy forbids the string
/// evaluation that playwright's waitForFunction uses, and the tests keep that policy on.
async function until(what, check, timeout = 15000) {
  const end = Date.now() + timeout;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function untilRows(p, n) {
  let seen = 0;
  await until(`${n} alert rows`, async () => (seen = await rows(p).count()) >= n).catch((e) => {
    throw new Error(`${e.message} (${seen} shown)`);
  });
}

test('the page lists the alerts of the replayed sample', async () => {
  await page.goto(service.url + '/');
  await untilRows(page, SAMPLE_ALERTS);
  assert.equal(await rows().count(), SAMPLE_ALERTS);
  // All resolved but one: h2's disk is still stuck when the sample ends.
  assert.match(await page.textContent('#counts'), new RegExp(`^1\\s*firing.*${SAMPLE_ALERTS - 1}\\s*resolved`));
  // Filters narrow the table in place.
  await page.selectOption('#f-rule', 'straggler_task');
  assert.equal(await rows().count(), 5);
  await page.selectOption('#f-rule', '');
  await shot('alerts');
});

test('an event posted to the API that fires a rule shows within 2 s, without reload', async () => {
  const before = new Set(await page.locator('#alerts tbody tr[data-rule="evicted_then_failed"]').evaluateAll((r) => r.map((x) => x.dataset.id)));
  // An eviction and a failure on another machine (evicted_then_failed), then events that move
  // event time past the allowed lateness (5 s), so that the engine takes both at once. Time
  // follows the slowest source, and the task events pushed over HTTP are one source, a metric
  // series another: each must move on. With only the sample, the task events' source would
  // hold time, and the pair would wait for the engine's idle release (1 s).
  const now = Date.now();
  const lines = [
    { stream: 'task_event', ts: now - 10000, type: 'EVICT', job_id: 'console', task_index: 0, machine_id: 'mA' },
    { stream: 'task_event', ts: now - 9000, type: 'FAIL', job_id: 'console', task_index: 0, machine_id: 'mB' },
    { stream: 'task_event', ts: now, type: 'FINISH', job_id: 'console', task_index: 1, machine_id: 'mA' },
    { stream: 'metric', ts: now, host: 'console', name: 'cpu', value: 1 },
  ].map((e) => JSON.stringify(e)).join('\n');
  const navigations = [];
  page.on('framenavigated', () => navigations.push(page.url()));
  const started = Date.now();
  const response = await fetch(service.url + '/api/v1/events', { method: 'POST', body: lines });
  assert.equal(response.status, 200, await response.text());
  const fresh = async () => (await page.locator('#alerts tbody tr[data-rule="evicted_then_failed"]')
    .evaluateAll((r) => r.map((x) => x.dataset.id))).filter((id) => !before.has(id));
  await until('the new alert on the page', async () => (await fresh()).length > 0, 2000);
  const took = Date.now() - started;
  assert.ok(took <= 2000, `shown after ${took} ms`);
  assert.deepEqual(navigations, [], 'the page did not reload');
  const [id] = await fresh();
  assert.match(await page.textContent(`#alerts tbody tr[data-id="${id}"]`), /t\.job_id=console/);
  await shot('alert-live');
});

test('the alert detail draws its plot, opened from the keyboard', async () => {
  const row = page.locator('#alerts tbody tr[data-rule="machine_cpu_spike"]').first();
  await row.focus();
  await page.keyboard.press('Enter');
  await page.waitForSelector('#detail:not([hidden]) .uplot canvas', { timeout: 5000 });
  const box = await page.locator('#detail .uplot canvas').first().boundingBox();
  assert.ok(box && box.width > 200 && box.height > 100, JSON.stringify(box));
  assert.match(await page.textContent('#detail'), /Transitions/);
  await shot('alert-detail');
  await page.keyboard.press('Escape');
  assert.equal(await page.isHidden('#detail'), true);
  // An outlier is drawn among its peers.
  await page.locator('#alerts tbody tr[data-rule="machine_load_outlier"]').first().click();
  await page.waitForSelector('#detail .plot[aria-label^="peers"] canvas', { timeout: 5000 });
  // Values read to four significant digits (the load is 5.321299999999999 as computed); the
  // exact value stays in the cell's title.
  const shown = await page.locator('#detail dl.kv dd').allTextContents();
  assert.ok(shown.some((t) => /^\d+\.\d+$/.test(t)), JSON.stringify(shown));
  assert.ok(shown.every((t) => !/\d\.\d{5,}/.test(t)), JSON.stringify(shown));
  await shot('alert-outlier');
  await page.keyboard.press('Escape');
});

test('a link to one alert (the generatorURL Alertmanager shows) opens it', async () => {
  const id = await page.locator('#alerts tbody tr[data-rule="straggler_task"]').first().getAttribute('data-id');
  const linked = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  linked.on('pageerror', (e) => errors.push(String(e)));
  await linked.goto(service.url + '/?alert=' + encodeURIComponent(id));
  await linked.waitForSelector('#detail:not([hidden])', { timeout: 5000 });
  assert.match(await linked.textContent('#detail-title'), /^straggler_task: /);
  await linked.close();
});

test('a rule with a mistake shows the diagnostic at its line, and the fixed rule saves', async () => {
  await page.click('nav button[data-view="rules"]');
  await page.click('#rules tbody tr[data-rule="job_failure_burst"]');
  await page.waitForSelector('#diagnostics li.ok');
  const source = await page.inputValue('#source');
  const lines = source.split('\n');
  const at = lines.findIndex((l) => l.includes('task t fail as e'));
  assert.ok(at >= 0, source);
  const wrong = lines.map((l, i) => (i === at ? l.replace('fail', 'fial') : l)).join('\n');
  await page.fill('#source', wrong);
  const line = String(at + 1);
  await page.waitForSelector(`#diagnostics li[data-line="${line}"]`, { timeout: 5000 });
  assert.match(await page.textContent(`#diagnostics li[data-line="${line}"]`), new RegExp(`^${line}:\\d+ E0102 `));
  assert.equal(await page.getAttribute(`#gutter span[data-line="${line}"]`, 'class'), 'bad');
  assert.equal(await page.isDisabled('#save'), true);
  await shot('rule-mistake');
  const fixed = source.replace('within 15 minutes"', 'within 15 minutes (edited in the console)"');
  await page.fill('#source', fixed);
  await page.waitForSelector('#diagnostics li.ok', { timeout: 5000 });
  await page.click('#save');
  await until('the save result', async () => (await page.textContent('#save-result')).startsWith('saved'), 10000);
  assert.match(await page.textContent('#save-result'), /kept their state: .*job_failure_burst/);
  const stored = await (await fetch(service.url + '/api/v1/rules/job_failure_burst')).json();
  assert.match(stored.source, /edited in the console/);
  await shot('rule-saved');
});

test('the engine page shows watermark, live keys and the store', async () => {
  await page.click('nav button[data-view="engine"]');
  await until('the engine cards', async () => (await page.locator('#engine .card').count()) >= 8, 5000);
  const text = await page.textContent('#engine');
  assert.match(text, /watermark lag/);
  assert.match(text, /evicted_then_failed/);
  assert.match(text, /Dead letters/);
  await shot('engine');
  await page.click('nav button[data-view="alerts"]');
});

test('at phone width the page fits the screen', async () => {
  const phone = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await phone.goto(service.url + '/');
  await untilRows(phone, SAMPLE_ALERTS);
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than the screen`);
  await shot('phone', phone);
  await phone.close();
});

test('with a token set, the page asks for it and sends it only as a header', async () => {
  const guarded = await serve(['--api-token', 'console-secret-token', '--api-read-token', 'console-read-token']);
  const p = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const urls = [];
  p.on('request', (r) => urls.push(r.url()));
  try {
    await p.goto(guarded.url + '/');
    await p.waitForSelector('#token-dialog[open]', { timeout: 5000 });
    await shot('token-prompt', p);
    await p.fill('#token-input', 'wrong');
    await p.click('#token-save');
    await p.waitForSelector('#token-dialog[open]', { timeout: 5000 });
    assert.equal(await rows(p).count(), 0);
    await p.fill('#token-input', 'console-secret-token');
    await p.click('#token-save');
    await untilRows(p, SAMPLE_ALERTS);
    assert.equal(await p.isVisible('#token-dialog'), false);
    assert.ok(urls.every((u) => !u.includes('console-secret-token')), 'the token went into a URL');
  } finally {
    await p.close();
    guarded.stop();
  }
});

test('10,000 alerts are paged, filtered and opened without the page falling behind', async () => {
  const rule = 'rule tick {\n  metric s sample as e where e.name == "tick"\n  alert severity info\n  return s.host\n}\n';
  let response = await fetch(service.url + '/api/v1/rules/tick', { method: 'PUT', body: rule });
  assert.equal(response.status, 200, await response.text());
  // One alert per host: 10,000 hosts, then a later sample that releases them past the lateness.
  const now = Date.now();
  const lines = Array.from({ length: 10000 }, (_, i) => JSON.stringify({ stream: 'metric', ts: now - 3000, host: `t${i}`, name: 'tick', value: 1 }));
  lines.push(JSON.stringify({ stream: 'metric', ts: now + 3000, host: 'console', name: 'cpu', value: 1 }));
  const started = Date.now();
  response = await fetch(service.url + '/api/v1/events', { method: 'POST', body: lines.join('\n') });
  assert.equal(response.status, 200, await response.text());
  await page.selectOption('#f-rule', 'tick').catch(() => {});
  await until('10,000 tick alerts', async () => {
    await page.selectOption('#f-rule', 'tick').catch(() => {});
    return /\(10000 alerts\)/.test(await page.textContent('#page'));
  }, 60000);
  console.log(`# 10,000 alerts on the page ${Date.now() - started} ms after the POST`);
  assert.equal(await rows().count(), 100, 'a page holds 100 rows');
  assert.match(await page.textContent('#page'), /page 1 of 100/);
  const t = Date.now();
  await page.click('#next');
  await until('page 2', async () => /page 2 of 100/.test(await page.textContent('#page')), 5000);
  console.log(`# the next page of 10,000 alerts in ${Date.now() - t} ms`);
  await rows().first().click();
  await page.waitForSelector('#detail:not([hidden])', { timeout: 5000 });
  assert.match(await page.textContent('#detail-title'), /^tick: s\.host=t\d+/);
  await page.keyboard.press('Escape');
  await shot('ten-thousand');
  await page.selectOption('#f-rule', '');
});

/// A free port on 127.0.0.1.
async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

/// Debian's Prometheus, its TSDB filled by promtool with the backtest's history (three of NAB's
/// AWS series, two weeks in 2014); resolves with its URL once ready.
async function prometheus() {
  const dir = mkdtempSync(path.join(tmpdir(), 'vigil-prometheus-'));
  const history = gunzipSync(readFileSync(path.join(ROOT, 'tests/data/prometheus/nab.om.gz')));
  writeFileSync(path.join(dir, 'history.om'), history);
  const made = spawnSync(process.env.VIGIL_TEST_PROMTOOL || 'promtool',
    ['tsdb', 'create-blocks-from', 'openmetrics', path.join(dir, 'history.om'), path.join(dir, 'tsdb')]);
  assert.equal(made.status, 0, String(made.stderr));
  writeFileSync(path.join(dir, 'prometheus.yml'), 'global:\n  scrape_interval: 1h\n');
  const port = await freePort();
  const child = spawn(process.env.VIGIL_TEST_PROMETHEUS || 'prometheus', [`--config.file=${dir}/prometheus.yml`,
    `--storage.tsdb.path=${dir}/tsdb`, '--storage.tsdb.retention.time=100y', `--web.listen-address=127.0.0.1:${port}`],
  { stdio: 'ignore' });
  const url = `http://127.0.0.1:${port}`;
  await until('Prometheus ready', async () => (await fetch(url + '/-/ready').catch(() => null))?.status === 200, 60000);
  return { url, stop() { child.kill('SIGTERM'); rmSync(dir, { recursive: true, force: true }); } };
}

test("a rule's page answers why it did not page, with a plot per threshold", async () => {
  const prom = await prometheus();
  const asking = await serve(['--warm-from-prometheus', prom.url, '--warm-lookback', '1h']);
  // Dates typed into the form are read in the browser's time zone: UTC here.
  const p = await browser.newPage({ viewport: { width: 1280, height: 1000 }, timezoneId: 'UTC' });
  p.on('pageerror', (e) => errors.push(String(e)));
  try {
    await p.goto(asking.url + '/');
    await p.click('nav button[data-view="rules"]');
    await p.click('#rules tbody tr[data-rule="metric_deviation"]');
    await p.waitForSelector('#rule-detail:not([hidden])');
    await p.fill('#why-host', 'ec2-1ef3de');
    await p.fill('#why-from', '2014-03-08T00:00');
    await p.fill('#why-to', '2014-03-08T12:00');
    await p.fill('#why-lookback', '30d');
    await p.click('#why-ask');
    await until('the answer', async () => (await p.locator('#why-result .verdict').count()) > 0, 120000);
    const verdict = await p.textContent('#why-result .verdict');
    assert.match(verdict, /never held in \d+ judged window/);
    // One plot per test that compares a number with a literal: p, rare, nv, d and p again.
    assert.equal(await p.locator('#why-result .plot').count(), 5);
    const changes = await p.textContent('#why-result .changes');
    assert.match(changes, /d > 0\.9999 → 0\.7846: caught at 2014-03-08T00:00:00\.000Z/);
    await p.locator('#why-result').screenshot({ path: path.join(ARTIFACTS, 'why.png') });
    // Without a Prometheus, the page says what to set.
    const answer = await fetch(service.url + '/api/v1/rules/metric_deviation/why?from=now-1h&to=now');
    assert.equal(answer.status, 409);
    assert.match((await answer.json()).error, /--warm-from-prometheus/);
  } finally {
    await p.close();
    asking.stop();
    prom.stop();
  }
});

test('the page raised no script errors', () => {
  assert.deepEqual(errors, []);
});
