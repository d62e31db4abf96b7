// Transactions page: live refresh and the commits/lag chart. Plain JS, no dependency.
//
// The server renders each page; this script asks the page's JSON endpoint (body[data-api]) every
// few seconds and re-renders the same markup from it. Text from the database only ever reaches
// the DOM as text nodes or attribute values (never innerHTML), so it cannot inject markup.
"use strict";
(() => {
  const body = document.body;
  const root = body.dataset.root || "";
  const airflowRoot = body.dataset.airflowRoot || "";
  const api = body.dataset.api;
  const pollMs = Number(body.dataset.pollMs) || 2500;
  const page = body.dataset.page;
  const SVG = "http://www.w3.org/2000/svg";

  // -- DOM helpers ------------------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  function s(tag, attrs) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return el;
  }

  const q = encodeURIComponent;

  // -- formatting (same rules as model.format_duration and model.clock) -------------------------

  function fmtDuration(sec) {
    if (sec === null || sec === undefined || !Number.isFinite(sec)) return "—";
    if (sec < 10) return `${sec.toFixed(2)} s`;
    if (sec < 60) return `${sec.toFixed(1)} s`;
    const w = Math.floor(sec);
    const pad = (n) => String(n).padStart(2, "0");
    if (w < 3600) return `${Math.floor(w / 60)}m ${pad(w % 60)}s`;
    return `${Math.floor(w / 3600)}h ${pad(Math.floor((w % 3600) / 60))}m`;
  }

  function fmtTime(iso, nowIso) {
    if (!iso) return "—";
    const t = new Date(iso).toISOString();
    const today = nowIso ? new Date(nowIso).toISOString().slice(0, 10) : "";
    return t.slice(0, 10) === today ? t.slice(11, 19) : `${t.slice(0, 10)} ${t.slice(11, 19)}`;
  }

  // -- cells (same markup as templates/macros.html) ---------------------------------------------

  const status = (v) => h("span", { class: `st st-${v}` }, v);
  const duration = (sec, running) =>
    running ? h("span", { class: "running" }, `${fmtDuration(sec)} …`) : fmtDuration(sec);
  function error(message, txid, failedBy) {
    const parts = [];
    // failedBy 0: a rewind failed it (its message says "rewound to txid N by …")
    if (failedBy && failedBy !== txid) {
      parts.push(h("span", { class: "cascade" }, `failed by txid ${failedBy}`), " ");
    }
    if (message) parts.push(h("span", { class: "err" }, message));
    return parts;
  }
  const airflowRun = (dagId, runId) =>
    h("a", { "data-airflow": true, target: "_top", href: `${airflowRoot}/dags/${q(dagId)}/runs/${q(runId)}` }, runId);
  const counts = (c) =>
    h("span", { class: "counts" },
      Object.entries(c).map(([k, n]) => h("span", { class: `st st-${k}`, title: k }, `${k} ${n}`)));
  // "Rewind to here" (same markup as the macro rewind): on the txids the server says a rewind can
  // go back to (t.rewind, planned by the coordinator's rule), disabled for a user who may not
  // edit every DAG of the pipeline (the table's data-rewind-*, rendered with the page).
  function rewindButton(r) {
    if (!r) return null;
    const table = document.getElementById("txid-table");
    const allowed = table && table.dataset.rewindAllowed === "true";
    return h("button", {
      type: "button", class: "rewind", "data-to": r.to_txid, "data-through": r.through,
      "data-span": r.span, "data-text": r.text, "data-states": r.states, disabled: !allowed,
      title: allowed ? `recompute ${r.span}` : table && table.dataset.rewindWhyNot,
    }, "Rewind to here");
  }
  // The audit before each commit (same markup as the macros audit, taken and sparkline).
  const audit = (a) => a && a.text
    ? h("span", { class: `audit audit-${a.level}`, title: a.title }, a.text) : null;
  const taken = (v) => h("span", { class: `st audit-${v}` }, String(v).replace(/_/g, " "));
  function sparkline(e) {
    if (!e.txids) return h("span", { class: "hint" }, "no committed txid");
    const svg = s("svg", { class: "spark", viewBox: "0 0 160 28", width: 160, height: 28, role: "img",
      "aria-label": `rows failed per committed txid, txids ${e.first_txid} to ${e.last_txid}, at most ${e.max_failed}` });
    const title = s("title");
    title.textContent = `txids ${e.first_txid} … ${e.last_txid}: at most ${e.max_failed} rows failed`;
    svg.append(title, s("polyline", { points: e.spark }));
    return svg;
  }
  const num = (v, cls) => h("td", { class: cls ? `num ${cls}` : "num" }, v);
  const empty = (cols, text) => h("tr", {}, h("td", { colspan: cols, class: "empty" }, text));

  // -- pages ------------------------------------------------------------------------------------

  function renderIndex(data) {
    const rows = data.pipelines.map((p) => {
      const stalled = p.health && p.health.status === "stalled"
        ? [" ", h("span", { class: "err", title: p.health.reason || "" }, "stalled")] : [];
      const link = h("td", {}, h("a", { href: `${root}/pipelines/${q(p.name)}` }, p.name), ...stalled);
      if (p.error !== undefined) return h("tr", {}, link, h("td", { colspan: 7, class: "err" }, p.error));
      return h("tr", {}, link, h("td", {}, p.source_kind), num(p.max_pending), num(p.last_committed),
        num(p.newest_processed), num(p.lag, p.lag ? "warn" : ""), num(p.newest_txid),
        h("td", {}, counts(p.counts)));
    });
    document.getElementById("pipelines").replaceChildren(
      ...(rows.length ? rows : [empty(8, "No pipeline you may read is registered in the transaction log.")]));
  }

  function card(label, value, cls) {
    return h("div", { class: cls ? `card ${cls}` : "card" }, h("div", { class: "k" }, label),
      h("div", { class: "v" }, value));
  }

  function healthCard(health) {
    const text = health.reason ? `${health.status}: ${health.reason}` : health.status;
    return h("div", { class: health.reason ? "card wide" : "card", id: "health" },
      h("div", { class: "k" }, "health"),
      h("div", { class: health.status === "stalled" ? "v err" : "v" }, text));
  }

  let lastChart = null;

  function renderPipeline(data) {
    const p = data.pipeline;
    const lag = h("div", { class: p.lag ? "v warn" : "v" }, p.lag);
    document.getElementById("summary").replaceChildren(
      card("last committed", p.last_committed),
      card("newest processed", p.newest_processed),
      h("div", { class: "card" }, h("div", { class: "k" }, "lag"), lag),
      card("newest txid", p.newest_txid),
      card("commits / min (5 min)", data.chart.rate_per_min),
      card(`txids by status · ${p.source_kind} source · max pending ${p.max_pending}`, counts(p.counts), "wide"),
      healthCard(p.health),
      ...(data.retention ? [card("retention", data.retention.text, "wide")] : []));
    lastChart = data.chart;
    drawChart(document.getElementById("chart"), data.chart);
    renderStates(data.states, p.name);
    renderOutputs(data.outputs, data.now);
    renderTrends(data.expectations);
    const rows = data.txids.map((t) => h("tr", {},
      num(h("a", { href: `${root}/pipelines/${q(p.name)}/runs/${q(t.run_id)}` }, t.txid)),
      num(t.attempt),
      h("td", {}, status(t.status)),
      h("td", { class: "meta", title: t.metadata_json }, t.metadata_json),
      h("td", { class: "num", title: `begun ${fmtTime(t.begun_at, data.now)}` },
        duration(t.processing_s, t.processing_running)),
      h("td", { class: "num", title: `processed ${fmtTime(t.processed_at, data.now)}, committed ${fmtTime(t.committed_at, data.now)}` },
        duration(t.commit_wait_s, t.commit_wait_running)),
      h("td", { class: "meta" }, t.lake || ""),
      h("td", {}, error(t.last_error, t.txid, t.failed_by)),
      h("td", {}, audit(t.audit)),
      h("td", {}, airflowRun(p.name, t.run_id)),
      h("td", {}, rewindButton(t.rewind))));
    document.getElementById("txids").replaceChildren(...(rows.length ? rows : [empty(11, "No txid has begun yet.")]));
    const hint = document.getElementById("txids-hint");
    if (hint && data.rewind) {
      hint.textContent = `(newest first, at most ${data.limit}${data.rewind.text ? `; ${data.rewind.text}` : ""})`;
    }
  }

  // From which txid a state holds every committed txid (outputs.completeness): beside its figures.
  function complete(st) {
    return st.complete ? h("div", { class: st.partial ? "complete warn" : "complete" }, st.complete) : null;
  }

  function renderOutputs(outputs, now) {
    const tbody = document.getElementById("outputs");
    if (!tbody || !outputs) return;
    const rows = outputs.map((o) => h("tr", {},
      h("td", {}, o.name),
      h("td", {}, o.kind.replace("_", " ")),
      h("td", { class: o.partial || o.retired ? "complete warn" : "complete" }, o.complete,
        // an output filling from history: how much of it (rules/filling.py, fill_share)
        o.filling ? [" ", h("progress", { class: "fill", max: 1, value: o.fill.share })] : null),
      h("td", {}, fmtTime(o.declared_at, now))));
    tbody.replaceChildren(...(rows.length ? rows : [empty(4, "No output is recorded for this pipeline.")]));
  }

  // Each expectation's rows failed per committed txid, and how often it warned, dropped, failed.
  function renderTrends(x) {
    const tbody = document.getElementById("trends");
    if (!tbody || !x) return;
    const hint = document.getElementById("trends-hint");
    if (hint) {
      hint.textContent = "(the audit before each commit: rows failed per txid over the newest " +
        `${x.committed_txids} committed txids it judged; failed: listed txids it stopped)`;
    }
    const rows = x.trends.map((e) => h("tr", {},
      h("td", {}, e.expectation), h("td", {}, e.on), h("td", {}, e.action),
      h("td", {}, sparkline(e)), num(e.max_failed), num(e.txids), num(e.passed),
      num(e.warned, e.warned ? "warn" : ""), num(e.dropped, e.dropped ? "warn" : ""),
      num(e.failed, e.failed ? "err" : "")));
    tbody.replaceChildren(...(rows.length ? rows
      : [empty(10, "No expectation recorded an outcome in the listed txids.")]));
  }

  // A state card: its figures (re-rendered at each refresh) and the reads of its past below them,
  // kept across refreshes (what was typed and read stays, and the input keeps its focus).
  const stateCards = {};  // state name -> { card, figures, type }

  function stateFigures(st) {
    if (st.type === "global") {
      return [h("h3", {}, st.name, " ", h("span", { class: "tag" }, `${st.kind} · global`)),
        complete(st), h("div", { class: "v" }, st.value === null ? "—" : st.value)];
    }
    if (st.type === "map") {
      return [h("h3", {}, st.name, " ", h("span", { class: "tag" }, `${st.kind} · map by ${st.key_columns.join(", ")}`)),
        complete(st),
        h("div", { class: "kv" }, h("span", {}, `${st.keys} keys`), h("span", {}, `sum ${st.sum}`)),
        h("table", { class: "grid small" },
          h("thead", {}, h("tr", {}, h("th", {}, `key (top ${st.top.length})`), h("th", { class: "num" }, "value"))),
          h("tbody", {}, st.top.map((t) => h("tr", {}, h("td", {}, t.key), num(t.value)))))];
    }
    return [h("h3", {}, st.name), h("div", { class: "err" }, st.error)];
  }

  // Same markup as the macro state_reads.
  function readsPanel(st, pipeline) {
    const url = `${root}/api/pipelines/${q(pipeline)}/states/${q(st.name)}`;
    const keys = st.key_columns || [];
    return h("div", { class: "state-reads", "data-state": st.name, "data-url": url },
      h("form", { class: "state-read", "data-read": "history" },
        keys.map((c) => h("input", { name: "key", placeholder: c, "aria-label": `${st.name}: ${c}`, size: 10, required: true })),
        h("button", { type: "submit" }, keys.length ? "key history" : "history")),
      h("form", { class: "state-read", "data-read": "as_of" },
        h("input", { name: "txid", type: "number", min: 0, step: 1, placeholder: "txid", "aria-label": `${st.name}: as of txid`, required: true }),
        h("button", { type: "submit" }, "as of txid")),
      h("div", { class: "reads-result", role: "status" }));
  }

  function renderStates(states, pipeline) {
    const box = document.getElementById("states");
    const cards = states.map((st) => {
      let c = stateCards[st.name];
      if (!c || c.type !== st.type) {
        const figures = h("div", { class: "state-figures" });
        const reads = st.type === "error" ? null : readsPanel(st, pipeline);
        const card = h("div", { class: "state", "data-state": st.name, "data-type": st.type }, figures, reads);
        c = stateCards[st.name] = { card, figures, type: st.type };
      }
      c.figures.replaceChildren(...stateFigures(st));
      return c.card;
    });
    const shown = Array.from(box.childNodes);
    if (cards.length && cards.length === shown.length && cards.every((c, i) => shown[i] === c)) return;
    box.replaceChildren(
      ...(cards.length ? cards : [h("p", { class: "empty" }, "No state is registered for this pipeline.")]));
  }

  const shownValue = (v) => (v === null || v === undefined ? "—" : v);
  const signed = (v) => (v === null || v === undefined ? "—" : v > 0 ? `+${v}` : String(v));  // state_reads.signed

  // A key's history (GET …/states/<state>/history): newest first, bounded.
  function historyView(d, pipeline) {
    const parts = [h("p", { class: "reads-head" },
      h("strong", {}, d.key_label), ` now ${shownValue(d.current)} · ${d.reach}`)];
    if (!d.history.length) {
      parts.push(h("p", { class: "empty" }, "No kept txid changed this key."));
      return parts;
    }
    parts.push(h("table", { class: "grid small history" },
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "txid"), h("th", { class: "num" }, "attempt"),
        h("th", {}, "committed"), h("th", { class: "num" }, "before"), h("th", { class: "num" }, "after"),
        h("th", { class: "num" }, "change"))),
      h("tbody", {}, d.history.map((c) => h("tr", {},
        num(h("a", { href: `${root}/pipelines/${q(pipeline)}/runs/${q(c.run_id)}` }, c.txid)),
        num(shownValue(c.attempt)),
        h("td", { title: c.committed_at || "" }, fmtTime(c.committed_at, d.now)),
        num(shownValue(c.before)), num(shownValue(c.after)), num(signed(c.change)))))));
    if (d.more) parts.push(h("p", { class: "hint" }, `the newest ${d.history.length} txids that changed it`));
    return parts;
  }

  // A state as of a txid (GET …/states/<state>/as_of?txid=N): its value, or its largest values.
  function asOfView(d) {
    if (d.type === "global") {
      return [h("p", { class: "reads-head" }, `as of txid ${d.txid}: `, h("strong", {}, shownValue(d.value)))];
    }
    return [h("p", { class: "reads-head" }, `as of txid ${d.txid}: ${d.keys} keys · sum ${d.sum}`),
      h("table", { class: "grid small as-of" },
        h("thead", {}, h("tr", {}, h("th", {}, `key (top ${d.top.length})`), h("th", { class: "num" }, "value"))),
        h("tbody", {}, d.top.map((t) => h("tr", {}, h("td", {}, t.key), num(t.value)))))];
  }

  function setupStateReads() {
    const box = document.getElementById("states");
    if (!box || !box.addEventListener || !box.querySelectorAll) return;
    for (const card of box.querySelectorAll(":scope > .state[data-state]")) {  // rendered by the server
      const figures = card.querySelector(".state-figures");
      if (figures) stateCards[card.dataset.state] = { card, figures, type: card.dataset.type };
    }
    box.addEventListener("submit", async (event) => {
      const form = event.target.closest("form.state-read");
      if (!form) return;
      event.preventDefault();
      const panel = form.closest(".state-reads");
      const out = panel.querySelector(".reads-result");
      const history = form.dataset.read === "history";
      const params = new URLSearchParams();
      if (history) {
        for (const input of form.querySelectorAll("input[name=key]")) params.append("key", input.value);
      } else {
        params.set("txid", form.querySelector("input[name=txid]").value);
      }
      const pipeline = box.dataset.pipeline || "";
      out.replaceChildren(h("p", { class: "hint" }, "reading …"));
      try {
        const response = await fetch(`${panel.dataset.url}/${history ? "history" : "as_of"}?${params}`, {
          credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" },
        });
        let data = null;
        try { data = await response.json(); } catch (e) { data = null; }
        if (!response.ok) {  // 409: beyond retention (the typed error's message), 422: a bad key
          const detail = data && data.detail ? data.detail : response.statusText;
          out.replaceChildren(h("p", { class: "err refusal" }, detail));
          return;
        }
        out.replaceChildren(...(history ? historyView(data, pipeline) : asOfView(data)));
      } catch (e) {
        out.replaceChildren(h("p", { class: "err refusal" }, `The read failed: ${e.message}`));
      }
    });
  }

  // What a txid changed in each state (same markup as the macro changes).
  function renderChanges(x) {
    const box = document.getElementById("changes");
    if (!box || !x) return;
    if (x.status !== "ok") {
      box.replaceChildren(h("p", { class: "notice" }, x.message));
      return;
    }
    const parts = [];
    for (const st of x.states) {
      const tag = st.type === "global" ? "global" : `map by ${(st.key_columns || []).join(", ")}`;
      parts.push(h("h3", {}, st.name, st.type === "error" ? null : [" ", h("span", { class: "tag" }, `${st.kind} · ${tag}`)]));
      if (st.type === "error") {
        parts.push(h("div", { class: "err" }, st.error));
      } else if (!st.changes.length) {
        parts.push(h("p", { class: "empty" }, "This txid did not change it."));
      } else {
        parts.push(h("table", { class: "grid small changes", "data-state": st.name },
          h("thead", {}, h("tr", {}, h("th", {}, "key"), h("th", { class: "num" }, "before"),
            h("th", { class: "num" }, "after"), h("th", { class: "num" }, "change"))),
          h("tbody", {}, st.changes.map((c) => h("tr", {}, h("td", {}, c.key), num(shownValue(c.before)),
            num(shownValue(c.after)), num(signed(c.change)))))));
        if (st.more) parts.push(h("p", { class: "hint" }, `the ${st.changes.length} largest changes: it changed more keys`));
      }
    }
    box.replaceChildren(...(parts.length ? parts : [h("p", { class: "empty" }, "The pipeline has no state.")]));
  }

  function renderRun(data) {
    const c = data.current;
    const current = document.getElementById("current");
    if (c === null && data.pruned) {
      current.replaceChildren(h("p", { class: "notice" },
        `txid ${data.txid} committed; its record and attempts were pruned by retention ` +
        `(the log keeps the newest committed txids; the last committed txid is ${data.last_committed}).`));
    } else if (c === null) {
      current.replaceChildren(h("p", { class: "notice" },
        `txid ${data.txid} has not begun yet: its run waits for new data or for its turn ` +
        `(the last committed txid is ${data.last_committed}).`));
    } else {
      const errorParts = error(c.last_error, c.txid, c.failed_by);
      current.replaceChildren(h("dl", { class: "record" },
        h("dt", {}, "status"), h("dd", {}, status(c.status), ` attempt ${c.attempt}`),
        h("dt", {}, "begun"), h("dd", { title: c.begun_at || "" }, fmtTime(c.begun_at, data.now)),
        h("dt", {}, "processed"), h("dd", { title: c.processed_at || "" }, fmtTime(c.processed_at, data.now), " ",
          h("span", { class: "hint" }, "processing ", duration(c.processing_s, c.processing_running))),
        h("dt", {}, "committed"), h("dd", { title: c.committed_at || "" }, fmtTime(c.committed_at, data.now), " ",
          h("span", { class: "hint" }, "commit wait ", duration(c.commit_wait_s, c.commit_wait_running))),
        h("dt", {}, "last error"), h("dd", {}, errorParts.length ? errorParts : "—"),
        h("dt", {}, "metadata"), h("dd", {}, h("pre", {}, JSON.stringify(c.metadata, null, 2))),
        h("dt", {}, "output"), h("dd", {}, h("pre", {}, JSON.stringify(c.output, null, 2)))));
    }
    const rows = data.attempts.map((a) => h("tr", {},
      num(a.attempt),
      h("td", {}, status(a.status)),
      h("td", { title: a.started_at || "" }, fmtTime(a.started_at, data.now)),
      h("td", { title: a.processed_at || "" }, fmtTime(a.processed_at, data.now)),
      h("td", { title: a.ended_at || "" }, fmtTime(a.ended_at, data.now)),
      num(duration(a.processing_s, a.processing_running)),
      num(fmtDuration(a.total_s)),
      h("td", { class: "timings" }, a.timings_text || "—"),
      h("td", {}, error(a.error, data.txid, a.failed_by)),
      h("td", { class: "meta", title: a.metadata_json }, a.metadata_json),
      h("td", {}, audit(a.audit))));
    document.getElementById("attempts").replaceChildren(...(rows.length ? rows : [empty(11, "No attempt yet.")]));
    renderAudit(data.audit, data.now);
    renderChanges(data.changes);
  }

  // A txid's audit panel: its newest audited attempt's outcomes and its quarantined rows.
  function renderAudit(x, now) {
    const panel = document.getElementById("audit");
    if (!panel || !x) return;
    const parts = [];
    if (x.attempt === null) {
      parts.push(h("p", { class: "empty" }, "No expectation outcome is recorded for this txid: " +
        "none is declared, or no attempt reached its commit yet."));
    } else {
      parts.push(h("p", {}, audit(x.summary), " ", h("span", { class: "hint" }, `attempt ${x.attempt}`)));
      parts.push(h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, h("th", {}, "expectation"), h("th", {}, "on"), h("th", {}, "action"),
          h("th", {}, "taken"), h("th", { class: "num" }, "rows checked"), h("th", { class: "num" }, "rows failed"),
          h("th", {}, "sample keys"), h("th", {}, "message"))),
        h("tbody", {}, x.outcomes.map((o) => h("tr", {},
          h("td", {}, o.expectation), h("td", {}, o.on), h("td", {}, o.action), h("td", {}, taken(o.taken)),
          num(o.rows_checked), num(o.rows_failed),
          h("td", { class: "meta", title: o.sample_keys.join(", ") }, o.sample_keys.join(", ")),
          h("td", {}, o.message))))));
    }
    const byOutput = Object.entries(x.quarantined_by_output).map(([k, n]) => `${k} ${n}`).join(", ");
    parts.push(h("h3", {}, `Quarantined rows: ${x.quarantined}${byOutput ? ` (${byOutput})` : ""}`));
    if (x.quarantine.length) {
      parts.push(h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, h("th", {}, "output"), h("th", { class: "num" }, "attempt"),
          h("th", {}, "expectations"), h("th", {}, "row"), h("th", {}, "quarantined"))),
        h("tbody", {}, x.quarantine.map((r) => h("tr", {},
          h("td", {}, r.output), num(r.attempt), h("td", {}, r.expectations.join(", ")),
          h("td", { class: "meta", title: r.row_json }, r.row_json),
          h("td", { title: r.quarantined_at || "" }, fmtTime(r.quarantined_at, now)))))));
      if (x.quarantined > x.quarantine.length) {
        parts.push(h("p", { class: "hint" }, `the first ${x.quarantine.length} of ${x.quarantined}`));
      }
    } else if (x.summary.level === "failed") {
      parts.push(h("p", { class: "empty" }, "None: a failed ", h("code", {}, "fail"),
        " expectation stops the whole txid, so nothing of it is committed or quarantined."));
    } else {
      parts.push(h("p", { class: "empty" }, "No row of this txid is quarantined."));
    }
    panel.replaceChildren(...parts);
  }

  // -- chart: newest committed and processed txid over time, lag below --------------------------

  function drawChart(box, chart) {
    const W = Math.max(320, box.clientWidth || 640);
    const H = 230, L = 52, R = 12, TOP = 10, MID = 150, LAG_TOP = 168, BOTTOM = 208;
    const all = [...chart.committed, ...chart.processed];
    if (!all.length) {
      box.replaceChildren(h("p", { class: "hint" }, "No txid has been processed yet among the listed ones."));
      return;
    }
    const now = chart.now;
    const t0 = Math.min(...all.map((p) => p[0]), ...chart.lag.map((p) => p[0]));
    const t1 = Math.max(now, t0 + 1);
    const ys = all.map((p) => p[1]);
    const base = Math.min(...ys) - 1;
    const y0 = Math.max(0, base), y1 = Math.max(...ys, y0 + 1);
    const lagMax = Math.max(1, ...chart.lag.map((p) => p[1]));
    const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
    const y = (v) => MID - ((v - y0) / (y1 - y0)) * (MID - TOP);
    const yl = (v) => BOTTOM - (v / lagMax) * (BOTTOM - LAG_TOP);
    // A step line: the value holds until the next event, and until now after the last one.
    function steps(points, yOf, start) {
      let d = `M${x(t0).toFixed(1)},${yOf(start).toFixed(1)}`;
      let last = start;
      for (const [t, v] of points) {
        d += `H${x(t).toFixed(1)}V${yOf(v).toFixed(1)}`;
        last = v;
      }
      return { d: `${d}H${x(t1).toFixed(1)}`, last };
    }
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
      "aria-label": "newest committed and processed txid over time, and lag" });
    const text = (tx, ty, str, anchor, cls) => {
      const el = s("text", { x: tx, y: ty, "text-anchor": anchor || "start", class: cls || "axis" });
      el.textContent = str;
      return el;
    };
    svg.append(
      s("line", { x1: L, y1: MID, x2: W - R, y2: MID, class: "rule" }),
      s("line", { x1: L, y1: BOTTOM, x2: W - R, y2: BOTTOM, class: "rule" }),
      text(L - 6, TOP + 8, String(y1), "end"), text(L - 6, MID, String(y0), "end"),
      text(L - 6, LAG_TOP + 8, `lag ${lagMax}`, "end"), text(L - 6, BOTTOM, "0", "end"),
      text(L, H - 6, fmtTime(new Date(t0 * 1000).toISOString(), new Date(now * 1000).toISOString())),
      text(W - R, H - 6, "now", "end"));
    const processed = steps(chart.processed, y, y0);
    const committed = steps(chart.committed, y, y0);
    const lag = steps(chart.lag, yl, 0);
    svg.append(
      s("path", { d: `${lag.d}V${BOTTOM}H${x(t0).toFixed(1)}Z`, class: "lag" }),
      s("path", { d: processed.d, class: "processed" }),
      s("path", { d: committed.d, class: "committed" }),
      text(L + 8, TOP + 12, `committed ${committed.last}`, "start", "legend committed-text"),
      text(L + 130, TOP + 12, `processed ${processed.last}`, "start", "legend processed-text"));
    box.replaceChildren(svg);
  }

  // -- refresh ----------------------------------------------------------------------------------

  const renderers = { index: renderIndex, pipeline: renderPipeline, run: renderRun };
  const banner = document.getElementById("banner");
  const stamp = document.getElementById("stamp");
  let busy = false;
  let lastGood = stamp ? stamp.textContent : "";

  function showBanner(message) {
    banner.hidden = !message;
    banner.textContent = message || "";
  }

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(api, {
        credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" },
      });
      let data = null;
      try { data = await response.json(); } catch (e) { data = null; }
      if (!response.ok) {
        const detail = data && data.detail ? data.detail : response.statusText;
        throw new Error(`${response.status} ${detail}`);
      }
      renderers[page](data);
      lastGood = `updated ${fmtTime(data.now, data.now)} UTC`;
      if (stamp) stamp.textContent = lastGood;
      showBanner(null);
    } catch (e) {
      showBanner(`Refresh failed: ${e.message}. Showing the data of ${lastGood.replace("updated ", "")}; retrying.`);
    } finally {
      busy = false;
    }
  }

  // -- rewind: the confirmation dialog, then the plugin's API ---------------------------------

  function setupRewind() {
    const dialog = document.getElementById("rewind-dialog");
    const table = document.getElementById("txid-table");
    if (!dialog || !table) return;
    const $ = (id) => document.getElementById(id);
    const confirm = $("rewind-confirm"), cancel = $("rewind-cancel"), result = $("rewind-result");
    const reason = $("rewind-reason");
    let toTxid = null;

    function showResult(message, ok) {
      result.hidden = false;
      result.className = ok ? "notice" : "banner";
      result.textContent = message;
    }

    table.addEventListener("click", (event) => {
      const button = event.target.closest("button.rewind");
      if (!button || button.disabled) return;
      const d = button.dataset;
      toTxid = Number(d.to);
      $("rewind-to").textContent = d.to;
      $("rewind-text").textContent = d.text;
      $("rewind-states").textContent = d.states;
      confirm.textContent = `Rewind to txid ${d.to}`;
      confirm.hidden = false;
      confirm.disabled = false;
      cancel.textContent = "Cancel";
      reason.value = "";
      reason.disabled = false;
      result.hidden = true;
      dialog.showModal();
    });
    cancel.addEventListener("click", () => dialog.close());

    $("rewind-form").addEventListener("submit", async (event) => {
      event.preventDefault();  // the dialog stays open to show the answer
      if (toTxid === null) return;
      confirm.disabled = true;
      reason.disabled = true;
      showResult(`Rewinding to txid ${toTxid} …`, true);
      let response = null, data = null;
      try {
        response = await fetch(dialog.dataset.url, {
          method: "POST", credentials: "same-origin", cache: "no-store",
          headers: { Accept: "application/json", "Content-Type": "application/json" },
          body: JSON.stringify({ to_txid: toTxid, reason: reason.value.trim() || null }),
        });
        try { data = await response.json(); } catch (e) { data = null; }
      } catch (e) {
        showResult(`The rewind could not be sent: ${e.message}`, false);
        confirm.disabled = false;
        reason.disabled = false;
        return;
      }
      if (response.ok && data) {
        const r = data.rewound || [];
        const pending = r.length ? (r.length === 1 ? `txid ${r[0]} is` : `txids ${r[0]} … ${r[r.length - 1]} are`) : "no txid is";
        showResult(`Rewound ${data.pipeline} to txid ${data.to_txid} (the last committed txid was ` +
          `${data.last_committed_before}): ${pending} pending again; ` +
          `${data.restarted} task instance(s) of ${(data.dag_ids || []).join(", ") || "no DAG"} restarted.`, true);
        confirm.hidden = true;
        cancel.textContent = "Close";
      } else {
        const detail = data && data.detail ? data.detail : response.statusText;
        const why = response.status === 409 && data && data.error ? `${data.error}: ${detail}` : detail;
        showResult(`Refused (${response.status}): ${why}`, false);
        confirm.disabled = true;
      }
      refresh();
    });
  }

  setupRewind();
  setupStateReads();

  if (api && renderers[page]) {
    refresh();
    setInterval(refresh, pollMs);
    document.addEventListener("visibilitychange", refresh);
    window.addEventListener("resize", () => {
      if (lastChart) drawChart(document.getElementById("chart"), lastChart);
    });
  }
})();
