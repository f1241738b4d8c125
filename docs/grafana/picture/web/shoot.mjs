// Opens the page in the system's Chromium (playwright-core, no browser download), waits until
// React and uPlot are done and the icons/fonts loaded, and saves the whole page plus one crop
// per dashboard row.   node shoot.mjs URL OUTDIR [WIDTH]
import { chromium } from 'playwright-core';
const [url, outDir, width = '1600'] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync'],
});
const page = await browser.newPage({ viewport: { width: Number(width), height: 1000 }, deviceScaleFactor: 1 });
const errors = [];
page.on('pageerror', (e) => errors.push(String(e)));
page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
await page.goto(`${url}?width=${width}`, { waitUntil: 'networkidle' });
await page.waitForFunction(() => window.__RENDERED === true, null, { timeout: 60000 });
await page.evaluate(() => document.fonts.ready);
await page.waitForLoadState('networkidle');
await page.waitForTimeout(500);
await page.screenshot({ path: `${outDir}/dashboard.png`, fullPage: true });
// Per-row crops: from a row's header to the next row's header (or the end of the grid).
const rows = await page.evaluate(() => {
  const grid = document.querySelector('[data-grid]').getBoundingClientRect();
  const rs = [...document.querySelectorAll('[data-row]')].map((e) => ({ title: e.dataset.row, top: e.getBoundingClientRect().top + window.scrollY }));
  const end = grid.bottom + window.scrollY;
  return rs.map((r, i) => ({ ...r, bottom: i + 1 < rs.length ? rs[i + 1].top : end }));
});
const full = await page.evaluate(() => document.documentElement.scrollWidth);
let i = 1;
for (const r of rows) {
  const slug = r.title.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '');
  await page.screenshot({ path: `${outDir}/dashboard-row${i++}-${slug}.png`, fullPage: true,
    clip: { x: 0, y: Math.max(0, r.top - 8), width: full, height: r.bottom - r.top + 8 } });
}
console.log('rows:', rows.map((r) => r.title).join(' | '));
if (errors.length) console.log('page errors:\n' + errors.join('\n'));
await browser.close();
