"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("replay-data").textContent);
  const SVG = "http://www.w3.org/2000/svg";
  // The one palette: what each colour means, for the chart and its legend alike (the
  // legend is drawn from it). Red is for failed switches only.
  const COLOURS = {
    hold: "#1e88e5", wait: "#90caf9", snapshot: "#ef6c00", restore: "#00897b",
    switch: "#6a3fb3", failed: "#c62828", idle: "#e0e0e0", queue: "#455a64",
    mark: "#444444", playhead: "#212121", overhead: "#9e9e9e",
  };
  const LEGEND = [
    ["hold", "holds (the accelerators working)"], ["wait", "waits (queued)"],
    ["snapshot", "snapshot"], ["restore", "restore"],
    ["switch", "switch (click for its parts)"], ["failed", "failed switch"],
    ["idle", "idle"], ["queue", "queue depth"], ["mark", "restart, revocation\u2026"],
    ["playhead", "playhead"],
  ];
  const PARTS = [["snapshot", "Snapshot", COLOURS.snapshot],
                 ["restore", "Restore", COLOURS.restore],
                 ["overhead", "Control overhead", COLOURS.overhead],
                 ["idle", "Idle (nobody waiting yet)", COLOURS.idle]];
  // Utilisation shares, bottom up, with the colour of what the time went to.
  const USAGE = [["busy", "hold", "working"], ["switching", "switch", "switching"],
                 ["idle", "idle", "idle"]];
  const ROW = 24, AXIS = 26, LABEL_W = 170;
  // The narrowest view: this many of the data's time quanta (its resolution).
  const MIN_QUANTA = 10;
  const $ = (id) => document.getElementById(id);
  const state = { run: null, t: 0, playing: false, speed: 1, selected: null,
                  last: null, rows: [], x: null, view: null, drag: null, dragged: false,
                  pending: false };

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }
  function html(name, text, parent, cls) {
    const node = document.createElement(name);
    if (text !== undefined && text !== null) node.textContent = text;
    if (cls) node.className = cls;
    if (parent) parent.appendChild(node);
    return node;
  }
  function title(node, text) { el("title", {}, node).textContent = text; }
  function grouped(n) { return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  // `s` seconds to the precision of data whose times are multiples of `res` seconds (a
  // power of ten, 1 s down to 1 us) and to four significant digits at most: "3 us"
  // for a microsecond span, "12 s" (not "12.000000 s") for data in whole seconds.
  function formatDuration(s, res) {
    if (s === null || s === undefined) return "not recorded";
    const quantum = res > 0 ? Math.max(res, 1e-6) : 1e-6;
    const digits = Math.max(0, Math.round(-Math.log10(quantum)));  // decimals of a second
    const a = Math.round(Math.abs(s) / quantum) * quantum;
    if (a === 0) return s === 0 ? "0 s" : "< " + formatDuration(quantum, quantum);
    const sign = s < 0 ? "-" : "";
    const sig = (v) => Math.max(0, 3 - Math.floor(Math.log10(v)));
    const fixed = (v, unit, decimals) => sign + v.toFixed(Math.min(decimals, sig(v))) + unit;
    if (a < 1e-3) return fixed(a * 1e6, " \u00b5s", 0);
    if (a < 1) return fixed(a * 1e3, " ms", Math.max(0, digits - 3));
    if (a < 120) return fixed(a, " s", digits);
    if (a < 3600) {
      const d = Math.min(digits, 1), scale = Math.pow(10, d);
      const units = Math.round(a * scale), m = Math.floor(units / (60 * scale));
      return sign + m + " min " + ((units - m * 60 * scale) / scale).toFixed(d) + " s";
    }
    const whole = Math.round(a), h = Math.floor(whole / 3600);
    const m = Math.floor((whole - h * 3600) / 60);
    return sign + h + " h " + m + " min " + (whole - h * 3600 - m * 60) + " s";
  }
  function resolution() { return (state.run && state.run.resolution) || 1e-6; }
  function dur(s) { return formatDuration(s, resolution()); }
  function tick(t, step) {
    // A tick to the precision of the step (0.2 s steps: tenths), never finer than the data.
    const quantum = Math.pow(10, Math.floor(Math.log10(step) + 1e-9));
    if (step < 60) return formatDuration(t, Math.max(resolution(), quantum));
    const m = Math.round(Math.abs(t) / 60), h = Math.floor(m / 60), sign = t < 0 ? "-" : "";
    if (!m) return "0";
    return sign + (h ? h + " h" + (m % 60 ? " " : "") : "") + (m % 60 ? (m % 60) + " min" : "");
  }
  function bytes(n) {
    if (n === null || n === undefined) return "not recorded";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n, u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    const short = u === 0 ? grouped(n) + " B" : v.toFixed(v < 10 ? 2 : 1) + " " + units[u];
    return u === 0 ? short : short + " (" + grouped(n) + " bytes)";
  }
  function jobName(run, job) { return (run.job_names && run.job_names[job]) || job || "-"; }
  function at(run, t) {
    let text = "t = " + dur(t);
    if (run.origin !== null && run.origin !== undefined) {
      text += " \u00b7 " + new Date((run.origin + t) * 1000).toISOString().replace("T", " ");
    }
    return text;
  }

  // --- layout ---------------------------------------------------------------------
  function layout(run) {
    const rows = [];
    for (const g of run.groups) {
      rows.push({ kind: "group", group: g, label: g });
      const jobs = run.jobs.filter((j) => run.spans.some((s) => s.group === g && s.job === j));
      for (const j of jobs) rows.push({ kind: "job", group: g, job: j, label: jobName(run, j) });
      rows.push({ kind: "usage", group: g, label: "utilisation" });
      rows.push({ kind: "queue", group: g, label: "queue depth" });
    }
    return rows;
  }

  // --- the visible range (zoom and pan) ---------------------------------------------
  function fullRange(run) { return Math.max(run.end - run.start, 1e-9); }
  function minRange(run) { return Math.min(fullRange(run), MIN_QUANTA * (run.resolution || 1e-6)); }
  // The view [from, to], as wide as the bounds allow and inside the run.
  function setView(from, to) {
    const run = state.run;
    const range = Math.min(fullRange(run), Math.max(minRange(run), to - from));
    let start = Math.max(run.start, Math.min(from, run.end - range));
    if (range >= fullRange(run)) start = run.start;
    state.view = { from: start, to: start + range };
  }
  function resetView() { setView(state.run.start, state.run.end); }
  function plotWidth() { return Number($("timeline").getAttribute("width")) - 20; }
  function timeAt(px) {
    const v = state.view;
    return v.from + ((px - 10) / plotWidth()) * (v.to - v.from);
  }
  // Zoom by `factor` (below 1: in) keeping the time `t` where it is on the screen.
  function zoomAt(t, factor) {
    const v = state.view, range = v.to - v.from;
    const share = (t - v.from) / range;
    const wanted = Math.min(fullRange(state.run), Math.max(minRange(state.run), range * factor));
    setView(t - share * wanted, t - share * wanted + wanted);
    redraw();
  }
  function zoomCentre(factor) {
    const v = state.view;
    const t = state.t >= v.from && state.t <= v.to ? state.t : (v.from + v.to) / 2;
    zoomAt(t, factor);
  }
  // Draw at the next frame, once however many changes come before it.
  function redraw() {
    if (state.pending) return;
    state.pending = true;
    requestAnimationFrame(() => { state.pending = false; draw(); });
  }

  function niceStep(span, ticks) {
    const raw = span / Math.max(1, ticks);
    if (raw > 30) {  // whole minutes and hours
      for (const m of [1, 2, 5, 10, 15, 30, 60, 120, 240, 360, 720, 1440]) {
        if (raw <= m * 60) return m * 60;
      }
    }
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
    return 10 * p;
  }

  function draw() {
    const run = state.run;
    const rows = layout(run);
    state.rows = rows;
    const labels = $("labels"), svg = $("timeline");
    labels.replaceChildren();
    svg.replaceChildren();
    const height = AXIS + rows.length * ROW + 8;
    const width = Math.max(400, $("chart").clientWidth - LABEL_W - 4);
    const view = state.view, span = view.to - view.from;
    // Off-screen coordinates are kept near the edges, so that no zoom strains the drawing.
    const x = (t) => Math.min(width + 50, Math.max(-50, ((t - view.from) / span) * (width - 20) + 10));
    state.x = x;
    svg.dataset.from = String(view.from);
    svg.dataset.to = String(view.to);
    $("view").textContent = (span >= fullRange(run) ? "whole run: " : "showing ")
      + dur(view.from) + " \u2026 " + dur(view.to);
    labels.setAttribute("width", LABEL_W);
    labels.setAttribute("height", height);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    const rowOf = {};
    rows.forEach((r, i) => {
      const y = AXIS + i * ROW;
      rowOf[r.kind === "job" ? "j:" + r.group + "\u0000" + r.job : r.kind + ":" + r.group] = y;
      const text = el("text", { x: r.kind === "group" ? 6 : 18, y: y + ROW * 0.68,
                                class: "row-label " + r.kind }, labels);
      text.textContent = r.kind === "group" ? "group " + r.label : r.label;
      el("line", { x1: 0, x2: width, y1: y + ROW, y2: y + ROW, class: "gridline" }, svg);
    });
    // time axis
    const axis = el("g", { class: "axis" }, svg);
    const step = niceStep(span, width / 110);
    const first = Math.ceil(view.from / step - 1e-9);
    for (let n = first; n * step <= view.to + step * 1e-9; n++) {
      const px = x(n * step);
      el("line", { x1: px, x2: px, y1: AXIS - 4, y2: height, class: "gridline" }, axis);
      el("text", { x: px + 2, y: 14 }, axis).textContent = tick(n * step, step);
    }
    // spans: waits under the rest
    const order = { wait: 0, hold: 1, snapshot: 2, restore: 3 };
    const spans = run.spans.slice().sort((a, b) => order[a.kind] - order[b.kind]);
    for (const s of spans) {
      const y = rowOf["j:" + s.group + "\u0000" + s.job];
      if (y === undefined) continue;
      const thin = s.kind === "wait";
      const fill = COLOURS[s.kind];
      const r = el("rect", {
        x: x(s.start), width: Math.max(1, x(s.end) - x(s.start)),
        y: y + (thin ? 8 : 4), height: thin ? ROW - 16 : ROW - 8,
        class: "span " + s.kind + (s.open ? " open" : ""),
        "data-kind": s.kind, "data-start": s.start, fill: fill,
      }, svg);
      let tip = jobName(run, s.job) + " " + s.kind + " " + s.group + ": " + dur(s.end - s.start)
        + " from t = " + dur(s.start);
      if (s.waited) tip += " (waited " + dur(s.waited) + ")";
      if (s.note) tip += " \u2014 " + s.note;
      if (s.open) tip += " (still going at the end of the record)";
      title(r, tip);
      if (s.switch !== null && s.switch !== undefined) {
        r.style.cursor = "pointer";
        r.addEventListener("click", () => select(s.switch));
      }
    }
    // switches
    for (const w of run.switches) {
      const y = rowOf["group:" + w.group];
      const r = el("rect", {
        x: x(w.start), width: Math.max(3, x(w.end) - x(w.start)), y: y + 3, height: ROW - 6,
        class: "switch" + (w.error ? " failed" : ""), "data-switch": w.index,
        "data-kind": w.error ? "failed" : "switch", fill: w.error ? COLOURS.failed : COLOURS.switch,
      }, svg);
      title(r, "switch " + (w.index + 1) + ": " + (w.saved.map((j) => jobName(run, j)).join(", ")
        || "nothing") + " \u2192 " + jobName(run, w.job) + ", " + dur(w.duration)
        + (w.error ? " \u2014 failed: " + w.error : ""));
      r.addEventListener("click", (e) => { e.stopPropagation(); select(w.index); });
    }
    // marks
    for (const m of run.marks) {
      const px = x(m.time);
      if (m.kind === "restart" || !m.group) {
        const line = el("line", { x1: px, x2: px, y1: AXIS, y2: height, class: "mark restart",
                                  stroke: COLOURS.mark, "data-kind": "mark" }, svg);
        title(line, "t = " + dur(m.time) + ": " + m.text);
        continue;
      }
      const y = rowOf["group:" + m.group];
      if (y === undefined) continue;
      const d = "M" + px + " " + (y + 2) + " l4 6 l-4 6 l-4 -6 z";
      title(el("path", { d: d, class: "mark " + m.kind, fill: COLOURS.mark, "data-kind": "mark" },
               svg), "t = " + dur(m.time) + ": " + m.text);
    }
    tracks(run, svg, rowOf, x);
    el("rect", { id: "future", x: 0, y: AXIS - 6, width: width, height: height }, svg);
    el("line", { id: "playhead", x1: 0, x2: 0, y1: AXIS - 6, y2: height,
                 stroke: COLOURS.playhead, "data-kind": "playhead" }, svg);
    if (state.selected !== null) mark(state.selected);
    show();
  }

  // --- tracks over time: utilisation and queue depth ---------------------------------
  function tracks(run, svg, rowOf, x) {
    const v = state.view;
    for (const track of run.tracks || []) {
      const top = rowOf["usage:" + track.group], qtop = rowOf["queue:" + track.group];
      if (top === undefined) continue;
      const h = ROW - 4;
      track.usage.forEach((u, i) => {
        if (u.end < v.from || u.start > v.to) return;
        const left = x(u.start), w = Math.max(0.5, x(u.end) - left);
        let y = top + 2 + h;
        const tip = "t = " + dur(u.start) + " \u2026 " + dur(u.end) + ": " + USAGE.map(
          ([key, , name]) => name + " " + (100 * u[key]).toFixed(1) + "%").join(", ");
        for (const [key, colour] of USAGE) {
          const part = h * u[key];
          y -= part;
          if (part <= 0) continue;
          title(el("rect", { x: left, y: y, width: w, height: part, fill: COLOURS[colour],
                             class: "usage", "data-kind": colour, "data-share": key,
                             "data-window": i, "data-value": u[key] }, svg), tip);
        }
      });
      const most = Math.max(1, ...track.queue.map((q) => q[1]));
      const yOf = (depth) => qtop + 2 + h - (h * depth) / most;
      let d = "";
      track.queue.forEach(([t, depth], i) => {
        d += (i ? " H" + x(t) + " V" : "M" + x(t) + " ") + yOf(depth);
      });
      if (d) d += " H" + x(run.end);
      const line = el("path", { d: d, class: "queue", fill: "none", stroke: COLOURS.queue,
                                "data-kind": "queue", "data-max": most }, svg);
      title(line, "jobs waiting for " + track.group + " (at most " + most + ")");
    }
  }

  // --- the playhead ---------------------------------------------------------------
  function show() {
    const run = state.run;
    const px = state.x(state.t);
    const head = $("playhead"), future = $("future");
    head.setAttribute("x1", px); head.setAttribute("x2", px);
    future.setAttribute("x", px);
    future.setAttribute("width", Math.max(0, Number($("timeline").getAttribute("width")) - px));
    const span = Math.max(run.end - run.start, 1e-9);
    $("scrub").value = String(Math.round(((state.t - run.start) / span) * 10000));
    $("clock").textContent = at(run, state.t) + " (of " + dur(run.start) + " \u2026 "
      + dur(run.end) + ")";
    const parts = [];
    for (const g of run.groups) {
      const live = run.spans.filter((s) => s.group === g && s.start <= state.t && state.t < s.end);
      const holder = live.find((s) => s.kind === "hold");
      const waiting = live.filter((s) => s.kind === "wait").map((s) => jobName(run, s.job));
      const moving = live.filter((s) => s.kind === "snapshot" || s.kind === "restore")
        .map((s) => s.kind + " " + jobName(run, s.job));
      const switching = run.switches.find((w) => w.group === g && w.start <= state.t
                                                 && state.t < w.end);
      let text = g + ": " + (holder ? jobName(run, holder.job) + " holds" : "free");
      if (switching) text += ", switching to " + jobName(run, switching.job);
      if (moving.length) text += " (" + moving.join(", ") + ")";
      if (waiting.length) text += "; waiting: " + waiting.join(", ");
      parts.push(text);
    }
    $("now").textContent = parts.join("   \u00b7   ");
  }

  function seek(t) {
    const run = state.run;
    state.t = Math.min(run.end, Math.max(run.start, t));
    show();
  }

  function frame(now) {
    if (!state.playing) return;
    const dt = state.last === null ? 0 : (now - state.last) / 1000;
    state.last = now;
    seek(state.t + dt * state.speed);
    const v = state.view;
    if (state.t > v.to || state.t < v.from) {  // the view follows the playhead
      setView(state.t - (v.to - v.from) * 0.1, state.t + (v.to - v.from) * 0.9);
      draw();
    }
    if (state.t >= state.run.end) { pause(); return; }
    requestAnimationFrame(frame);
  }
  function play() {
    if (state.t >= state.run.end) state.t = state.run.start;
    state.playing = true; state.last = null;
    $("play").textContent = "Pause";
    requestAnimationFrame(frame);
  }
  function pause() { state.playing = false; $("play").textContent = "Play"; }
  function toggle() { if (state.playing) pause(); else play(); }

  // --- a switch's parts -----------------------------------------------------------
  function mark(index) {
    document.querySelectorAll(".switch.selected, #switch-list tr.selected")
      .forEach((n) => n.classList.remove("selected"));
    const r = document.querySelector('#timeline .switch[data-switch="' + index + '"]');
    if (r) r.classList.add("selected");
    const row = document.querySelector('#switch-list tr[data-row-switch="' + index + '"]');
    if (row) row.classList.add("selected");
  }

  function select(index) {
    const run = state.run;
    const w = run.switches[index];
    if (!w) return;
    state.selected = index;
    mark(index);
    const box = $("details");
    box.hidden = false;
    box.dataset.switch = String(index);
    $("details-title").textContent = "Switch " + (index + 1) + " of " + run.switches.length
      + " \u00b7 group " + w.group + ": " + (w.saved.map((j) => jobName(run, j)).join(", ")
      || "nothing saved") + " \u2192 " + jobName(run, w.job)
      + (w.error ? " (failed)" : "");
    const bar = $("details-bar");
    bar.replaceChildren();
    const total = Math.max(w.duration, w.snapshot + w.restore + w.overhead + w.idle, 1e-12);
    for (const [key, name, color] of PARTS) {
      const seg = html("div", null, bar);
      seg.style.width = (100 * w[key] / total) + "%";
      seg.style.background = color;
      seg.title = name + ": " + dur(w[key]);
    }
    const body = $("parts").tBodies[0];
    body.replaceChildren();
    const rows = [
      ["wait", "Queue wait (Acquire to grant)", dur(w.wait), w.wait],
      ["duration", "Switch duration", dur(w.duration), w.duration],
      ["snapshot", "Snapshot", w.saved.length ? dur(w.snapshot) + " (" +
        w.saved.map((j) => jobName(run, j)).join(", ") + ")" : "nothing to save", w.snapshot],
      ["restore", "Restore", w.restored || w.restore ? dur(w.restore) : "nothing restored",
        w.restore],
      ["overhead", "Control overhead (duration minus the agents' work)", dur(w.overhead),
        w.overhead],
      ["bytes", "Bytes moved", bytes(w.moved_bytes), w.moved_bytes],
    ];
    if (w.idle > 0) {
      rows.splice(5, 0, ["idle", "Idle: nothing moved, nobody waited yet", dur(w.idle), w.idle]);
    }
    if (w.error) rows.push(["error", "Error", w.error, null]);
    for (const [key, name, text, value] of rows) {
      const tr = html("tr", null, body);
      tr.dataset.part = key;
      if (value !== null && value !== undefined && typeof value === "number") {
        tr.dataset.value = String(value);
      }
      html("th", name, tr);
      html("td", text, tr, key === "error" ? "error" : "");
    }
    let times = "Decided " + at(run, w.start);
    if (w.agents_began !== null && w.agents_began !== undefined) {
      times += "; agents asked " + dur(w.agents_began - w.start) + " later";
    }
    times += "; done " + at(run, w.end) + (w.token !== null ? "; fencing token " + w.token : "");
    $("details-times").textContent = times;
    const steps = $("steps");
    steps.hidden = !w.steps.length;
    const sbody = steps.tBodies[0];
    sbody.replaceChildren();
    for (const s of w.steps) {
      const tr = html("tr", null, sbody);
      for (const v of [s.node, jobName(run, s.job), s.kind, dur(s.seconds), bytes(s.bytes)]) {
        html("td", v, tr);
      }
    }
  }

  function nearest(direction) {
    const run = state.run;
    if (!run.switches.length) return;
    let index;
    if (state.selected === null) {
      // The first switch after the playhead (before it, going back), else the first (last).
      const after = run.switches.filter((w) => direction > 0 ? w.start > state.t + 1e-9
                                                              : w.end < state.t - 1e-9);
      const all = after.length ? after : run.switches;
      index = (direction > 0 ? all[0] : all[all.length - 1]).index;
    } else {
      index = Math.min(run.switches.length - 1, Math.max(0, state.selected + direction));
    }
    pause();
    select(index);
    seek(run.switches[index].end);
  }

  // --- the run --------------------------------------------------------------------
  function summary(run) {
    const s = run.summary;
    const box = $("summary");
    box.replaceChildren();
    const items = [
      ["switches", grouped(s.switches) + (s.failed ? " (" + s.failed + " failed)" : "")],
      ["groups \u00b7 jobs", run.groups.length + " \u00b7 " + run.jobs.length],
      ["recorded", dur(run.end - run.start)],
      ["bytes moved", bytes(s.moved_bytes)],
      ["median snapshot", dur(s.median_snapshot)],
      ["median restore", dur(s.median_restore)],
      ["median overhead", dur(s.median_overhead)],
      ["median queue wait", dur(s.median_wait)],
    ];
    for (const [name, value] of items) {
      const d = html("div", null, box);
      html("b", value, d);
      html("span", name, d);
    }
    box.firstChild.id = "switch-count";
    box.firstChild.dataset.count = String(s.switches);
    const notes = $("notes");
    notes.replaceChildren();
    for (const n of run.notes) html("li", n, notes);
    const meta = Object.entries(run.meta || {}).filter(([k]) => k !== "origin")
      .map(([k, v]) => k + ": " + v);
    $("meta").textContent = (run.source ? run.source + (meta.length ? " \u00b7 " : "") : "")
      + meta.join(" \u00b7 ");
  }

  function list(run) {
    const body = $("switch-list").tBodies[0];
    body.replaceChildren();
    for (const w of run.switches) {
      const tr = html("tr", null, body);
      tr.dataset.rowSwitch = String(w.index);
      const cells = [w.index + 1, w.group,
        (w.saved.map((j) => jobName(run, j)).join(", ") || "-") + " \u2192 " + jobName(run, w.job),
        dur(w.start), dur(w.duration), dur(w.wait), dur(w.snapshot), dur(w.restore),
        dur(w.overhead), bytes(w.moved_bytes)];
      cells.forEach((c) => html("td", String(c), tr, w.error ? "error" : ""));
      tr.addEventListener("click", () => { select(w.index); seek(w.end); });
    }
  }

  function speeds(run) {
    const sel = $("speed");
    sel.replaceChildren();
    const span = Math.max(run.end - run.start, 1e-6);
    const fit = span / 30;
    const fitOption = html("option", "whole run in 30 s", sel);
    fitOption.value = String(fit);
    for (const f of [0.001, 0.01, 0.1, 1, 10, 100, 1000, 10000]) {
      const wall = span / f;
      if (wall < 1 || wall > 3 * 3600) continue;
      const o = html("option", f === 1 ? "real time (1\u00d7)" : f + "\u00d7", sel);
      o.value = String(f);
    }
    sel.value = String(fit);
    state.speed = fit;
  }

  function choose(i) {
    pause();
    state.run = DATA.runs[i];
    state.selected = null;
    $("details").hidden = true;
    state.t = state.run.end;  // all of it shown; Play starts from the beginning
    resetView();
    $("run").value = String(i);
    summary(state.run);
    speeds(state.run);
    list(state.run);
    draw();
  }

  function init() {
    const runSel = $("run");
    DATA.runs.forEach((r, i) => {
      const o = html("option", r.label + " (" + r.switches.length + " switches)", runSel);
      o.value = String(i);
    });
    $("run-choice").hidden = DATA.runs.length < 2;
    legend();
    runSel.addEventListener("change", () => choose(Number(runSel.value)));
    $("speed").addEventListener("change", () => { state.speed = Number($("speed").value); });
    $("zoom-in").addEventListener("click", () => zoomCentre(0.5));
    $("zoom-out").addEventListener("click", () => zoomCentre(2));
    $("zoom-reset").addEventListener("click", () => { resetView(); draw(); });
    const svg = $("timeline");
    svg.addEventListener("wheel", (e) => {
      e.preventDefault();
      const box = svg.getBoundingClientRect();
      zoomAt(timeAt(e.clientX - box.left), Math.exp(Math.max(-5, Math.min(5, e.deltaY * 0.002))));
    }, { passive: false });
    svg.addEventListener("pointerdown", (e) => {
      if (e.button !== 0) return;
      state.drag = { x: e.clientX, view: state.view, id: e.pointerId, moving: false };
      state.dragged = false;
    });
    svg.addEventListener("pointermove", (e) => {
      const drag = state.drag;
      if (!drag || drag.id !== e.pointerId) return;
      const dx = e.clientX - drag.x;
      if (!drag.moving && Math.abs(dx) < 4) return;  // a click, so far
      if (!drag.moving) { drag.moving = true; svg.setPointerCapture(e.pointerId); }
      const shift = (dx / plotWidth()) * (drag.view.to - drag.view.from);
      setView(drag.view.from - shift, drag.view.to - shift);
      redraw();
    });
    const release = (e) => {
      if (!state.drag || state.drag.id !== e.pointerId) return;
      state.dragged = state.drag.moving;
      state.drag = null;
    };
    svg.addEventListener("pointerup", release);
    svg.addEventListener("pointercancel", release);
    $("play").addEventListener("click", toggle);
    $("prev").addEventListener("click", () => nearest(-1));
    $("next").addEventListener("click", () => nearest(1));
    $("scrub").addEventListener("input", () => {
      const run = state.run;
      seek(run.start + (Number($("scrub").value) / 10000) * (run.end - run.start));
    });
    svg.addEventListener("click", (e) => {
      if (state.dragged) { state.dragged = false; return; }  // the end of a pan
      if (e.target.closest && e.target.closest(".switch")) return;
      seek(timeAt(e.clientX - svg.getBoundingClientRect().left));
    });
    document.addEventListener("keydown", (e) => {
      if (e.target && (e.target.tagName === "SELECT" || e.target.tagName === "INPUT")) return;
      if (e.key === " ") { e.preventDefault(); toggle(); }
      else if (e.key === "ArrowRight") nearest(1);
      else if (e.key === "ArrowLeft") nearest(-1);
      else if (e.key === "+" || e.key === "=") zoomCentre(0.5);
      else if (e.key === "-") zoomCentre(2);
      else if (e.key === "0") { resetView(); draw(); }
    });
    window.addEventListener("resize", () => draw());
    if (!DATA.runs.length) {
      $("summary").textContent = "No runs to replay.";
      $("controls").hidden = true;
      return;
    }
    choose(Math.min(DATA.runs.length - 1, Math.max(0, DATA.latest || 0)));
    document.body.dataset.ready = "1";
  }

  // The legend, from the palette the chart is drawn with.
  function legend() {
    const box = $("legend");
    box.replaceChildren();
    for (const [key, text] of LEGEND) {
      const entry = html("span", null, box);
      entry.dataset.key = key;
      const swatch = html("i", null, entry, "key");
      swatch.style.background = COLOURS[key];
      entry.appendChild(document.createTextNode(text));
    }
  }

  // For the page's tests: the one duration format.
  window.timesliceReplay = { formatDuration: formatDuration, colours: COLOURS };
  init();
})();
