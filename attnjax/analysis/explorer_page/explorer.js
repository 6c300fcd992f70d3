// The attention explorer of attnjax (attnjax/analysis/explore.py writes the data below into
// the page). Plain JavaScript, no library, no network: everything it shows is in DATA.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("attnjax-data").textContent);
  const PALETTE = ["#d7263d", "#1b998b", "#2e5eaa", "#f46036", "#8f2d91", "#c5a100",
                   "#2d3047", "#5aa02c"];
  const ONE_HEAD = "#2a5bd7";
  const ROW = 18;                       // pixels per token in the lines mode
  const $ = (id) => document.getElementById(id);
  const COLOURMAP = hexBytes(DATA.colormap);

  function hexBytes(hex) {
    const out = new Uint8Array(hex.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(2 * i, 2), 16);
    return out;
  }

  function make(tag, attributes, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;   // token text is never parsed as HTML
    return node;
  }

  function rgb(hex) {
    return [1, 3, 5].map((i) => parseInt(hex.substr(i, 2), 16));
  }

  // ---------------------------------------------------------------- state and data

  const state = {view: "model", group: DATA.groups[0].name, example: 0, layer: 0, head: 0,
                 mode: "lines", scale: "linear", annotate: "", overlay: [], focus: null,
                 sort: {key: "", dir: 1}};
  const decoded = new Map();

  function group(name = state.group) {
    return DATA.groups.find((g) => g.name === name);
  }

  // One example's weights of one head group: bytes [layers, heads, T, S], q / scale each.
  function slot(example, name) {
    const key = example + "/" + name;
    if (!decoded.has(key)) {
      const item = DATA.examples[example].groups[name];
      const text = atob(item.weights);
      const bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      decoded.set(key, {bytes, queries: item.queries, keys: item.keys, note: item.note,
                        T: item.queries.length, S: item.keys.length,
                        heads: group(name).heads});
    }
    return decoded.get(key);
  }

  function current() {
    return slot(state.example, state.group);
  }

  function weight(s, layer, head, q, k) {
    return s.bytes[((layer * s.heads + head) * s.T + q) * s.S + k] / DATA.scale;
  }

  function row(s, layer, head, q) {
    return Array.from({length: s.S}, (_, k) => weight(s, layer, head, q, k));
  }

  function column(s, layer, head, k) {
    return Array.from({length: s.T}, (_, q) => weight(s, layer, head, q, k));
  }

  function shade(value) {                // the colour map's index of a weight
    const v = state.scale === "sqrt" ? Math.sqrt(value) : value;
    return Math.max(0, Math.min(255, Math.round(255 * v)));
  }

  function format(value) {
    if (value === null || value === undefined || Number.isNaN(value)) return "\u2014";
    if (value === 0) return "0";
    const size = Math.abs(value);
    if (size >= 1e5 || size < 1e-3) return value.toExponential(2);
    return String(Number(value.toPrecision(4)));
  }

  // a token as written, on one line; one of only white space (a tokenizer's " " or "\n")
  // made visible
  function label(text) {
    if (text === "") return "\u2205";
    const lines = text.replace(/\r/g, "\u240d").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
    return lines.trim() === "" ? lines.replace(/ /g, "\u2423") : lines;
  }

  // the heads drawn in the head view (one) or the overlay (several), each with its colour
  function drawn() {
    if (state.view === "overlay") return state.overlay;
    return [{layer: state.layer, head: state.head, colour: ONE_HEAD}];
  }

  // ---------------------------------------------------------------- the URL keeps the view

  function saveHash() {
    const parts = [["view", state.view], ["group", state.group], ["example", state.example],
                   ["layer", state.layer], ["head", state.head], ["mode", state.mode],
                   ["scale", state.scale],
                   ["overlay", state.overlay.map((h) => h.layer + "." + h.head).join(",")]];
    try {
      history.replaceState(null, "", "#" + parts.map(([k, v]) => k + "=" +
        encodeURIComponent(v)).join("&"));
    } catch (error) { /* a browser that keeps the address of a file as it is */ }
  }

  function loadHash() {
    const values = new URLSearchParams(location.hash.slice(1));
    const number = (key, high) => {
      const v = parseInt(values.get(key), 10);
      return Number.isInteger(v) && v >= 0 && v < high ? v : null;
    };
    if (group(values.get("group"))) state.group = values.get("group");
    if (["model", "head", "overlay", "table"].includes(values.get("view"))) {
      state.view = values.get("view");
    }
    if (["lines", "matrix"].includes(values.get("mode"))) state.mode = values.get("mode");
    if (["linear", "sqrt"].includes(values.get("scale"))) state.scale = values.get("scale");
    const g = group();
    state.example = number("example", DATA.examples.length) ?? 0;
    state.layer = number("layer", g.layers) ?? 0;
    state.head = number("head", g.heads) ?? 0;
    for (const pair of (values.get("overlay") || "").split(",").filter(Boolean)) {
      const [layer, head] = pair.split(".").map((x) => parseInt(x, 10));
      if (layer >= 0 && layer < g.layers && head >= 0 && head < g.heads) addOverlay(layer, head);
    }
  }

  // ---------------------------------------------------------------- the model view

  function mapSize(g, s) {
    // the grid: a 28-pixel column of layer names, then per head the map, 8 pixels of frame
    // and a 6-pixel gap
    const width = Math.max(320, $("grid").clientWidth || window.innerWidth - 40);
    const side = Math.floor((width - 28) / g.heads) - 14;
    return Math.max(44, Math.min(150, side, Math.max(72, 4 * Math.max(s.T, s.S))));
  }

  // a head's weights as an image of S x T pixels (one per weight), drawn scaled
  function headImage(s, layer, head) {
    const image = new ImageData(s.S, s.T);
    for (let q = 0; q < s.T; q++) {
      for (let k = 0; k < s.S; k++) {
        const c = 3 * shade(weight(s, layer, head, q, k));
        const at = 4 * (q * s.S + k);
        image.data[at] = COLOURMAP[c];
        image.data[at + 1] = COLOURMAP[c + 1];
        image.data[at + 2] = COLOURMAP[c + 2];
        image.data[at + 3] = 255;
      }
    }
    const canvas = make("canvas", {width: s.S, height: s.T});
    canvas.getContext("2d").putImageData(image, 0, 0);
    return canvas;
  }

  function columnRange(g, key) {
    const values = g.values[key].flat().filter((v) => v !== null);
    return {low: Math.min(...values), high: Math.max(...values),
            span: Math.max(...values.map(Math.abs))};
  }

  function annotation(g, key, layer, head, range) {
    const value = g.values[key][layer][head];
    const column = g.columns.find((c) => c.key === key);
    if (value === null) return {text: "\u2014", colour: "transparent"};
    let colour;
    if (column.kind === "share") {       // red: positive, blue: negative, by the largest size
      const t = range.span > 0 ? Math.min(1, Math.abs(value) / range.span) : 0;
      const alpha = 0.08 + 0.62 * t;
      colour = value >= 0 ? `rgba(215, 38, 61, ${alpha})` : `rgba(46, 94, 170, ${alpha})`;
    } else {
      const t = range.high > range.low ? (value - range.low) / (range.high - range.low) : 0;
      colour = `rgba(42, 91, 215, ${0.08 + 0.62 * t})`;
    }
    return {text: format(value), colour};
  }

  function renderModel() {
    const g = group(), s = current(), grid = $("grid");
    const size = mapSize(g, s);
    const scale = size / Math.max(s.T, s.S);
    grid.replaceChildren();
    grid.style.gridTemplateColumns = `28px repeat(${g.heads}, ${size + 8}px)`;
    grid.append(make("span"));
    for (let head = 0; head < g.heads; head++) grid.append(make("span", {class: "axis"}, "H" + head));
    const range = state.annotate ? columnRange(g, state.annotate) : null;
    const picked = new Map(state.overlay.map((h) => [h.layer + "." + h.head, h.colour]));
    for (let layer = 0; layer < g.layers; layer++) {
      grid.append(make("span", {class: "axis"}, "L" + layer));
      for (let head = 0; head < g.heads; head++) {
        const cell = make("figure", {class: "cell", "data-layer": layer, "data-head": head});
        if (layer === state.layer && head === state.head) cell.classList.add("current");
        if (picked.has(layer + "." + head)) {
          cell.classList.add("picked");
          cell.style.setProperty("--pick", picked.get(layer + "." + head));
        }
        const canvas = make("canvas", {width: Math.round(s.S * scale),
                                       height: Math.round(s.T * scale)});
        const context = canvas.getContext("2d");
        context.imageSmoothingEnabled = false;
        context.drawImage(headImage(s, layer, head), 0, 0, canvas.width, canvas.height);
        cell.append(canvas);
        if (state.annotate) {
          const {text, colour} = annotation(g, state.annotate, layer, head, range);
          cell.append(make("span", {class: "value"}, text));
          cell.style.background = colour;
        }
        cell.addEventListener("mouseenter", (event) => showStatistics(event, g, layer, head));
        cell.addEventListener("mousemove", moveTooltip);
        cell.addEventListener("mouseleave", hideTooltip);
        cell.addEventListener("click", (event) => {
          hideTooltip();
          if (event.shiftKey) {
            toggleOverlay(layer, head);
            render();
          } else {
            select({view: "head", layer, head});
          }
        });
        grid.append(cell);
      }
    }
  }

  function showStatistics(event, g, layer, head) {
    const tip = $("tooltip");
    tip.replaceChildren(make("h3", {}, `L${layer} H${head} \u00b7 ${g.title}`));
    const table = make("table");
    for (const column of g.columns) {
      const tr = make("tr", {"data-key": column.key, title: column.about});
      tr.append(make("td", {}, column.label),
                make("td", {}, format(g.values[column.key][layer][head])));
      table.append(tr);
    }
    tip.append(table, make("div", {class: "more"}, "click: head view \u00b7 shift-click: overlay"));
    tip.dataset.layer = layer;
    tip.dataset.head = head;
    tip.hidden = false;
    moveTooltip(event);
  }

  function moveTooltip(event) {
    const tip = $("tooltip");
    const x = Math.min(event.clientX + 16, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(event.clientY + 16, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = Math.max(4, x) + "px";
    tip.style.top = Math.max(4, y) + "px";
  }

  function hideTooltip() {
    $("tooltip").hidden = true;
  }

  // ---------------------------------------------------------------- the head view and overlay

  function renderFigure(figure, panel) {
    const s = current(), heads = drawn();
    figure.replaceChildren();
    if (s.note) figure.append(make("p", {class: "hint"}, s.note));
    if (!heads.length) {
      figure.append(make("p", {class: "hint"}, "No head chosen: add one above, or shift-click " +
                         "maps in the model view."));
      panel.replaceChildren();
      return;
    }
    if (state.mode === "lines") renderLines(figure, s, heads);
    else renderMatrix(figure, s, heads);
    renderFocus(panel, s, heads);
  }

  function renderLines(figure, s, heads) {
    const g = group();
    const box = make("div", {class: "lines"});
    const queries = make("div", {class: "tokens queries"});
    const keys = make("div", {class: "tokens keys"});
    queries.append(make("div", {class: "axis"}, g.query_axis));
    keys.append(make("div", {class: "axis"}, g.key_axis));
    s.queries.forEach((text, q) => queries.append(token(text, "query", q)));
    s.keys.forEach((text, k) => keys.append(token(text, "key", k)));
    const height = Math.max(s.T, s.S) * ROW;
    const canvas = make("canvas", {width: 240, height, class: "links"});
    canvas.style.marginTop = "20px";
    box.append(queries, canvas, keys);
    figure.append(box);
    drawLines(canvas, s, heads);
    shadeTokens(box, s, heads);
  }

  function token(text, side, index) {
    const node = make("div", {class: "tok " + side, "data-side": side, "data-index": index},
                      label(text));
    node.addEventListener("mouseenter", () => setFocus({side, index}));
    node.addEventListener("mouseleave", () => setFocus(null));
    return node;
  }

  function drawLines(canvas, s, heads) {
    const context = canvas.getContext("2d");
    context.clearRect(0, 0, canvas.width, canvas.height);
    context.lineWidth = 2;
    const focus = state.focus;
    for (const h of heads) {
      const [r, g, b] = rgb(h.colour);
      for (let q = 0; q < s.T; q++) {
        if (focus && focus.side === "query" && focus.index !== q) continue;
        for (let k = 0; k < s.S; k++) {
          if (focus && focus.side === "key" && focus.index !== k) continue;
          const w = weight(s, h.layer, h.head, q, k);
          if (w === 0) continue;
          const alpha = state.scale === "sqrt" ? Math.sqrt(w) : w;
          context.strokeStyle = `rgba(${r}, ${g}, ${b}, ${alpha})`;
          context.beginPath();
          context.moveTo(0, q * ROW + ROW / 2);
          context.lineTo(canvas.width, k * ROW + ROW / 2);
          context.stroke();
        }
      }
    }
  }

  // with a token in focus, the tokens on the other side are tinted by their weight
  function shadeTokens(box, s, heads) {
    const focus = state.focus;
    for (const node of box.querySelectorAll(".tok")) {
      node.style.background = "";
      node.classList.toggle("on", !!focus && node.dataset.side === focus.side &&
                            +node.dataset.index === focus.index);
    }
    if (!focus) return;
    const other = focus.side === "query" ? "key" : "query";
    for (const node of box.querySelectorAll(".tok." + other)) {
      const i = +node.dataset.index;
      const mixed = mix(heads.map((h) => [h.colour, focus.side === "query"
        ? weight(s, h.layer, h.head, focus.index, i) : weight(s, h.layer, h.head, i, focus.index)]));
      node.style.background = `rgb(${mixed.join(", ")})`;
    }
  }

  // white, with each colour laid on it by its weight (as inks: two heads darken a shared cell)
  function mix(pairs) {
    const out = [255, 255, 255];
    for (const [hex, w] of pairs) {
      const a = Math.min(1, state.scale === "sqrt" ? Math.sqrt(w) : w);
      const c = rgb(hex);
      for (let i = 0; i < 3; i++) out[i] = out[i] * (1 - a) + (out[i] * c[i] / 255) * a;
    }
    return out.map(Math.round);
  }

  function renderMatrix(figure, s, heads) {
    const g = group();
    const cell = Math.max(6, Math.min(26, Math.floor(620 / Math.max(s.T, s.S))));
    const canvas = make("canvas", {class: "matrix"});
    const context = canvas.getContext("2d");
    const font = Math.min(12, cell - 1) + "px ui-monospace, 'DejaVu Sans Mono', monospace";
    context.font = font;
    const widest = (labels) => Math.max(20, ...labels.map((t) => context.measureText(label(t)).width));
    const left = Math.ceil(widest(s.queries)) + 10, top = Math.ceil(widest(s.keys)) + 10;
    canvas.width = left + s.S * cell + 24;
    canvas.height = top + s.T * cell + 24;
    const layout = {left, top, cell, font};
    canvas.layout = layout;
    drawMatrix(canvas, s, heads);
    canvas.addEventListener("mousemove", (event) => {
      const box = canvas.getBoundingClientRect();
      const x = event.clientX - box.left, y = event.clientY - box.top;
      const k = Math.floor((x - left) / cell), q = Math.floor((y - top) / cell);
      const inQ = q >= 0 && q < s.T, inK = k >= 0 && k < s.S;
      let focus = null;
      if (inQ && inK) focus = {side: "query", index: q, key: k};
      else if (inQ && x < left) focus = {side: "query", index: q};
      else if (inK && y < top) focus = {side: "key", index: k};
      const same = JSON.stringify(focus) === JSON.stringify(state.focus);
      if (!same) setFocus(focus);
    });
    canvas.addEventListener("mouseleave", () => setFocus(null));
    figure.append(make("p", {class: "axes"}, `rows: ${g.query_axis} \u00b7 columns: ${g.key_axis}`),
                  canvas);
  }

  function drawMatrix(canvas, s, heads) {
    const {left, top, cell, font} = canvas.layout;
    const context = canvas.getContext("2d");
    context.fillStyle = "#fff";
    context.fillRect(0, 0, canvas.width, canvas.height);
    for (let q = 0; q < s.T; q++) {
      for (let k = 0; k < s.S; k++) {
        let colour;
        if (heads.length === 1) {
          const c = 3 * shade(weight(s, heads[0].layer, heads[0].head, q, k));
          colour = [COLOURMAP[c], COLOURMAP[c + 1], COLOURMAP[c + 2]];
        } else {
          colour = mix(heads.map((h) => [h.colour, weight(s, h.layer, h.head, q, k)]));
        }
        context.fillStyle = `rgb(${colour.join(", ")})`;
        context.fillRect(left + k * cell, top + q * cell, cell, cell);
      }
    }
    if (heads.length > 1) {              // a grid, so that white cells read as cells
      context.strokeStyle = "#e3e6ec";
      context.lineWidth = 1;
      context.strokeRect(left - 0.5, top - 0.5, s.S * cell + 1, s.T * cell + 1);
    }
    context.font = font;
    context.fillStyle = "#1d2330";
    context.textBaseline = "middle";
    context.textAlign = "right";
    s.queries.forEach((text, q) => context.fillText(label(text), left - 5, top + (q + 0.5) * cell));
    context.save();
    context.textAlign = "left";
    s.keys.forEach((text, k) => {
      context.save();
      context.translate(left + (k + 0.5) * cell, top - 5);
      context.rotate(-Math.PI / 2);
      context.fillText(label(text), 0, 0);
      context.restore();
    });
    context.restore();
    const focus = state.focus;
    if (focus) {
      context.strokeStyle = "#d7263d";
      context.lineWidth = 2;
      if (focus.side === "query") context.strokeRect(left, top + focus.index * cell, s.S * cell, cell);
      if (focus.side === "key") context.strokeRect(left + focus.index * cell, top, cell, s.T * cell);
      if (focus.key !== undefined) {
        context.strokeRect(left + focus.key * cell, top, cell, s.T * cell);
      }
    }
  }

  // the panel beside the figure: the row (a query's weights) or column (a key's) in focus
  function renderFocus(panel, s, heads) {
    panel.replaceChildren();
    const focus = state.focus;
    const first = heads[0];
    for (const key of ["kind", "index", "layer", "head", "key", "weights"]) delete panel.dataset[key];
    if (!focus) {
      panel.append(make("h3", {}, heads.length === 1 ? `L${first.layer} H${first.head}`
                                                      : `${heads.length} heads`),
                   make("p", {}, "Hover a token (or a row or column of the matrix) to read " +
                        "its weights."));
      return;
    }
    const isRow = focus.side === "query";
    const labels = isRow ? s.keys : s.queries;
    const own = (isRow ? s.queries : s.keys)[focus.index];
    const values = heads.map((h) => isRow ? row(s, h.layer, h.head, focus.index)
                                          : column(s, h.layer, h.head, focus.index));
    panel.dataset.kind = isRow ? "row" : "column";
    panel.dataset.index = focus.index;
    panel.dataset.layer = first.layer;
    panel.dataset.head = first.head;
    panel.dataset.weights = JSON.stringify(values[0]);
    if (focus.key !== undefined) panel.dataset.key = focus.key;
    const what = isRow ? `query ${focus.index} \u201c${label(own)}\u201d: its weights over the keys`
                       : `key ${focus.index} \u201c${label(own)}\u201d: the weight each query gives it`;
    panel.append(make("h3", {}, what));
    if (focus.key !== undefined) {
      panel.append(make("p", {class: "cell-weight"}, `to key ${focus.key} \u201c${label(s.keys[focus.key])}\u201d: ` +
                        heads.map((h, i) => format(values[i][focus.key])).join(" / ")));
    }
    const order = values[0].map((_, i) => i)
      .sort((a, b) => Math.max(...values.map((v) => v[b])) - Math.max(...values.map((v) => v[a])))
      .slice(0, 12);
    const table = make("table");
    for (const i of order) {
      const tr = make("tr");
      tr.append(make("td", {}, String(i)), make("td", {}, label(labels[i])));
      heads.forEach((h, j) => {
        const bar = make("td", {class: "bar"});
        const fill = make("span");
        fill.style.width = (100 * values[j][i]) + "%";
        fill.style.background = h.colour;
        bar.append(fill);
        tr.append(bar, make("td", {}, values[j][i].toFixed(3)));
      });
      table.append(tr);
    }
    panel.append(table);
    if (labels.length > order.length) {
      panel.append(make("p", {class: "hint"}, `the ${order.length} largest of ${labels.length}`));
    }
  }

  function setFocus(focus) {
    state.focus = focus;
    const figure = $(state.view === "overlay" ? "overlay-figure" : "head-figure");
    const panel = $(state.view === "overlay" ? "overlay-focus" : "head-focus");
    const s = current(), heads = drawn();
    const links = figure.querySelector("canvas.links");
    if (links) {
      drawLines(links, s, heads);
      shadeTokens(figure, s, heads);
    }
    const matrix = figure.querySelector("canvas.matrix");
    if (matrix) drawMatrix(matrix, s, heads);
    renderFocus(panel, s, heads);
  }

  function addOverlay(layer, head) {
    if (state.overlay.some((h) => h.layer === layer && h.head === head)) return;
    const used = new Set(state.overlay.map((h) => h.colour));
    const colour = PALETTE.find((c) => !used.has(c));
    if (colour) state.overlay.push({layer, head, colour});
  }

  function toggleOverlay(layer, head) {
    const before = state.overlay.length;
    state.overlay = state.overlay.filter((h) => !(h.layer === layer && h.head === head));
    if (state.overlay.length === before) addOverlay(layer, head);
  }

  function renderChips() {
    const chips = $("chips");
    chips.replaceChildren();
    for (const h of state.overlay) {
      const chip = make("span", {class: "chip", "data-layer": h.layer, "data-head": h.head});
      const swatch = make("i");
      swatch.style.background = h.colour;
      const remove = make("button", {type: "button", title: "remove"}, "\u00d7");
      remove.addEventListener("click", () => { toggleOverlay(h.layer, h.head); render(); });
      chip.append(swatch, make("span", {}, `L${h.layer} H${h.head}`), remove);
      chips.append(chip);
    }
    if (state.overlay.length >= PALETTE.length) {
      chips.append(make("span", {class: "hint"}, `at most ${PALETTE.length} heads at once`));
    }
  }

  // ---------------------------------------------------------------- the table

  function renderTable() {
    const g = group();
    const head = $("stats").tHead, body = $("stats").tBodies[0];
    const columns = [{key: "", label: "head"}, ...g.columns];
    head.replaceChildren();
    const tr = make("tr");
    for (const column of columns) {
      const sorted = state.sort.key === column.key;
      const th = make("th", {"data-key": column.key, title: column.about || "layer, head"},
                      column.label + (sorted ? (state.sort.dir > 0 ? " \u25b2" : " \u25bc") : ""));
      if (sorted) th.classList.add("sorted");
      th.addEventListener("click", () => {
        state.sort = {key: column.key, dir: sorted ? -state.sort.dir : (column.key ? -1 : 1)};
        renderTable();
      });
      tr.append(th);
    }
    head.append(tr);
    const rows = [];
    for (let layer = 0; layer < g.layers; layer++) {
      for (let h = 0; h < g.heads; h++) rows.push([layer, h]);
    }
    const {key, dir} = state.sort;
    if (key) {
      const value = ([l, h]) => g.values[key][l][h];
      rows.sort((a, b) => {
        const x = value(a), y = value(b);
        if (x === null || y === null) return (x === null) - (y === null);   // blanks last
        return dir * (x - y) || a[0] - b[0] || a[1] - b[1];
      });
    } else if (dir < 0) {
      rows.reverse();
    }
    body.replaceChildren();
    for (const [layer, h] of rows) {
      const line = make("tr", {"data-layer": layer, "data-head": h});
      line.append(make("td", {}, `L${layer}.H${h}`));
      for (const column of g.columns) {
        const value = g.values[column.key][layer][h];
        line.append(make("td", {"data-value": value === null ? "" : value}, format(value)));
      }
      line.addEventListener("click", () => select({view: "head", layer, head: h}));
      body.append(line);
    }
    const about = $("about");
    about.replaceChildren();
    for (const column of g.columns) about.append(make("dt", {}, column.label), make("dd", {}, column.about));
  }

  // ---------------------------------------------------------------- controls

  function fill(selectNode, count, prefix, value) {
    selectNode.replaceChildren(...Array.from({length: count}, (_, i) =>
      make("option", {value: i}, prefix + i)));
    selectNode.value = value;
  }

  function renderControls() {
    const g = group();
    for (const button of document.querySelectorAll(".tabs button")) {
      button.classList.toggle("on", button.dataset.view === state.view);
      button.setAttribute("aria-selected", button.dataset.view === state.view);
    }
    for (const button of document.querySelectorAll(".modes button")) {
      button.classList.toggle("on", button.dataset.mode === state.mode);
    }
    for (const view of document.querySelectorAll(".view")) {
      view.classList.toggle("on", view.id === state.view + "-view");
    }
    $("group").value = state.group;
    $("example").value = state.example;
    $("scale").value = state.scale;
    fill($("layer"), g.layers, "L", state.layer);
    fill($("head"), g.heads, "H", state.head);
    if ($("overlay-layer").options.length !== g.layers) fill($("overlay-layer"), g.layers, "L", state.layer);
    if ($("overlay-head").options.length !== g.heads) fill($("overlay-head"), g.heads, "H", state.head);
    const annotate = $("annotate");
    annotate.replaceChildren(make("option", {value: ""}, "nothing"),
      ...g.columns.map((c) => make("option", {value: c.key}, c.label)));
    annotate.value = g.columns.some((c) => c.key === state.annotate) ? state.annotate : "";
    state.annotate = annotate.value;
  }

  function render() {
    renderControls();
    if (state.view === "model") renderModel();
    if (state.view === "head") renderFigure($("head-figure"), $("head-focus"));
    if (state.view === "overlay") {
      renderChips();
      renderFigure($("overlay-figure"), $("overlay-focus"));
    }
    if (state.view === "table") renderTable();
    document.body.dataset.view = state.view;
    saveHash();
  }

  // change the state (view, group, example, layer, head, mode, scale) and draw it again
  function select(change) {
    const previous = state.group;
    Object.assign(state, change);
    const g = group();
    if (state.group !== previous) {
      state.overlay = [];
      if (state.sort.key && !(state.sort.key in g.values)) state.sort = {key: "", dir: 1};
    }
    state.layer = Math.max(0, Math.min(g.layers - 1, state.layer));
    state.head = Math.max(0, Math.min(g.heads - 1, state.head));
    if (state.view === "overlay" && !state.overlay.length) addOverlay(state.layer, state.head);
    if (!("focus" in change)) state.focus = null;
    hideTooltip();
    render();
  }

  function setUp() {
    $("title").textContent = DATA.title;
    $("subtitle").textContent = DATA.subtitle;
    $("group").replaceChildren(...DATA.groups.map((g) =>
      make("option", {value: g.name}, `${g.title} (${g.layers} \u00d7 ${g.heads})`)));
    $("example").replaceChildren(...DATA.examples.map((e, i) => make("option", {value: i}, e.name)));
    $("example-label").hidden = DATA.examples.length < 2;
    for (const button of document.querySelectorAll(".tabs button")) {
      button.addEventListener("click", () => select({view: button.dataset.view}));
    }
    for (const button of document.querySelectorAll(".modes button")) {
      button.addEventListener("click", () => select({mode: button.dataset.mode}));
    }
    $("group").addEventListener("change", (e) => select({group: e.target.value}));
    $("example").addEventListener("change", (e) => select({example: +e.target.value}));
    $("scale").addEventListener("change", (e) => select({scale: e.target.value}));
    $("layer").addEventListener("change", (e) => select({layer: +e.target.value}));
    $("head").addEventListener("change", (e) => select({head: +e.target.value}));
    $("annotate").addEventListener("change", (e) => { state.annotate = e.target.value; render(); });
    $("overlay-add").addEventListener("click", () => {
      addOverlay(+$("overlay-layer").value, +$("overlay-head").value);
      render();
    });
    $("overlay-layer-all").addEventListener("click", () => {
      for (let h = 0; h < group().heads; h++) addOverlay(+$("overlay-layer").value, h);
      render();
    });
    $("overlay-clear").addEventListener("click", () => { state.overlay = []; render(); });
    for (const button of document.querySelectorAll("button.save")) {
      button.addEventListener("click", savePicture);
    }
    document.addEventListener("keydown", onKey);
    window.addEventListener("resize", () => { if (state.view === "model") renderModel(); });
  }

  function onKey(event) {
    if (["SELECT", "INPUT", "TEXTAREA"].includes(event.target.tagName)) return;
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    if (state.view !== "head" && state.view !== "overlay") return;
    const g = group();
    const step = {ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0]};
    if (event.key in step && state.view === "head") {
      const [dl, dh] = step[event.key];
      event.preventDefault();
      select({layer: (state.layer + dl + g.layers) % g.layers,
              head: (state.head + dh + g.heads) % g.heads});
    } else if (event.key === "m") {
      select({mode: state.mode === "lines" ? "matrix" : "lines"});
    } else if (event.key === "Escape") {
      setFocus(null);
    }
  }

  function savePicture() {
    const figure = $(state.view === "overlay" ? "overlay-figure" : "head-figure");
    const canvas = figure.querySelector("canvas.matrix") || figure.querySelector("canvas");
    if (!canvas) return;
    const heads = drawn().map((h) => `L${h.layer}H${h.head}`).join("-");
    const link = make("a", {href: canvas.toDataURL("image/png"),
                            download: `${state.group}_${heads}_${state.mode}.png`});
    link.click();
  }

  // what a test (or a person at the console) reads back: the weights as the page holds them
  window.attnjax = {
    data: DATA,
    state,
    select,
    weight: (name, example, layer, head, q, k) => weight(slot(example, name), layer, head, q, k),
    row: (name, example, layer, head, q) => row(slot(example, name), layer, head, q),
  };

  setUp();
  loadHash();
  render();
  document.body.dataset.ready = "true";
})();
