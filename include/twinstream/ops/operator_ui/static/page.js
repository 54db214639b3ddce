// The operator's page: draws /api/overview every REFRESH_MS, and each pipeline's last 15
// minutes (/api/timeline/<pipeline>: its engines' timelines merged by the plugin) as uPlot
// charts every TIMELINE_MS; its buttons trigger DAG runs through Airflow's REST API with
// the session's own cookie, so Airflow authorises and logs each one as a trigger by this user.
"use strict";

const PREFIX = document.body.dataset.prefix;
// Often enough that a takeover shows within a couple of seconds; each refresh is two small
// requests per engine (snapshots and audit are re-read at most every 30 s).
const REFRESH_MS = 1000;
// The timeline's buckets are 5 s long; every 2 s the newest one's figures show as they grow.
const TIMELINE_MS = 2000;
const CHART = { width: 440, height: 160 };
let pending = null; // the action waiting for its confirmation: {dag, conf, label}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key === "onclick") node.addEventListener("click", value);
    else node[key] = value;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function num(value) {
  return value === null || value === undefined ? "-" : value.toLocaleString("en");
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "?";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

// Each partition's buffered rows against the per-partition bound (num_buffered_msgs), as
// twinstream.engine.api.buffer_text writes them: a sum against one partition's bound would
// read as an overflow.
function bufferText(e) {
  if (e.buffer_fill === null || e.buffer_size === null) return "-";
  const parts = Object.entries(e.buffer_fills || {}).sort((a, b) => Number(a[0]) - Number(b[0]));
  if (parts.length) return parts.map(([p, n]) => `p${p} ${num(n)}/${num(e.buffer_size)}`).join(" · ");
  if (e.buffer_fill === 0) return `0/${num(e.buffer_size)}`;
  return `${num(e.buffer_fill)} total`;
}

function say(text, kind = "info") {
  const box = document.getElementById("message");
  box.textContent = text;
  box.className = kind;
}

async function trigger(dag, conf, label) {
  say(`${label}: triggering ${dag}…`);
  const response = await fetch(`/api/v2/dags/${dag}/dagRuns`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ logical_date: null, conf, note: `from the Twinstream page: ${label}` }),
  });
  const body = await response.json().catch(() => ({}));
  if (response.ok) {
    const paused = await isPaused(dag);
    if (paused) {
      // A paused DAG's run waits in "queued" with nothing in Airflow saying why.
      say(
        `${label}: DAG run ${body.dag_run_id} of ${dag} is queued, but ${dag} is paused: the run waits until ` +
          `the DAG is unpaused. Unpause it with its toggle in Airflow's Dags list, or \`airflow dags unpause ${dag}\`.`,
        "warn",
      );
    } else {
      say(`${label}: DAG run ${body.dag_run_id} of ${dag} started (Airflow: Dags › ${dag} › Runs)`, "ok");
    }
  } else {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body);
    say(`${label}: Airflow refused the trigger of ${dag} (HTTP ${response.status}): ${detail}`, "fail");
  }
}

// Whether Airflow holds the DAG paused; null when it does not say (the run's message then
// stays the plain one rather than guess).
async function isPaused(dag) {
  try {
    const response = await fetch(`/api/v2/dags/${dag}`, { credentials: "same-origin" });
    if (!response.ok) return null;
    const body = await response.json();
    return typeof body.is_paused === "boolean" ? body.is_paused : null;
  } catch (error) {
    return null;
  }
}

// The iframe Airflow shows plugins in allows no dialogs: a second click confirms instead.
function action(label, dag, conf, id) {
  const waiting = pending && pending.id === id;
  const button = el(
    "button",
    { class: waiting ? "confirm" : "", "data-action": id, type: "button" },
    waiting ? `Confirm: ${label}` : label,
  );
  button.addEventListener("click", () => {
    if (pending && pending.id === id) {
      pending = null;
      trigger(dag, conf, label);
    } else {
      pending = { id };
      say(`${label}: click "Confirm" to trigger ${dag}`, "info");
    }
    draw(lastSeen);
  });
  return button;
}

// A msg_id as logs write it (twinstream.core.rows.record_text): `1234` on partition 0,
// `2:1234` on another.
function msgId(partition, offset) {
  return partition ? `${partition}:${offset}` : String(offset);
}

// Whether the engine's rows differ from the published ones and no operator overrode that
// (twinstream.ops.overview.EngineView.disagrees): it takes no part in the election.
function disagrees(e) {
  return !e.problem && e.agreement.state === "disagrees" && !e.agreement.overridden;
}

// The agreement column, as `twinstream status` writes it (EngineView.agreement_text).
function agreementCell(e) {
  if (e.problem) return "-";
  const a = e.agreement;
  // A standby on other code than the active: what differs, reported, never barring it.
  if (a.state === "shadow" && a.shadow) {
    const s = a.shadow;
    return el(
      "span",
      { class: "warn", "data-shadow": s.active_version },
      `shadow of ${s.active_version}: ${num(s.ranges_differing)} of ${num(s.ranges_compared)} ranges differ (${num(s.msg_ids_differing)} msg_ids in ${num(s.ranges_read_back)} read back; ${num(s.rows_compared)} rows compared)`,
    );
  }
  if (a.state !== "disagrees") return el("span", { class: a.state === "agrees" ? "ok" : "muted" }, a.state);
  const d = a.difference;
  const where = d ? ` at msg_id ${msgId(d.partition, d.msg_id)}` : "";
  if (a.overridden) return el("span", { class: "warn" }, `disagrees${where} (overridden)`);
  return el("span", { class: "fail" }, `DISAGREES${where}`);
}

function rowsTable(title, rows) {
  const shown = rows.filter((r) => r.kind !== "none");
  return el(
    "div",
    {},
    el("h4", {}, title),
    shown.length
      ? el(
          "table",
          { class: "small rows" },
          el("thead", {}, el("tr", {}, ...["kind", "key", "value"].map((h) => el("th", {}, h)))),
          el("tbody", {}, shown.map((r) => el("tr", {}, el("td", {}, r.kind), el("td", {}, r.key ?? "-"), el("td", { class: "value" }, r.value)))),
        )
      : el("p", { class: "muted" }, "no output (the record had none)"),
  );
}

// A disagreement in full, under the engine's row: the first differing msg_id, the active's
// transaction it lies in, and both sides' rows, so that the page (and a screenshot of it)
// says what differs without a log.
function disagreementRow(e, columns) {
  const a = e.agreement;
  if (e.problem || a.state !== "disagrees") return null;
  const d = a.difference;
  const fix = a.overridden
    ? "Overridden by an operator: it may lead. Restore it (restore_and_resync, snapshot proven) once it need not."
    : "It does not heal by itself and takes no part in the election: restore it (restore_and_resync, snapshot proven) or override (POST /pipeline/override).";
  const body = d
    ? [
        el(
          "p",
          {},
          el("b", {}, `Engine ${e.engine_id} disagrees with the published output at msg_id ${msgId(d.partition, d.msg_id)}`),
          ` (the active's transaction of msg_id ${msgId(d.partition, d.first)}..${d.last}, epoch ${d.epoch ?? "?"}`,
          d.found_at ? `; found at ${d.found_at.replace("T", " ")})` : ")",
        ),
        el("div", { class: "columns" }, rowsTable("The active's rows (published)", d.active_rows), rowsTable(`Engine ${e.engine_id}'s rows`, d.engine_rows)),
      ]
    : [el("p", {}, el("b", {}, `Engine ${e.engine_id} disagrees with the published output`), " (it did not say where)")];
  return el(
    "tr",
    { class: a.overridden ? "disagreement overridden" : "disagreement", "data-disagreement": e.engine_id },
    el("td", { colSpan: columns }, ...body, el("p", { class: a.overridden ? "warn" : "fail" }, fix)),
  );
}

function engineRow(pipeline, e) {
  const role = e.role || "unreachable";
  const notes = [];
  if (e.problem) notes.push(el("span", { class: "fail" }, e.problem));
  if (e.uncovered.length) notes.push(el("span", { class: "fail" }, `UNCOVERED ${e.uncovered.join(", ")} `));
  if (e.quarantined) notes.push(el("span", { class: "warn" }, `quarantined ${e.quarantined} `));
  if (e.paused) notes.push(el("span", { class: "warn" }, "paused "));
  // It runs the code it started with; its pipeline's files now hold other code.
  if (e.stale) notes.push(el("span", { class: "warn" }, `code changed on disk (now ${e.code_on_disk}) `));
  if (e.lag_trend && e.lag_trend.growing) {
    const t = e.lag_trend;
    notes.push(el("span", { class: "warn" }, `lag growing ${num(t.first)} → ${num(t.last)} in ${Math.round(t.window_s)} s `));
  }
  for (const r of e.repairs) notes.push(el("span", { class: "warn" }, `repaired ${r} `));
  let covers = "-";
  if (disagrees(e)) {
    // Its buffer may hold every row a takeover needs: it still may not lead.
    covers = el("span", { class: "fail" }, "may not lead");
  } else if (e.takeover_needs !== null) {
    covers = el(
      "span",
      { class: e.covers_takeover ? "ok" : "fail" },
      `${num(e.buffer_fill)} / needs ${num(e.takeover_needs)}`,
    );
  }
  // A disagreeing engine is restored from a snapshot an agreeing engine took.
  const restore = disagrees(e)
    ? action(`Restore ${e.engine_id} (proven)`, "restore_and_resync", { engine: e.engine_id, snapshot: "proven" }, `restore-${e.engine_id}`)
    : action(`Restore ${e.engine_id}`, "restore_and_resync", { engine: e.engine_id }, `restore-${e.engine_id}`);
  return el(
    "tr",
    { "data-engine": e.engine_id, "data-role": role, "data-agreement": e.problem ? "" : e.agreement.state, class: `health-${e.health}` },
    // The engine, and the version of the pipeline's code it runs (declared+digest).
    el("td", {}, el("b", {}, e.engine_id), e.pipeline_version ? el("div", { class: "version", "data-version": e.pipeline_version }, e.pipeline_version) : ""),
    el("td", {}, el("span", { class: `role role-${role}` }, role)),
    el("td", {}, e.epoch ?? "-"),
    el("td", {}, e.state ?? "-"),
    el("td", { class: "n" }, e.lag_s == null ? num(e.lag) : `${num(e.lag)} (${e.lag_s.toFixed(1)} s)`),
    el("td", {}, e.in_sync === null ? "-" : e.in_sync ? "yes" : el("span", { class: "warn" }, "no")),
    el("td", {}, agreementCell(e)),
    el("td", { class: "n" }, bufferText(e)),
    el("td", {}, covers),
    el("td", {}, e.zk_state ?? "-"),
    el("td", {}, notes),
    el(
      "td",
      {},
      role === "active" ? "" : restore,
    ),
  );
}

function bytes(value) {
  return value === null || value === undefined ? "-" : `${num(value)} B`;
}

// One publisher adapter as its status node says (twinstream.ops.overview.AdapterView), in
// the columns `twinstream status` prints.
function adapterRow(a) {
  const unreadable = [];
  if (a.too_long) unreadable.push(`${num(a.too_long)} too long`);
  if (a.not_utf8) unreadable.push(`${num(a.not_utf8)} not UTF-8`);
  return el(
    "tr",
    { "data-adapter": a.adapter_id, "data-role": a.role },
    el("td", {}, el("b", {}, a.adapter_id)),
    el("td", {}, el("span", { class: `role role-${a.role}` }, a.role)),
    el("td", {}, a.epoch ?? "-"),
    el("td", {}, a.position ?? "-"),
    el("td", { class: "n", "data-lag": a.source_lag ?? "" }, bytes(a.source_lag)),
    el("td", { class: "n" }, num(a.published)),
    el("td", {}, unreadable.length ? el("span", { class: "warn" }, unreadable.join(", ")) : "-"),
    el("td", {}, a.last_error ? el("span", { class: "warn" }, a.last_error) : "-"),
  );
}

function adaptersTable(p) {
  if (!p.adapters || !p.adapters.length) return null;
  return el(
    "div",
    { class: "adapters" },
    el("h3", {}, "Publisher adapters"),
    el(
      "table",
      { class: "small" },
      el("thead", {}, el("tr", {}, ...["adapter", "role", "epoch", "source position", "lag to source end", "published", "unreadable lines", "last error"].map((h) => el("th", {}, h)))),
      el("tbody", {}, p.adapters.map(adapterRow)),
    ),
  );
}

const ENGINE_COLUMNS = ["engine", "role", "epoch", "state", "lag", "in sync", "agreement", "buffer", "takeover cover", "ZooKeeper", "notes", ""];

function pipelineSection(p) {
  const engines = el(
    "table",
    { class: "engines" },
    el("thead", {}, el("tr", {}, ...ENGINE_COLUMNS.map((h) => el("th", {}, h)))),
    el("tbody", {}, p.engines.flatMap((e) => [engineRow(p, e), disagreementRow(e, ENGINE_COLUMNS.length)])),
  );
  const takeovers = p.takeovers.length
    ? el(
        "table",
        { class: "small" },
        el("thead", {}, el("tr", {}, ...["epoch", "engine", "won at (UTC)", "fence + read", "first commit after", "engine process"].map((h) => el("th", {}, h)))),
        el(
          "tbody",
          {},
          p.takeovers.map((t) =>
            el("tr", { "data-takeover": t.epoch, "data-from-spare": t.from_spare ? "yes" : "no" }, el("td", {}, t.epoch), el("td", {}, t.engine_id), el("td", {}, t.at.replace("T", " ").replace("+00:00", "")),
              el("td", { class: "n" }, `${t.fence_and_read_s.toFixed(2)} s`),
              el("td", { class: "n" }, t.first_commit_s === null ? "not yet" : `${t.first_commit_s.toFixed(2)} s`),
              // Whether the engine that took over had been started from a warm spare.
              el("td", {}, t.from_spare ? "a warm spare" : "started cold")),
          ),
        ),
      )
    : el("p", { class: "muted" }, "No takeover that a running engine remembers.");
  const snapshots = p.snapshots.length
    ? el(
        "table",
        { class: "small" },
        el("thead", {}, el("tr", {}, ...["snapshot", "engine", "age", "size", "restorable"].map((h) => el("th", {}, h)))),
        el(
          "tbody",
          {},
          p.snapshots.map((s) =>
            el("tr", {}, el("td", {}, s.snapshot_id), el("td", {}, s.engine_id ?? "-"), el("td", {}, age(s.age_s)),
              el("td", { class: "n" }, s.size_bytes === null ? "-" : `${(s.size_bytes / 1e6).toFixed(1)} MB`),
              el("td", {}, s.problem ? el("span", { class: "fail" }, s.problem)
                : s.restorable === null ? "unknown" : s.restorable ? el("span", { class: "ok" }, "yes")
                : el("span", { class: "fail" }, "no: Kafka deleted what it replays"))),
          ),
        ),
      )
    : el("p", { class: "warn" }, "No snapshot yet: Persist now makes one.");
  const audit = p.audit
    ? el(
        "p",
        {},
        el("span", { class: p.audit.ok ? "ok" : "fail" }, p.audit.ok ? "passed" : "FAILED"),
        ` ${p.audit.run} at ${p.audit.at.replace("T", " ")}: ${p.audit.summary} `,
        p.audit.data_docs
          ? el("a", { href: `${PREFIX}/datadocs/${p.name}/${p.audit.data_docs}`, target: "_self" }, "Data Docs")
          : el("a", { href: `${PREFIX}/datadocs/${p.name}/index.html`, target: "_self" }, "Data Docs"),
        // Each task of the run as it ended: a passing report cannot hide a failed agreement task.
        (p.audit.tasks || []).length
          ? el("ul", { class: "audit-tasks" }, p.audit.tasks.map((t) =>
              el("li", { "data-task": t.task }, el("span", { class: t.ok ? "ok" : "fail" }, `${t.task} ${t.ok ? "passed" : "FAILED"}`), `: ${t.summary}`)))
          : null,
      )
    : el("p", { class: "muted" }, "Not audited yet (audit_output_topic).");
  // The last deploy: versions, where the new logic began, the cutover msg_id per partition.
  const deploy = p.deploy
    ? el("p", { class: "deploy", id: `deploy-${p.name}` }, `Last deploy: ${p.deploy}`)
    : null;
  return el(
    "section",
    { "data-pipeline": p.name },
    el(
      "h2",
      {},
      `Pipeline ${p.name} `,
      el("span", { class: p.active ? "role role-active" : "role role-none", id: `active-${p.name}` }, p.active ? `active: ${p.active}` : "no single active"),
      " ",
      action(`Failover drill of ${p.name}`, "failover_drill", { pipeline: p.name }, `drill-${p.name}`),
      // An engine runs other code than its files: deploy_pipeline brings every engine to
      // it with no gap; its switch waits for an approval in Airflow's Required actions.
      p.engines.some((e) => e.stale)
        ? action(`Deploy the code on disk to ${p.name}`, "deploy_pipeline", { pipeline: p.name }, `deploy-now-${p.name}`)
        : null,
    ),
    p.problems.length ? el("ul", { class: "problems" }, p.problems.map((x) => el("li", { class: "fail" }, x))) : null,
    deploy,
    engines,
    adaptersTable(p),
    timelineBox(p.name),
    el("div", { class: "columns" },
      el("div", {}, el("h3", {}, "Last takeovers"), takeovers),
      el("div", {}, el("h3", {}, "Snapshots"), snapshots),
      el("div", {}, el("h3", {}, "Latest audit"), audit)),
  );
}

// -- the charts: one box per pipeline, kept across redraws --------------------------------
// draw() rebuilds every section each second; a pipeline's chart box (and its uPlot
// instances) is the same node each time, moved into the new section, so the charts are not
// rebuilt and keep their cursor. The box's data-* attributes say what the charts show (the
// browser test reads them rather than pixels).
const boxes = new Map(); // pipeline -> {node, plots: {latency, rate, lag}, lagKeys, tl}

function timelineBox(name) {
  let box = boxes.get(name);
  if (!box) {
    const node = el(
      "div",
      { class: "timeline", "data-timeline": name, "data-points": "0", "data-last-t": "", "data-takeovers": "0", "data-last-epoch": "", "data-published": "0" },
      el("h3", {}, "Last 15 minutes ", el("span", { class: "muted" }, "(takeovers: red rules)")),
      el("div", { class: "charts" }),
      el("p", { class: "muted note" }, "waiting for the engines' figures…"),
    );
    box = { node, plots: {}, lagKeys: "", tl: null };
    boxes.set(name, box);
  }
  return box.node;
}

// Takeovers as vertical rules across a chart, each labelled with its epoch and winner.
function takeoverMarks(box) {
  return {
    hooks: {
      draw: [
        (u) => {
          const tl = box.tl;
          if (!tl) return;
          const ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#c53030";
          ctx.fillStyle = "#c53030";
          ctx.lineWidth = 2 * devicePixelRatio;
          ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
          for (const mark of tl.takeovers) {
            const x = Math.round(u.valToPos(mark.t, "x", true));
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            ctx.fillText(`epoch ${mark.epoch}: ${mark.engine_id}`, x + 3 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
          }
          ctx.restore();
        },
      ],
    },
  };
}

function chartOptions(box, title, unit, series) {
  return {
    title,
    ...CHART,
    // The window ends at the plugin's clock, not at the newest point: an idle pipeline's
    // chart still moves, and a gap shows as a gap.
    scales: { x: { time: true, range: () => (box.tl ? [box.tl.now - box.tl.window_s, box.tl.now] : [0, 1]) }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    axes: [{}, { label: unit, size: 60 }],
    series: [{}, ...series],
    plugins: [takeoverMarks(box)],
    legend: { live: true },
  };
}

const COLOURS = ["#2b6cb0", "#d69e2e", "#38a169", "#805ad5", "#dd6b20", "#319795"];

function drawTimeline(name, tl, roles) {
  const box = boxes.get(name);
  if (!box || !box.node.isConnected) return;
  box.tl = tl;
  const charts = box.node.querySelector(".charts");
  const engines = Object.keys(tl.lag).sort();
  const lagKeys = engines.map((e) => `${e}:${roles[e] || "?"}`).join(",");
  if (!box.plots.latency) {
    box.plots.latency = new uPlot(
      chartOptions(box, "End-to-end latency (publishing engine)", "seconds", [
        // Points always drawn: a bucket between two without output is a point, not nothing.
        { label: "p50", stroke: "#2b6cb0", width: 1.5, points: { show: true, size: 4 }, value: (u, v) => (v === null ? "-" : `${v.toFixed(3)} s`) },
        { label: "p99", stroke: "#c05621", width: 1.5, points: { show: true, size: 4 }, value: (u, v) => (v === null ? "-" : `${v.toFixed(3)} s`) },
      ]),
      [[], [], []],
      charts,
    );
    box.plots.rate = new uPlot(
      chartOptions(box, "Input rate", "events/s", [{ label: "in", stroke: "#38a169", width: 1.5, fill: "rgba(56,161,105,.08)" }]),
      [[], []],
      charts,
    );
  }
  if (box.lagKeys !== lagKeys) {
    // Another engine (or a role changed): the lag chart's series are rebuilt, once.
    if (box.plots.lag) box.plots.lag.destroy();
    box.plots.lag = new uPlot(
      chartOptions(box, "Lag per engine", "records", engines.map((e, i) => ({ label: `${e} (${roles[e] || "?"})`, stroke: COLOURS[i % COLOURS.length], width: 1.5 }))),
      [[], ...engines.map(() => [])],
      charts,
    );
    box.lagKeys = lagKeys;
  }
  box.plots.latency.setData([tl.t, tl.p50_s, tl.p99_s]);
  box.plots.rate.setData([tl.t, tl.in_per_s]);
  box.plots.lag.setData([tl.t, ...engines.map((e) => tl.lag[e])]);
  const withLatency = tl.t.filter((t, i) => tl.p99_s[i] !== null);
  box.node.dataset.points = String(withLatency.length);
  box.node.dataset.lastT = withLatency.length ? String(withLatency[withLatency.length - 1]) : "";
  box.node.dataset.takeovers = String(tl.takeovers.length);
  // The newest mark's epoch: after a kill -9 the dead engine's marks go with it, so the
  // count alone may not grow when a new one appears.
  box.node.dataset.lastEpoch = tl.takeovers.length ? String(Math.max(...tl.takeovers.map((m) => m.epoch))) : "";
  box.node.dataset.published = String(tl.published.reduce((a, b) => a + b, 0));
  const unread = Object.entries(tl.unread).map(([e, why]) => `engine ${e}: no figures (${why})`);
  box.node.querySelector(".note").textContent = unread.length
    ? unread.join("; ")
    : tl.t.length ? "" : "no figures yet: the engines report once they run";
}

async function refreshTimelines() {
  try {
    for (const p of lastSeen ? lastSeen.overview.pipelines : []) {
      const response = await fetch(`${PREFIX}/api/timeline/${encodeURIComponent(p.name)}`, { credentials: "same-origin" });
      if (!response.ok) continue; // the overview's poll says what is wrong with the session
      const roles = Object.fromEntries(p.engines.map((e) => [e.engine_id, e.role || "unreachable"]));
      drawTimeline(p.name, await response.json(), roles);
    }
  } catch (error) {
    for (const box of boxes.values()) box.node.querySelector(".note").textContent = `cannot read the timeline (${error.message}); retrying`;
  } finally {
    setTimeout(refreshTimelines, TIMELINE_MS);
  }
}

let lastSeen = null;

function draw(seen) {
  if (!seen) return;
  const main = document.getElementById("pipelines");
  const toolbar = el("div", { class: "toolbar" }, action("Persist now (every pipeline)", "persist_standby_state", {}, "persist"));
  main.replaceChildren(toolbar, ...seen.overview.pipelines.map(pipelineSection), sparesLine(seen.overview.spares));
}

// This machine's warm spares (twinstream.engine.spare_keeper), as `twinstream status` says it.
function sparesLine(spares) {
  if (!spares) return el("p", { class: "muted spares" }, "no keeper of warm spares runs on this machine: a killed engine restarts cold");
  const waiting = spares.filter((s) => !s.engine_id);
  const warm = waiting.filter((s) => s.status === "warm").length;
  const adopted = spares.filter((s) => s.engine_id).map((s) => `engine ${s.engine_id} since ${s.adopted_at} (pid ${s.pid})`);
  const text = `warm spares: ${warm} warm, ${waiting.length - warm} warming` + (adopted.length ? `; adopted as ${adopted.join(", ")}` : "");
  return el("p", { class: warm ? "muted spares" : "spares warn" }, text);
}

async function refresh() {
  try {
    const response = await fetch(`${PREFIX}/api/overview`, { credentials: "same-origin" });
    if (response.status === 401 || response.status === 403) {
      document.getElementById("updated").textContent = "Your Airflow session has expired: reload the page to log in again.";
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    lastSeen = await response.json();
    draw(lastSeen);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("updated").textContent = `cannot read the overview (${error.message}); retrying`;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
refreshTimelines();
