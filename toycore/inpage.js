// The book's in-page widgets: models built and trained by the page itself, with no kernel and
// nothing fetched. toycore.widgets.in_page puts this file, inline, after each widget's <div>;
// the first copy defines window.toycoreInPage, every copy mounts the widgets not yet mounted.
//
// Two widgets:
// - "relu": the ReLU output model y = ReLU(WᵀW x + b) of toycore.models.ToyModel, trained with
//   AdamW (torch's update, weight decay included) on sparse uniform data, drawn as it trains.
// - "rug": the Persian rug of toycore.theory.persian_rug, rows chosen by torch's own randperm
//   (Mersenne Twister, Fisher-Yates) from the same seed, so the page's rug is the notebook's.
//
// Arrays are row-major Float64Arrays: W is (hidden, features), W[h * n + i] = W_hi, and a batch
// x is (batch, features).
(function () {
  "use strict";
  if (window.toycoreInPage) {
    window.toycoreInPage.mountAll();
    return;
  }

  // ---- randomness: torch's CPU generator and toycore.seeding's streams ----

  // MT19937, seeded as torch.Generator.manual_seed seeds it (its low 32 bits).
  class MersenneTwister {
    constructor(seed) {
      const state = new Uint32Array(624);
      state[0] = Number(BigInt.asUintN(32, BigInt(seed)));
      for (let j = 1; j < 624; j++) {
        const previous = state[j - 1] ^ (state[j - 1] >>> 30);
        state[j] = Math.imul(1812433253, previous) + j;
      }
      this.state = state;
      this.index = 624;
    }

    // The next 32-bit output, as torch's generator->random() returns it.
    next() {
      const s = this.state;
      if (this.index >= 624) {
        for (let k = 0; k < 624; k++) {
          const y = (s[k] & 0x80000000) | (s[(k + 1) % 624] & 0x7fffffff);
          s[k] = s[(k + 397) % 624] ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
        }
        this.index = 0;
      }
      let y = s[this.index++];
      y ^= y >>> 11;
      y ^= (y << 7) & 0x9d2c5680;
      y ^= (y << 15) & 0xefc60000;
      y ^= y >>> 18;
      return y >>> 0;
    }

    // Uniform on [0, 1) with 53 random bits.
    uniform() {
      return ((this.next() >>> 5) * 67108864 + (this.next() >>> 6)) / 9007199254740992;
    }

    // Standard normal (Box-Muller; the page's own stream, not torch's randn).
    normal() {
      return Math.sqrt(-2 * Math.log(1 - this.uniform())) * Math.cos(2 * Math.PI * this.uniform());
    }
  }

  const CRC_TABLE = Array.from({ length: 256 }, (_, k) => {
    let c = k;
    for (let bit = 0; bit < 8; bit++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });

  function crc32(text) {
    let c = 0xffffffff;
    for (const byte of new TextEncoder().encode(text)) c = CRC_TABLE[(c ^ byte) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  }

  // toycore.seeding.generator(seed, purpose): one stream per (seed, purpose).
  function generator(seed, purpose) {
    const mixed = (BigInt(seed) * 1000003n + BigInt(crc32(purpose))) % (2n ** 63n - 1n);
    return new MersenneTwister(mixed);
  }

  // torch.randperm(n, generator=g) on the CPU.
  function randperm(n, g) {
    const order = Array.from({ length: n }, (_, i) => i);
    for (let i = 0; i < n - 1; i++) {
      const z = g.next() % (n - i);
      [order[i], order[i + z]] = [order[i + z], order[i]];
    }
    return order;
  }

  // ---- the ReLU output model ----

  // x_i = c_i u_i, c_i ~ Bernoulli(1 - S), u_i ~ U[0, 1]: one uniform r per entry, active when
  // r < 1 - S, and then r / (1 - S) is again uniform (toycore.data.SparseUniform's draw).
  function sparseBatch(g, batch, features, sparsity) {
    const density = 1 - sparsity;
    const x = new Float64Array(batch * features);
    for (let k = 0; k < x.length; k++) {
      const r = g.uniform();
      x[k] = r < density ? r / density : 0;
    }
    return x;
  }

  class ReluTrainer {
    // W: (hidden, features), b: (features), importance: (features); AdamW as torch's.
    constructor({ features, hidden, importance, W, b, lr, weightDecay = 0.01 }) {
      this.n = features;
      this.m = hidden;
      this.importance = Float64Array.from(importance);
      this.W = Float64Array.from(W);
      this.b = Float64Array.from(b);
      this.lr = lr;
      this.weightDecay = weightDecay;
      this.beta1 = 0.9;
      this.beta2 = 0.999;
      this.eps = 1e-8;
      this.t = 0;
      this.moments = [this.W, this.b].map((p) => [new Float64Array(p.length), new Float64Array(p.length)]);
    }

    // One AdamW step on batch x (batch, features); returns the loss before the step:
    // the mean over the batch of Σ_i I_i (x_i - y_i)^2.
    step(x) {
      const { n, m, W, b, importance } = this;
      const batch = x.length / n;
      const gradW = new Float64Array(W.length);
      const gradb = new Float64Array(n);
      const h = new Float64Array(m);
      const dpre = new Float64Array(n);
      const dh = new Float64Array(m);
      let loss = 0;
      for (let s = 0; s < batch; s++) {
        const xs = s * n;
        // h = W x: (hidden,)
        for (let k = 0; k < m; k++) {
          let sum = 0;
          for (let i = 0; i < n; i++) sum += W[k * n + i] * x[xs + i];
          h[k] = sum;
        }
        // pre = Wᵀ h + b, y = ReLU(pre): (features,); dpre = dL/dpre for this sample
        for (let i = 0; i < n; i++) {
          let pre = b[i];
          for (let k = 0; k < m; k++) pre += W[k * n + i] * h[k];
          const error = (pre > 0 ? pre : 0) - x[xs + i];
          loss += importance[i] * error * error;
          dpre[i] = pre > 0 ? (2 * importance[i] * error) / batch : 0;
          gradb[i] += dpre[i];
        }
        // dh = W dpre; dL/dW = h dpreᵀ + dh xᵀ (W is used twice: Wᵀ on the way out, W in)
        for (let k = 0; k < m; k++) {
          let sum = 0;
          for (let i = 0; i < n; i++) sum += W[k * n + i] * dpre[i];
          dh[k] = sum;
        }
        for (let k = 0; k < m; k++) {
          for (let i = 0; i < n; i++) gradW[k * n + i] += h[k] * dpre[i] + dh[k] * x[xs + i];
        }
      }
      this.adamw([gradW, gradb]);
      return loss / batch;
    }

    // torch.optim.AdamW: decoupled weight decay, then the bias-corrected Adam step.
    adamw(grads) {
      this.t += 1;
      const { lr, beta1, beta2, eps } = this;
      const correction1 = 1 - beta1 ** this.t;
      const root2 = Math.sqrt(1 - beta2 ** this.t);
      [this.W, this.b].forEach((param, p) => {
        const [first, second] = this.moments[p];
        const grad = grads[p];
        for (let k = 0; k < param.length; k++) {
          param[k] *= 1 - lr * this.weightDecay;
          first[k] = beta1 * first[k] + (1 - beta1) * grad[k];
          second[k] = beta2 * second[k] + (1 - beta2) * grad[k] * grad[k];
          param[k] -= ((lr / correction1) * first[k]) / (Math.sqrt(second[k]) / root2 + eps);
        }
      });
    }
  }

  // Xavier-normal W (std sqrt(2 / (n + m))), zero b, as ToyModel; I_i = decay^i.
  function initialRelu({ features, hidden, decay, seed, lr }) {
    const g = generator(seed, "init");
    const std = Math.sqrt(2 / (features + hidden));
    return new ReluTrainer({
      features,
      hidden,
      importance: Array.from({ length: features }, (_, i) => decay ** i),
      W: Array.from({ length: hidden * features }, () => g.normal() * std),
      b: new Float64Array(features),
      lr,
    });
  }

  // ---- the Persian rug ----

  function popcount(v) {
    let count = 0;
    for (; v; v &= v - 1) count++;
    return count;
  }

  // toycore.theory.persian_rug.persian_rug: W_in = H[rows] (hidden, features), the Sylvester
  // Hadamard rows H_rj = (-1)^popcount(r AND j); W_out = W_inᵀ / hidden; R = W_out W_in.
  function persianRug(features, hidden, seed) {
    const rows = randperm(features, generator(seed, "rug")).slice(0, hidden).sort((a, b) => a - b);
    const Win = new Float64Array(hidden * features);
    rows.forEach((row, k) => {
      for (let j = 0; j < features; j++) Win[k * features + j] = popcount(row & j) & 1 ? -1 : 1;
    });
    // R_ij = Σ_k W_out[i, k] W_in[k, j] = Σ_k W_in[k, i] W_in[k, j] / hidden: (features, features)
    const R = new Float64Array(features * features);
    for (let k = 0; k < hidden; k++) {
      const row = Win.subarray(k * features, (k + 1) * features);
      for (let i = 0; i < features; i++) {
        const scale = row[i] / hidden;
        for (let j = 0; j < features; j++) R[i * features + j] += scale * row[j];
      }
    }
    return { rows, Win, R };
  }

  // What the notebook's rug explorer prints: the distinct off-diagonal values (to 12 decimals)
  // and the mean over rows of Σ_{j≠i} R_ij², with its smallest and largest row.
  function rugProperties(R, features) {
    const distinct = new Set();
    const rowSums = new Float64Array(features);
    for (let i = 0; i < features; i++) {
      for (let j = 0; j < features; j++) {
        if (i === j) continue;
        const value = R[i * features + j];
        distinct.add((Math.round(value * 1e12) / 1e12 + 0).toString());
        rowSums[i] += value * value;
      }
    }
    const mean = rowSums.reduce((a, v) => a + v, 0) / features;
    return { distinct: distinct.size, rowSumMean: mean, rowSumMin: Math.min(...rowSums), rowSumMax: Math.max(...rowSums) };
  }

  // ---- drawing ----

  // Matplotlib's colour maps, by their anchor colours: RdBu_r (ColorBrewer's 11) and viridis.
  const RDBU_R = ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"];
  const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];

  function hexRgb(hex) {
    return [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16));
  }

  function colormap(anchors, t) {
    const position = Math.min(Math.max(t, 0), 1) * (anchors.length - 1);
    const k = Math.min(Math.floor(position), anchors.length - 2);
    const [a, b] = [hexRgb(anchors[k]), hexRgb(anchors[k + 1])];
    return a.map((v, c) => Math.round(v + (b[c] - v) * (position - k)));
  }

  function rgb(color) {
    return `rgb(${color.join(",")})`;
  }

  // A canvas of width x height CSS pixels with devicePixelRatio (at least 2) pixels per pixel.
  function canvas(width, height) {
    const element = document.createElement("canvas");
    const ratio = Math.max(2, window.devicePixelRatio || 1);
    element.width = width * ratio;
    element.height = height * ratio;
    element.style.width = `${width}px`;
    element.style.height = `${height}px`;
    element.style.maxWidth = "100%";
    const context = element.getContext("2d");
    context.scale(ratio, ratio);
    context.font = "11px sans-serif";
    return context;
  }

  // White under the drawing, so that the book's dark theme leaves it readable.
  function clear(context, title) {
    const { width, height } = context.canvas.style;
    context.fillStyle = "#fff";
    context.fillRect(0, 0, parseFloat(width), parseFloat(height));
    context.fillStyle = "#000";
    context.textAlign = "center";
    context.fillText(title, parseFloat(width) / 2, 13);
  }

  // values (rows, cols), NaN drawn blank, on RdBu_r from -limit to limit, in the box (x, y, w, h).
  function drawMatrix(context, values, rows, cols, limit, [x, y, w, h]) {
    const image = new ImageData(cols, rows);
    for (let k = 0; k < rows * cols; k++) {
      const value = values[k];
      const color = Number.isNaN(value) ? [255, 255, 255] : colormap(RDBU_R, (value / limit + 1) / 2);
      image.data.set([...color, 255], 4 * k);
    }
    const bitmap = document.createElement("canvas");
    bitmap.width = cols;
    bitmap.height = rows;
    bitmap.getContext("2d").putImageData(image, 0, 0);
    context.imageSmoothingEnabled = false;
    context.drawImage(bitmap, x, y, w, h);
  }

  // Each W_i as an arrow in the hidden plane, darker for more important features (as the
  // notebook's picture: viridis from 0 to 0.9 by feature index, least important drawn first).
  function drawArrows(context, trainer, title) {
    clear(context, title);
    const { n, W } = trainer;
    const [cx, cy, scale] = [107, 125, 100 / 1.3];
    context.strokeStyle = "#ccc";
    context.strokeRect(cx - 100, cy - 100, 200, 200);
    for (let i = n - 1; i >= 0; i--) {
      const color = rgb(colormap(VIRIDIS, (0.9 * i) / Math.max(n - 1, 1)));
      const [px, py] = [cx + scale * W[i], cy - scale * W[n + i]];
      context.strokeStyle = context.fillStyle = color;
      context.lineWidth = 2;
      context.beginPath();
      context.moveTo(cx, cy);
      context.lineTo(px, py);
      context.stroke();
      context.beginPath();
      context.arc(px, py, 3, 0, 2 * Math.PI);
      context.fill();
    }
  }

  // ‖W_i‖ per feature against the 0.5 threshold of "represented" (hidden > 2).
  // ‖W_i‖ for each feature i: (features,)
  function featureNorms({ n, m, W }) {
    return Array.from({ length: n }, (_, i) => Math.hypot(...Array.from({ length: m }, (_, k) => W[k * n + i])));
  }

  function drawNorms(context, trainer, title) {
    clear(context, title);
    const { n } = trainer;
    const norms = featureNorms(trainer);
    const top = Math.max(1.2, ...norms);
    const [x0, y0, w, h] = [25, 25, 180, 195];
    context.fillStyle = "#1f77b4";
    norms.forEach((norm, i) => context.fillRect(x0 + (i * w) / n + 1, y0 + h - (norm / top) * h, w / n - 2, (norm / top) * h));
    context.strokeStyle = "#000";
    context.setLineDash([4, 3]);
    context.beginPath();
    context.moveTo(x0, y0 + h - (0.5 / top) * h);
    context.lineTo(x0 + w, y0 + h - (0.5 / top) * h);
    context.stroke();
    context.setLineDash([]);
    context.fillStyle = "#000";
    context.fillText("feature i", x0 + w / 2, y0 + h + 14);
  }

  // WᵀW with b as an extra column after a blank one, from -1 to 1 (the notebook's right panel).
  function drawGram(context, trainer) {
    clear(context, "WᵀW and b");
    const { n, m, W, b } = trainer;
    const values = new Float64Array(n * (n + 2));
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        let dot = 0;
        for (let k = 0; k < m; k++) dot += W[k * n + i] * W[k * n + j];
        values[i * (n + 2) + j] = dot;
      }
      values[i * (n + 2) + n] = NaN;
      values[i * (n + 2) + n + 1] = b[i];
    }
    const cell = 195 / (n + 2);
    drawMatrix(context, values, n, n + 2, 1, [10, 25, cell * (n + 2), cell * n]);
    context.fillStyle = "#000";
    context.fillText("b", 10 + cell * (n + 1.5), 25 + cell * n + 12);
  }

  // The training loss against the step, on a log scale.
  function drawLoss(context, losses, steps) {
    clear(context, "training loss (log scale)");
    const [x0, y0, w, h] = [45, 25, 175, 190];
    context.strokeStyle = "#999";
    context.strokeRect(x0, y0, w, h);
    if (losses.length < 2) return;
    const logs = losses.map((v) => Math.log10(Math.max(v, 1e-12)));
    const [low, high] = [Math.min(...logs), Math.max(...logs)];
    const span = Math.max(high - low, 1e-6);
    context.strokeStyle = "#1f77b4";
    context.lineWidth = 1.5;
    context.beginPath();
    const stride = Math.max(1, Math.floor(losses.length / 400));
    for (let s = 0; s < losses.length; s += stride) {
      const [px, py] = [x0 + (s / steps) * w, y0 + h - ((logs[s] - low) / span) * h];
      s ? context.lineTo(px, py) : context.moveTo(px, py);
    }
    context.stroke();
    context.fillStyle = "#000";
    context.textAlign = "right";
    context.fillText((10 ** high).toPrecision(2), x0 - 3, y0 + 9);
    context.fillText((10 ** low).toPrecision(2), x0 - 3, y0 + h);
    context.textAlign = "center";
    context.fillText(`step (of ${steps})`, x0 + w / 2, y0 + h + 14);
  }

  // A histogram of values in 50 bins, counts on a log scale.
  function drawHistogram(context, values, title) {
    clear(context, title);
    const [x0, y0, w, h] = [35, 30, 250, 200];
    const [low, high] = [Math.min(...values), Math.max(...values)];
    const counts = new Array(50).fill(0);
    for (const v of values) counts[Math.min(49, Math.floor(((v - low) / (high - low || 1)) * 50))]++;
    const top = Math.log10(Math.max(...counts)) + 0.3;
    context.fillStyle = "#1f77b4";
    counts.forEach((count, k) => {
      if (count) {
        const bar = ((Math.log10(count) + 0.3) / top) * h;
        context.fillRect(x0 + (k * w) / 50, y0 + h - bar, w / 50, bar);
      }
    });
    context.strokeStyle = "#999";
    context.strokeRect(x0, y0, w, h);
    context.fillStyle = "#000";
    context.fillText("R_ij, i ≠ j", x0 + w / 2, y0 + h + 26);
    context.fillText(low.toPrecision(2), x0, y0 + h + 12);
    context.fillText(high.toPrecision(2), x0 + w, y0 + h + 12);
  }

  // ---- controls ----

  function slider(panel, label, { min, max, step, value }, onChange) {
    const box = document.createElement("label");
    box.className = "toycore-inpage-control";
    const input = Object.assign(document.createElement("input"), { type: "range", min, max, step, value });
    input.name = label;
    const shown = document.createElement("span");
    const show = () => (shown.textContent = ` ${input.value}`);
    input.addEventListener("input", show);
    if (onChange) input.addEventListener("change", onChange);
    show();
    box.append(`${label} `, input, shown);
    panel.append(box);
    return input;
  }

  const STYLE = `
    .toycore-inpage { margin: 0.5em 0 1em; }
    .toycore-inpage-controls > div { display: flex; flex-wrap: wrap; align-items: center; gap: 0.3em 1.2em; }
    .toycore-inpage-control { display: inline-flex; align-items: center; gap: 0.4em; margin: 0; }
    .toycore-inpage-control input[type="range"] { width: 7em; }
    .toycore-inpage-control span { min-width: 2.5em; font-variant-numeric: tabular-nums; }
    .toycore-inpage button { padding: 0.2em 1.2em; }
    .toycore-inpage-pictures { display: flex; flex-wrap: wrap; gap: 6px; margin: 0.5em 0; }
    .toycore-inpage-readout { font-size: 0.9em; }`;

  function layout(root, controls, pictures, readout) {
    if (!document.getElementById("toycore-inpage-style")) {
      const style = Object.assign(document.createElement("style"), { id: "toycore-inpage-style", textContent: STYLE });
      document.head.append(style);
    }
    const row = (className, children) => {
      const div = Object.assign(document.createElement("div"), { className });
      div.append(...children);
      return div;
    };
    readout.className = "toycore-inpage-readout";
    root.replaceChildren(
      row("toycore-inpage-controls", controls),
      row("toycore-inpage-pictures", pictures.map((context) => context.canvas)),
      readout,
    );
  }

  // The ReLU output model, trained in the page with the chapter's recipe (settings: lr, steps,
  // batch, and the controls' start values n, m, S, decay, seed).
  function mountRelu(root, settings) {
    const panel = document.createElement("div");
    const n = slider(panel, "n", { min: 2, max: 20, step: 1, value: settings.n });
    const m = slider(panel, "m", { min: 1, max: 5, step: 1, value: settings.m });
    const S = slider(panel, "S", { min: 0, max: 0.99, step: 0.01, value: settings.S });
    const decay = slider(panel, "decay", { min: 0.5, max: 1, step: 0.05, value: settings.decay });
    const seed = slider(panel, "seed", { min: 0, max: 20, step: 1, value: settings.seed });
    const button = Object.assign(document.createElement("button"), { textContent: "Train" });
    panel.append(button);
    const [left, middle, right] = [canvas(215, 240), canvas(215, 240), canvas(230, 240)];
    const readout = document.createElement("div");
    layout(root, [panel], [left, middle, right], readout);
    const widget = { state: "ready", steps: settings.steps };
    root.toycore = widget;

    function draw(trainer, losses) {
      const count = featureNorms(trainer).filter((norm) => norm > 0.5).length; // represented
      const title = `n=${trainer.n}, m=${trainer.m}, S=${widget.S}: ${count} represented`;
      (trainer.m === 2 ? drawArrows : drawNorms)(left, trainer, title);
      drawGram(middle, trainer);
      drawLoss(right, losses, settings.steps);
      return count;
    }

    function train() {
      const chosen = { features: +n.value, hidden: +m.value, decay: +decay.value, seed: +seed.value, lr: settings.lr };
      Object.assign(widget, { state: "training", S: +S.value, seconds: null });
      button.disabled = true;
      const trainer = initialRelu(chosen);
      const data = generator(chosen.seed, "data");
      const losses = [];
      const start = performance.now();
      let computing = 0;
      function chunk() {
        const begun = performance.now();
        while (losses.length < settings.steps && performance.now() - begun < 40) {
          losses.push(trainer.step(sparseBatch(data, settings.batch, chosen.features, widget.S)));
        }
        computing += performance.now() - begun;
        const count = draw(trainer, losses);
        const finished = losses.length >= settings.steps;
        readout.textContent =
          `step ${losses.length} of ${settings.steps} (AdamW, lr ${settings.lr}, batch ${settings.batch}), ` +
          `loss ${losses[losses.length - 1].toPrecision(3)}, ` +
          `${count} of ${chosen.features} features represented (‖W_i‖ > 0.5); ` +
          `${(computing / 1000).toFixed(2)} s of training` + (finished ? "" : " so far");
        if (!finished) return requestAnimationFrame(chunk);
        Object.assign(widget, {
          state: "done",
          W: Array.from(trainer.W),
          b: Array.from(trainer.b),
          losses,
          seconds: computing / 1000,
          wall: (performance.now() - start) / 1000,
        });
        button.disabled = false;
      }
      requestAnimationFrame(chunk);
    }

    button.addEventListener("click", train);
    widget.S = +S.value;
    const untrained = initialRelu({ features: +n.value, hidden: +m.value, decay: +decay.value, seed: +seed.value, lr: settings.lr });
    draw(untrained, []);
    readout.textContent = `untrained (seed ${seed.value}): press Train for ${settings.steps} AdamW steps, lr ${settings.lr}, batch ${settings.batch}`;
  }

  // The Persian rug for a chosen ns, ratio nd/ns and seed, rebuilt when a control changes.
  function mountRug(root, settings) {
    const panel = document.createElement("div");
    const box = document.createElement("label");
    box.className = "toycore-inpage-control";
    const features = document.createElement("select");
    features.name = "ns";
    for (const value of settings.features) features.append(new Option(value, value, false, value === settings.ns));
    box.append("ns ", features);
    panel.append(box);
    const ratio = slider(panel, "ratio", { min: 0.01, max: 1, step: 0.01, value: settings.ratio }, build);
    const seed = slider(panel, "seed", { min: 0, max: 20, step: 1, value: settings.seed }, build);
    features.addEventListener("change", build);
    const [left, right] = [canvas(290, 300), canvas(300, 300)];
    const readout = document.createElement("div");
    layout(root, [panel], [left, right], readout);
    const widget = {};
    root.toycore = widget;

    function build() {
      const ns = +features.value;
      const nd = Math.max(1, Math.floor(ns * +ratio.value)); // as int(ns * ratio) in Python
      const start = performance.now();
      const { rows, Win, R } = persianRug(ns, nd, +seed.value);
      const properties = rugProperties(R, ns);
      let limit = 0;
      for (const v of R) limit = Math.max(limit, Math.abs(v));
      clear(left, `R, ns = ${ns}, nd = ${nd}, seed ${seed.value}`);
      drawMatrix(left, R, ns, ns, limit, [20, 25, 260, 260]);
      const off = [];
      for (let i = 0; i < ns; i++) for (let j = 0; j < ns; j++) if (i !== j) off.push(R[i * ns + j]);
      const sum = properties.rowSumMean.toPrecision(3);
      drawHistogram(right, off, `${properties.distinct} distinct values; Σ_j≠i R_ij² = ${sum}`);
      readout.textContent =
        `nd = ${nd} Hadamard rows; ${properties.distinct} distinct off-diagonal values; ` +
        `Σ_j≠i R_ij² from ${properties.rowSumMin.toPrecision(6)} to ${properties.rowSumMax.toPrecision(6)} over rows ` +
        `(ns/nd − 1 = ${(ns / nd - 1).toPrecision(6)}); built in ${((performance.now() - start) / 1000).toFixed(2)} s`;
      Object.assign(widget, { state: "built", ns, nd, rows, Win: Array.from(Win), properties });
    }
    build();
  }

  const MOUNTS = { relu: mountRelu, rug: mountRug };

  function mountAll() {
    for (const root of document.querySelectorAll(".toycore-inpage:not([data-mounted])")) {
      root.dataset.mounted = "true";
      MOUNTS[root.dataset.kind](root, JSON.parse(root.dataset.settings));
    }
  }

  window.toycoreInPage = { MersenneTwister, generator, randperm, sparseBatch, ReluTrainer, initialRelu, persianRug, rugProperties, mountAll };
  mountAll();
})();
