/* maskops dashboard: every number on these pages comes from the JSON API, fetched with the
   bearer token kept in sessionStorage (when the server requires one). No build step. */
"use strict";

const MaskOps = (() => {
  const body = document.body;
  const ROOT = body.dataset.root || "";
  const TOKEN_KEY = "maskops.token";
  const $ = (id) => document.getElementById(id);

  class AuthError extends Error {}

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  async function api(path, options = {}) {
    const headers = new Headers(options.headers || {});
    if (token()) headers.set("Authorization", `Bearer ${token()}`);
    const response = await fetch(ROOT + path, { ...options, headers, cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      let detail = "";
      try {
        detail = (await response.json()).detail || "";
      } catch (_) {
        /* not JSON */
      }
      throw new AuthError(detail || `HTTP ${response.status}`);
    }
    if (!response.ok) {
      let detail = `HTTP ${response.status}`;
      try {
        detail = (await response.json()).detail || detail;
      } catch (_) {
        /* not JSON */
      }
      throw new Error(detail);
    }
    return response;
  }

  const getJson = async (path) => (await api(path)).json();

  /* ---- auth: the page shows data only once a call went through ---- */

  function askForToken(message) {
    $("content").hidden = true;
    $("token-form").hidden = false;
    $("token-error").textContent = token() ? message : "";
    $("auth-state").textContent = "";
    $("sign-out").hidden = !token();
    stopTimers();
  }

  function showContent() {
    $("token-form").hidden = true;
    $("content").hidden = false;
    $("auth-state").textContent = token() ? "token in use" : "";
    $("sign-out").hidden = !token();
  }

  const timers = [];
  function every(ms, fn) {
    timers.push(setInterval(fn, ms));
  }
  function stopTimers() {
    timers.splice(0).forEach(clearInterval);
  }

  function fail(error) {
    if (error instanceof AuthError) {
      askForToken(error.message);
    } else {
      $("error").textContent = String(error.message || error);
    }
  }

  /* ---- formatting ---- */

  function el(tag, props = {}, children = []) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of [].concat(children)) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
    const s = Math.round(seconds);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }

  const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
  const number = (v, digits = 4) => (typeof v === "number" ? +v.toFixed(digits) : v ?? "");

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return `${i ? n.toFixed(1) : n} ${units[i]}`;
  }

  function progressBar(fraction) {
    const bar = el("div", { class: "bar" });
    const fill = el("div");
    fill.style.width = `${Math.round((fraction || 0) * 100)}%`;
    bar.append(fill);
    return bar;
  }

  const statusBadge = (status) => el("span", { class: `status ${status}`, text: status });

  /* ---- jobs list ---- */

  async function jobsPage() {
    const filter = $("status-filter");
    async function refresh() {
      const query = filter.value ? `&status=${encodeURIComponent(filter.value)}` : "";
      const page = await getJson(`/jobs?limit=100${query}`);
      showContent();
      const rows = page.items.map((job) => {
        const p = job.progress || {};
        const steps = p.total ? `${p.step ?? 0}/${p.total}` : "";
        const loss = job.latest_metrics && job.latest_metrics["Total loss"];
        return el("tr", { "data-job-id": job.id }, [
          el("td", {}, el("a", { href: `${ROOT}/ui/jobs/${job.id}`, text: `#${job.id}` })),
          el("td", { text: job.action }),
          el("td", {}, statusBadge(job.status)),
          el("td", { class: "progress" }, [progressBar(p.fraction), el("span", { text: steps })]),
          el("td", { text: job.status === "running" ? duration(p.eta_seconds) : "" }),
          el("td", { text: number(loss) }),
          el("td", { text: when(job.created_at) }),
        ]);
      });
      $("jobs").tBodies[0].replaceChildren(...rows);
      $("jobs-total").textContent = `${page.items.length} of ${page.total} jobs`;
    }
    filter.addEventListener("change", () => refresh().catch(fail));
    await refresh();
    every(2000, () => refresh().catch(fail));
  }

  /* ---- one job ---- */

  const AP_KEYS = ["AP", "AP50", "AP75", "mask_AP", "mask_AP50", "mask_AP75"];
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
    "#17becf", "#bcbd22", "#7f7f7f"];

  function makeChart(canvas, yTitle, yRange = {}) {
    return new Chart(canvas, {
      type: "line",
      data: { datasets: [] },
      options: {
        animation: false,
        maintainAspectRatio: false,
        parsing: false,
        normalized: true,
        interaction: { mode: "nearest", intersect: false },
        scales: {
          x: { type: "linear", min: 0, title: { display: true, text: "step" } },
          y: { title: { display: true, text: yTitle }, beginAtZero: true, ...yRange },
        },
        elements: { point: { radius: 2 } },
      },
    });
  }

  /* Series ``keys`` of ``points`` ({step, values}) into ``chart``. Each metrics row is the
     run's latest value of every metric, so a value is drawn where it is new: where it
     changed, or (``isEval``, for evaluation results) at a step where an evaluation ran. */
  function plot(chart, points, keys, isEval) {
    const datasets = keys.map((key, i) => {
      const data = [];
      let previous;
      for (const p of points) {
        const value = p.values[key];
        if (typeof value !== "number") continue;
        const fresh = value !== previous || (isEval && isEval(p.step, key));
        previous = value;
        if (!fresh || (data.length && data[data.length - 1].x === p.step)) continue;
        // COCO writes -1 where a metric has no data (no object of that size or class).
        data.push({ x: p.step, y: value < 0 ? null : value });
      }
      const old = chart.data.datasets.find((d) => d.label === key);
      return Object.assign(old || {
        label: key,
        borderColor: COLORS[i % COLORS.length],
        backgroundColor: COLORS[i % COLORS.length],
        borderWidth: 1.5,
      }, { data });
    });
    chart.data.datasets = datasets;
    chart.update("none");
  }

  const ap = (v) => (typeof v === "number" && v < 0 ? "n/a" : number(v, 3));

  function perClass(points) {
    let latest = null;
    for (const p of points) {
      if (Object.keys(p.values).some((k) => /^(mask_)?AP\//.test(k))) latest = p;
    }
    if (!latest) return;
    const classes = new Map();
    for (const [key, value] of Object.entries(latest.values)) {
      const match = /^(AP|mask_AP)\/(.+)$/.exec(key);
      if (!match) continue;
      const row = classes.get(match[2]) || {};
      row[match[1]] = value;
      classes.set(match[2], row);
    }
    $("per-class").hidden = false;
    $("per-class-step").textContent = `at step ${latest.step}`;
    $("per-class-table").tBodies[0].replaceChildren(
      ...[...classes].map(([name, row]) =>
        el("tr", {}, [el("td", { text: name }), el("td", { text: ap(row.AP) }),
          el("td", { text: ap(row.mask_AP) })])),
    );
  }

  async function download(path, name) {
    const blob = await (await api(path)).blob();
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: name });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  async function jobPage() {
    const id = body.dataset.jobId;
    const lossChart = makeChart($("loss-chart"), "loss");
    const apChart = makeChart($("ap-chart"), "AP", { min: 0, suggestedMax: 1 });
    let evalEvery = null; // the experiment's num_steps_per_eval, once known
    let totalSteps = null;
    let points = [];
    let logOffset = 0;
    let finished = false;
    let artifactsSeen = "";
    const MAX_LOG_CHARS = 200000;
    const decoder = new TextDecoder();

    async function summary() {
      const job = await getJson(`/jobs/${id}`);
      showContent();
      const p = job.progress || {};
      const fields = [
        ["Action", job.action], ["Status", statusBadge(job.status)],
        ["Progress", p.total ? `${p.step ?? 0} / ${p.total} steps` : ""],
        ["ETA", job.status === "running" ? duration(p.eta_seconds) : ""],
        ["Experiment", job.experiment_id ? `#${job.experiment_id} v${job.experiment_version}` : ""],
        ["Dataset", job.dataset_id ? `#${job.dataset_id}` : ""],
        ["Parent job", job.parent_job_id
          ? el("a", { href: `${ROOT}/ui/jobs/${job.parent_job_id}`, text: `#${job.parent_job_id}` })
          : ""],
        ["Attempts", job.attempts], ["Worker", job.worker_id || ""],
        ["Created", when(job.created_at)], ["Started", when(job.started_at)],
        ["Finished", when(job.finished_at)],
      ];
      $("job-fields").replaceChildren(...fields.filter(([, v]) => v !== "" && v !== null)
        .flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)]));
      $("job-fields").dataset.status = job.status;
      $("job-bar").style.width = `${Math.round((p.fraction || 0) * 100)}%`;
      $("job-error").textContent = job.error || "";
      finished = ["succeeded", "failed", "cancelled"].includes(job.status);
      totalSteps = p.total ?? null;
      if (evalEvery === null && job.experiment_id) {
        const query = job.experiment_version ? `?version=${job.experiment_version}` : "";
        try {
          const experiment = await getJson(`/experiments/${job.experiment_id}${query}`);
          evalEvery = Number(experiment.spec.num_steps_per_eval) || 0;
        } catch (error) {
          if (error instanceof AuthError) throw error;
          evalEvery = 0; // no experiment to read: only the last step is known to evaluate
        }
      }
      return job;
    }

    async function metrics() {
      // Rows of the last step seen are fetched again: an evaluation can add a row at a step
      // whose losses already came (since_step returns steps after it).
      const last = points.length ? points[points.length - 1].step : 0;
      const fresh = await getJson(`/jobs/${id}/metrics?since_step=${last - 1}`);
      points = points.filter((p) => p.step < last).concat(fresh);
      const keys = new Set(points.flatMap((p) => Object.keys(p.values)));
      // Evaluations run every num_steps_per_eval steps and at the last step.
      const isEval = evalEvery === null ? null
        : (step) => step === totalSteps || (evalEvery > 0 && step % evalEvery === 0);
      const losses = [...keys].filter((k) => /loss/i.test(k) && (!k.includes("/")
        || k.startsWith("val/"))).sort((a, b) => (a === "Total loss" ? -1 : b === "Total loss"
        ? 1 : a.localeCompare(b)));
      plot(lossChart, points, losses, isEval && ((step, key) => key.startsWith("val/")
        && isEval(step)));
      const apKeys = AP_KEYS.filter((k) => keys.has(k));
      plot(apChart, points, apKeys, isEval);
      $("ap-empty").hidden = apKeys.length > 0;
      $("loss-chart").dataset.points = String(
        lossChart.data.datasets.reduce((n, d) => Math.max(n, d.data.length), 0));
      perClass(points);
    }

    async function logs() {
      const buffer = await (await api(`/jobs/${id}/logs?offset=${logOffset}`)).arrayBuffer();
      if (!buffer.byteLength) return;
      logOffset += buffer.byteLength;
      const pre = $("log");
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      let text = pre.textContent + decoder.decode(buffer);
      if (text.length > MAX_LOG_CHARS) text = text.slice(-MAX_LOG_CHARS);
      pre.textContent = text;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }

    async function artifacts() {
      const files = await getJson(`/jobs/${id}/artifacts`);
      const signature = JSON.stringify(files);
      if (signature === artifactsSeen) return;
      artifactsSeen = signature;
      $("artifacts").replaceChildren(...files.map((f) => {
        const path = `/jobs/${id}/artifacts/${f.path.split("/").map(encodeURIComponent).join("/")}`;
        const link = el("a", { href: ROOT + path, text: f.path });
        link.addEventListener("click", (event) => {
          event.preventDefault();
          download(path, f.path.split("/").pop()).catch(fail);
        });
        return el("li", {}, [link, el("span", { class: "muted", text: ` ${bytes(f.size)}` })]);
      }));
    }

    let search = null; // the AutoML view, for a search job

    async function tick() {
      const wasFinished = finished;
      const job = await summary();
      if (job.action === "automl") {
        // A search trains nothing itself: its trials' curves are on their own pages.
        document.querySelector("main > section.charts").style.display = "none";
        search = search || automlView();
        await search.refresh();
      }
      await Promise.all([metrics(), logs(), artifacts()]);
      if (wasFinished) stopTimers(); // one last round after the job ended, then stop
    }
    await tick();
    every(2000, () => tick().catch(fail));
  }

  /* ---- AutoML: a search's trials ---- */

  function makeScatter(canvas, xTitle, yTitle) {
    return new Chart(canvas, {
      type: "scatter",
      data: { datasets: [] },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {
          x: { type: "linear", title: { display: true, text: xTitle } },
          y: { title: { display: true, text: yTitle } },
        },
      },
    });
  }

  const TRIAL_STATES = ["complete", "pruned", "fail", "running"];

  /* A trial's figure: its final value, else (pruned) the metric at its last evaluation. */
  function trialValue(trial) {
    if (typeof trial.value === "number") return trial.value;
    const steps = Object.keys(trial.intermediate).map(Number).sort((a, b) => a - b);
    return steps.length ? trial.intermediate[String(steps[steps.length - 1])] : null;
  }

  function scatter(chart, trials, x) {
    chart.data.datasets = TRIAL_STATES.map((state, i) => ({
      label: state,
      backgroundColor: COLORS[i],
      borderColor: COLORS[i],
      data: trials.filter((t) => t.state === state && trialValue(t) !== null
        && typeof x(t) === "number").map((t) => ({ x: x(t), y: trialValue(t) })),
    })).filter((d) => d.data.length);
    chart.update("none");
  }

  function automlView() {
    const id = body.dataset.jobId;
    let trialChart = null;
    let paramChart = null;
    const select = $("param-select");
    let latest = [];
    select.addEventListener("change", () => paramChart && draw());

    function draw() {
      const param = select.value;
      paramChart.options.scales.x.title.text = param;
      scatter(trialChart, latest, (t) => t.number);
      scatter(paramChart, latest, (t) => t.params[param]);
    }

    async function refresh() {
      const view = await getJson(`/automl/${id}`);
      $("automl").hidden = false;
      if (!trialChart) {
        trialChart = makeScatter($("trial-chart"), "trial", view.metric || "metric");
        trialChart.options.scales.x.ticks = { precision: 0 };
        paramChart = makeScatter($("param-chart"), "parameter", view.metric || "metric");
      }
      latest = view.trials;
      const params = [...new Set(latest.flatMap((t) => Object.keys(t.params)))].sort();
      if (params.join() !== [...select.options].map((o) => o.value).join()) {
        const chosen = select.value;
        select.replaceChildren(...params.map((p) => el("option", { text: p, value: p })));
        if (params.includes(chosen)) select.value = chosen;
      }
      $("automl-best").textContent = view.best
        ? `best: trial ${view.best.number}, ${view.metric} ${number(view.best.value, 4)}` : "";
      $("trials").querySelector("tbody").replaceChildren(...latest.map((t) => el("tr", {}, [
        el("td", { text: String(t.number) }),
        el("td", {}, statusBadge(t.state)),
        el("td", { text: trialValue(t) === null ? "" : number(trialValue(t), 4) }),
        el("td", { text: Object.entries(t.params).map(([k, v]) => `${k}=${v}`).join(", ") }),
        el("td", {}, t.job_id
          ? el("a", { href: `${ROOT}/ui/jobs/${t.job_id}`, text: `#${t.job_id}` }) : ""),
      ])));
      $("trials").dataset.rows = String(latest.length);
      draw();
    }
    return { refresh };
  }

  /* ---- datasets ---- */

  function keyValues(object) {
    return el("dl", { class: "inline" }, Object.entries(object || {}).flatMap(([k, v]) => [
      el("dt", { text: k }),
      el("dd", { text: typeof v === "object" ? JSON.stringify(v) : v }),
    ]));
  }

  async function datasetsPage() {
    const page = await getJson("/datasets?limit=200");
    showContent();
    const cards = page.items.map((d) => {
      const names = new Map((d.label_map || []).map((c) => [String(c.id), c.name]));
      const counts = Object.entries(d.counts || {}).map(([split, c]) => {
        const perCategory = Object.entries(c.per_category || {})
          .map(([cid, n]) => `${names.get(cid) || cid}: ${n}`).join(", ");
        return el("tr", {}, [
          el("td", { text: split }), el("td", { text: c.images ?? "" }),
          el("td", { text: c.annotations ?? "" }), el("td", { text: c.crowd ?? "" }),
          el("td", { text: c.skipped_images ?? "" }),
          el("td", { text: c.dropped_annotations ?? "" }), el("td", { text: c.shards ?? "" }),
          el("td", { text: perCategory }),
        ]);
      });
      const head = el("tr", {}, ["Split", "Images", "Annotations", "Crowd", "Skipped images",
        "Dropped annotations", "Shards", "Per category"].map((h) => el("th", { text: h })));
      const labels = (d.label_map || []).map((c) => el("li", { text: `${c.id}: ${c.name}` }));
      const warnings = (d.warnings || []).map((w) => {
        const details = el("details", {}, [
          el("summary", { text: `${w.split}: ${Object.entries(w.counts || {})
            .map(([k, n]) => `${k} ${n}`).join(", ") || "none"}` }),
          el("p", { class: "muted", text: w.file ? `full list: ${w.file}` : "" }),
          keyValues(w.images),
        ]);
        return details;
      });
      const convert = d.convert_job_id
        ? el("a", { href: `${ROOT}/ui/jobs/${d.convert_job_id}`, text: `job #${d.convert_job_id}` })
        : "";
      return el("article", { class: "dataset", "data-dataset-id": d.id }, [
        el("h2", {}, [`#${d.id} ${d.name} `, statusBadge(d.status), " ", convert]),
        el("p", { class: "muted", text: Object.entries(d.splits || {})
          .map(([s, p]) => `${s}: ${p.image_dir}, ${p.annotation_file}`).join(" · ") }),
        counts.length ? el("table", { class: "counts" }, [el("thead", {}, head),
          el("tbody", {}, counts)]) : el("p", { class: "muted", text: "not converted yet" }),
        labels.length ? el("div", {}, [el("h3", { text: "Label map" }),
          el("ul", { class: "labels" }, labels)]) : "",
        warnings.length ? el("div", {}, [el("h3", { text: "Conversion warnings" }),
          ...warnings]) : "",
      ]);
    });
    $("datasets").replaceChildren(...cards);
    $("datasets-total").textContent = `${page.items.length} of ${page.total} datasets`;
    // Again while a conversion is under way (not otherwise: it would fold open warnings).
    if (page.items.some((d) => ["queued", "running", "cancelling"].includes(d.status))) {
      timers.push(setTimeout(() => datasetsPage().catch(fail), 3000));
    }
  }

  /* ---- models and try an image ---- */

  /* COCO compressed RLE (pycocotools' rleFrString) to run lengths. */
  function rleCounts(counts) {
    if (Array.isArray(counts)) return counts;
    const out = [];
    let p = 0;
    while (p < counts.length) {
      let x = 0;
      let k = 0;
      let more = 1;
      while (more) {
        const c = counts.charCodeAt(p) - 48;
        x |= (c & 0x1f) << (5 * k);
        more = c & 0x20;
        p += 1;
        k += 1;
        if (!more && c & 0x10) x |= -1 << (5 * k);
      }
      if (out.length > 2) x += out[out.length - 2];
      out.push(x);
    }
    return out;
  }

  /* {size: [h, w], counts} to a row-major Uint8Array of h * w (COCO masks run by column). */
  function decodeRle(rle) {
    const [h, w] = rle.size;
    const mask = new Uint8Array(h * w);
    let index = 0;
    let value = 0;
    for (const run of rleCounts(rle.counts)) {
      if (value) {
        for (let i = index; i < index + run && i < h * w; i += 1) {
          mask[(i % h) * w + Math.floor(i / h)] = 1;
        }
      }
      index += run;
      value = 1 - value;
    }
    return mask;
  }

  function colorOf(categoryId) {
    const hex = COLORS[(categoryId * 7) % COLORS.length];
    return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  }

  /* The image with the masks (translucent), boxes and category names of ``results``; small
     images are scaled up by a whole factor (pixels stay sharp) so that labels stay readable. */
  function drawDetections(canvas, image, results) {
    const width = image.naturalWidth || image.width;
    const height = image.naturalHeight || image.height;
    const scale = Math.max(1, Math.floor(640 / Math.max(width, height)));
    canvas.width = width * scale;
    canvas.height = height * scale;
    canvas.dataset.scale = String(scale);
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
    // Masks are painted at the image's own size and laid over it, half transparent.
    const overlay = document.createElement("canvas");
    overlay.width = width;
    overlay.height = height;
    const octx = overlay.getContext("2d");
    const pixels = octx.createImageData(width, height);
    for (const r of results) {
      if (!r.segmentation || !r.segmentation.size) continue;
      const [h, w] = r.segmentation.size;
      if (h !== height || w !== width) continue;
      const mask = decodeRle(r.segmentation);
      const [red, green, blue] = colorOf(r.category_id);
      for (let i = 0; i < mask.length; i += 1) {
        if (!mask[i]) continue;
        pixels.data.set([red, green, blue, 255], i * 4);
      }
    }
    octx.putImageData(pixels, 0, 0);
    ctx.globalAlpha = 0.5;
    ctx.drawImage(overlay, 0, 0, canvas.width, canvas.height);
    ctx.globalAlpha = 1;
    const font = 13;
    ctx.font = `${font}px sans-serif`;
    ctx.textBaseline = "top";
    ctx.lineWidth = 2;
    for (const r of results) {
      const [x, y, bw, bh] = r.bbox.map((v) => v * scale);
      const color = `rgb(${colorOf(r.category_id).join(",")})`;
      ctx.strokeStyle = color;
      ctx.strokeRect(x, y, bw, bh);
      const label = `${r.category_name || r.category_id} ${r.score.toFixed(2)}`;
      const textWidth = ctx.measureText(label).width + 6;
      const top = y >= font + 4 ? y - font - 4 : y;
      ctx.fillStyle = color;
      ctx.fillRect(x - 1, top, textWidth, font + 4);
      ctx.fillStyle = "#fff";
      ctx.fillText(label, x + 2, top + 2);
    }
    canvas.dataset.detections = String(results.length);
  }

  function showResults(results) {
    $("try-results").tBodies[0].replaceChildren(...results.map((r) => el("tr", {}, [
      el("td", { text: r.category_name || r.category_id }), el("td", { text: number(r.score, 3) }),
      el("td", { text: `[${r.bbox.map((v) => number(v, 1)).join(", ")}]` }),
    ])));
  }

  function loadImage(file) {
    return new Promise((resolve, reject) => {
      const image = new Image();
      image.onload = () => resolve(image);
      image.onerror = () => reject(new Error("the browser cannot show this image"));
      image.src = URL.createObjectURL(file);
    });
  }

  async function modelsPage() {
    const versions = await getJson("/models");
    showContent();
    const byName = new Map();
    for (const v of versions) byName.set(v.name, [...(byName.get(v.name) || []), v]);
    $("models").tBodies[0].replaceChildren(...[...byName].map(([name, list]) =>
      el("tr", { "data-model": name }, [el("td", { text: name }), el("td", {}, el("ul", {},
        list.map((v) => el("li", {}, [
          `v${v.version} `, statusBadge(v.published ? "published" : "unpublished"),
          " from ", el("a", { href: `${ROOT}/ui/jobs/${v.job_id}`, text: `job #${v.job_id}` }),
          el("span", { class: "muted", text: ` ${when(v.created_at)}` }),
        ]))))])));
    const served = [...byName].filter(([, list]) => list.some((v) => v.published));
    $("try-model").replaceChildren(...served.map(([name]) => el("option", { text: name })));
    if (!served.length) $("try-status").textContent = "No model is published yet.";

    $("try-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const file = $("try-image").files[0];
      if (!file) return;
      $("try-status").textContent = "Running…";
      try {
        const form = new FormData();
        form.append("images", file, file.name);
        const query = new URLSearchParams({ model: $("try-model").value,
          score_threshold: $("try-threshold").value || "0" });
        const [image, results] = await Promise.all([loadImage(file),
          api(`/infer?${query}`, { method: "POST", body: form }).then((r) => r.json())]);
        drawDetections($("try-canvas"), image, results);
        showResults(results);
        $("try-status").textContent = `${results.length} detections`;
      } catch (error) {
        if (error instanceof AuthError) fail(error);
        else $("try-status").textContent = `Failed: ${error.message}`;
      }
    });
  }

  /* ---- start ---- */

  const PAGES = { jobs: jobsPage, job: jobPage, datasets: datasetsPage, models: modelsPage };

  function start() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token-input").value.trim());
      window.location.reload();
    });
    $("sign-out").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      window.location.reload();
    });
    (PAGES[body.dataset.page] || (async () => {}))().catch(fail);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();

  return { decodeRle, rleCounts, drawDetections, showResults };
})();
