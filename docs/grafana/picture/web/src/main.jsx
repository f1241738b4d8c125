// The kat-scheduler Grafana dashboard (docs/grafana/kat-scheduler.json) drawn with Grafana's own
// front-end packages (@grafana/ui's PanelChrome and TimeSeries, @grafana/data's dark theme and
// field processing), from the Prometheus answers fetch_data.py saved in window.DASH_DATA.
import React from 'react';
import { createRoot } from 'react-dom/client';
import {
  FieldType,
  ThemeContext,
  applyFieldOverrides,
  createTheme,
  dateTime,
  dateTimeFormat,
} from '@grafana/data';
import { GlobalStyles, Icon, InlineLabel, PanelChrome, TimeSeries, ToolbarButton, ButtonGroup } from '@grafana/ui';

const D = window.DASH_DATA;
const dash = D.dashboard;
const theme = createTheme({ colors: { mode: 'dark' } });
const TZ = 'utc';
const PAGE_WIDTH = Number(new URLSearchParams(location.search).get('width') || 1600);
const PAD = 16; // the dashboard page's side padding
const COLS = 24, ROW_H = 30, MARGIN = 8; // Grafana's grid: 24 columns, 30 px rows, 8 px gaps
const gridWidth = PAGE_WIDTH - 2 * PAD;
const colWidth = (gridWidth - MARGIN * (COLS - 1)) / COLS;
const px = (g) => ({
  left: Math.round(g.x * (colWidth + MARGIN)),
  top: g.y * (ROW_H + MARGIN),
  width: Math.round(g.w * colWidth + (g.w - 1) * MARGIN),
  height: g.h * ROW_H + (g.h - 1) * MARGIN,
});

const timeRange = {
  from: dateTime(D.from),
  to: dateTime(D.to),
  raw: { from: dateTime(D.from), to: dateTime(D.to) },
};

// The time series panel's field defaults (what Grafana fills in for a panel whose JSON sets only
// the unit): classic palette, 1 px lines, no fill, points when sparse, nulls not connected.
const fieldDefaults = (unit) => ({
  unit,
  color: { mode: 'palette-classic' },
  thresholds: { mode: 'absolute', steps: [{ color: 'green', value: -Infinity }, { color: 'red', value: 80 }] },
  mappings: [],
  custom: {
    drawStyle: 'line',
    lineInterpolation: 'linear',
    barAlignment: 0,
    barWidthFactor: 0.6,
    lineWidth: 1,
    fillOpacity: 0,
    gradientMode: 'none',
    spanNulls: false,
    insertNulls: false,
    showPoints: 'auto',
    pointSize: 5,
    stacking: { mode: 'none', group: 'A' },
    axisPlacement: 'auto',
    axisLabel: '',
    axisColorMode: 'text',
    axisBorderShow: false,
    axisCenteredZero: false,
    scaleDistribution: { type: 'linear' },
    hideFrom: { legend: false, tooltip: false, viz: false },
    thresholdsStyle: { mode: 'off' },
  },
});

// Grafana's Prometheus legend: {{label}} replaced by the label's value, '' when missing.
const renderLegend = (fmt, labels) =>
  fmt ? fmt.replace(/\{\{\s*(.+?)\s*\}\}/g, (_, g) => (labels[g] ? labels[g] : '')) : undefined;
const selector = (m) => {
  const { __name__, ...rest } = m;
  const l = Object.entries(rest).map(([k, v]) => `${k}="${v}"`).join(', ');
  return `${__name__ ?? ''}{${l}}`;
};

function framesOf(panel) {
  const unit = panel.fieldConfig?.defaults?.unit ?? 'short';
  const answers = D.results[String(panel.id)] || [];
  const frames = [];
  panel.targets.forEach((t, ti) => {
    for (const s of answers[ti]?.series ?? []) {
      const { __name__, ...labels } = s.metric;
      const name = renderLegend(t.legendFormat, s.metric) ?? selector(s.metric);
      // Only the points Prometheus returned; the step as the time field's interval, so the
      // panel breaks the line where a series is absent, as in Grafana.
      const pts = s.values.filter(([, v]) => v !== null);
      frames.push({
        refId: t.refId,
        length: pts.length,
        fields: [
          { name: 'Time', type: FieldType.time, values: pts.map(([ts]) => ts), config: { interval: D.step * 1000 } },
          {
            name: 'Value',
            type: FieldType.number,
            labels,
            values: pts.map(([, v]) => v),
            config: { ...fieldDefaults(unit), displayNameFromDS: name },
          },
        ],
      });
    }
  });
  return applyFieldOverrides({
    data: frames,
    fieldConfig: { defaults: {}, overrides: [] },
    replaceVariables: (s) => s,
    theme,
    timeZone: TZ,
  });
}

function Panel({ panel }) {
  const g = px(panel.gridPos);
  const frames = framesOf(panel);
  const legend = { calcs: [], ...panel.options.legend };
  return (
    <div style={{ position: 'absolute', ...g }} data-panel={panel.title}>
      <PanelChrome width={g.width} height={g.height} title={panel.title} description={panel.description}>
        {(w, h) =>
          frames.length ? (
            <TimeSeries
              frames={frames}
              width={w}
              height={h}
              timeRange={timeRange}
              timeZone={TZ}
              legend={legend}
              options={panel.options}
            />
          ) : (
            <div
              style={{
                width: w, height: h, display: 'flex', alignItems: 'center', justifyContent: 'center',
                color: theme.colors.text.secondary, fontSize: theme.typography.body.fontSize,
              }}
            >
              No data
            </div>
          )
        }
      </PanelChrome>
    </div>
  );
}

function Row({ panel }) {
  const g = px(panel.gridPos);
  return (
    <div
      style={{ position: 'absolute', ...g, display: 'flex', alignItems: 'center', gap: 8 }}
      data-row={panel.title}
    >
      <Icon name={panel.collapsed ? 'angle-right' : 'angle-down'} size="lg" />
      <span style={{ fontSize: theme.typography.h5.fontSize, fontWeight: theme.typography.fontWeightMedium, color: theme.colors.text.primary }}>
        {panel.title}
      </span>
    </div>
  );
}

function Header() {
  const f = (ms) => dateTimeFormat(ms, { timeZone: TZ, format: 'YYYY-MM-DD HH:mm:ss' });
  const bar = {
    height: 40, display: 'flex', alignItems: 'center', gap: 8, padding: `0 ${PAD}px`,
    background: theme.colors.background.primary, borderBottom: `1px solid ${theme.colors.border.weak}`,
    color: theme.colors.text.secondary, fontSize: theme.typography.body.fontSize,
  };
  return (
    <div data-header>
      <div style={bar}>
        <Icon name="apps" />
        <span>Home</span><Icon name="angle-right" size="sm" />
        <span>Dashboards</span><Icon name="angle-right" size="sm" />
        <span style={{ color: theme.colors.text.primary }}>{dash.title}</span>
      </div>
      <div style={{ display: 'flex', alignItems: 'center', justifyContent: 'space-between', padding: `${PAD}px ${PAD}px ${PAD / 2}px` }}>
        <div style={{ display: 'flex', alignItems: 'center' }}>
          <InlineLabel width="auto">{dash.templating.list[0].label}</InlineLabel>
          <div style={{
            height: 32, display: 'flex', alignItems: 'center', gap: 8, padding: '0 8px',
            border: `1px solid ${theme.components.input.borderColor}`, background: theme.components.input.background,
            borderRadius: theme.shape.radius.default, color: theme.colors.text.primary, fontSize: theme.typography.body.fontSize,
          }}>
            Prometheus <Icon name="angle-down" />
          </div>
        </div>
        <ButtonGroup>
          <ToolbarButton icon="clock-nine" variant="default" tooltip="">
            {f(D.from)} to {f(D.to)} UTC
          </ToolbarButton>
          <ToolbarButton icon="sync" variant="default">{dash.refresh}</ToolbarButton>
        </ButtonGroup>
      </div>
    </div>
  );
}

function Dashboard() {
  const bottom = Math.max(...dash.panels.map((p) => p.gridPos.y + p.gridPos.h));
  return (
    <ThemeContext.Provider value={theme}>
      <GlobalStyles />
      <div style={{ width: PAGE_WIDTH, background: theme.colors.background.canvas }}>
        <Header />
        <div style={{ position: 'relative', margin: `0 ${PAD}px`, height: bottom * (ROW_H + MARGIN) + PAD }} data-grid>
          {dash.panels.map((p) => (p.type === 'row' ? <Row key={p.id} panel={p} /> : <Panel key={p.id} panel={p} />))}
        </div>
      </div>
    </ThemeContext.Provider>
  );
}

// The fonts first, so uPlot measures its axis labels in Inter, as in Grafana.
Promise.all(['400 12px Inter', '500 12px Inter'].map((f) => document.fonts.load(f))).then(() => {
  createRoot(document.getElementById('root')).render(<Dashboard />);
  // Signals the screenshot script once React has committed and uPlot has drawn.
  requestAnimationFrame(() => setTimeout(() => (window.__RENDERED = true), 1500));
});
