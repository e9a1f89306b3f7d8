"""The dashboard at ``/ui``: jobs (live progress, loss and AP curves, log tail, artefacts;
an AutoML search's trials: table, metric by trial, parameter against metric),
datasets (counts, label map, conversion warnings) and models (versions, try an image).

The pages are server-rendered shells that hold no data: ``static/dashboard/dashboard.js``
fetches everything from the JSON API, with the bearer token the user typed in when the
API requires one (kept in the tab's ``sessionStorage``, sent as ``Authorization: Bearer``
on every call). So the dashboard has exactly the API's auth: without a token the JSON calls
are refused (401) and the pages show a token form instead of data. Charts are drawn with
Chart.js, vendored under ``static/dashboard/chartjs/`` (see ``static/dashboard/SOURCES.txt``).

As with ``/docs``, every asset comes from this server and a Content-Security-Policy keeps
the browser on it: no inline script or style, no other host.
"""

from __future__ import annotations

from html import escape

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from maskops_api.docs_ui import STATIC_DIR, _root_path

UI_PATH = "/ui"
ASSETS_PATH = f"{UI_PATH}/assets"
CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # The uploaded image is shown from a blob: URL; Chart.js draws on canvases.
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)

_NAV = (
    ("jobs", "Jobs", ""),
    ("datasets", "Datasets", "/datasets"),
    ("models", "Models", "/models"),
)


def install_dashboard(app: FastAPI) -> None:
    """Add the ``/ui`` pages and their assets (none of them in the OpenAPI schema)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=STATIC_DIR / "dashboard"), name="ui-assets")

    async def jobs_page(request: Request) -> HTMLResponse:
        return _page(request, "jobs", "Jobs", _JOBS)

    async def job_page(request: Request) -> HTMLResponse:
        job_id = request.path_params["job_id"]
        return _page(request, "job", f"Job {job_id}", _JOB, job_id=str(job_id))

    async def datasets_page(request: Request) -> HTMLResponse:
        return _page(request, "datasets", "Datasets", _DATASETS)

    async def models_page(request: Request) -> HTMLResponse:
        return _page(request, "models", "Models", _MODELS)

    app.add_route(UI_PATH, jobs_page, include_in_schema=False)
    app.add_route(f"{UI_PATH}/", jobs_page, include_in_schema=False)
    app.add_route(f"{UI_PATH}/jobs/{{job_id:int}}", job_page, include_in_schema=False)
    app.add_route(f"{UI_PATH}/datasets", datasets_page, include_in_schema=False)
    app.add_route(f"{UI_PATH}/models", models_page, include_in_schema=False)


def _page(request: Request, page: str, title: str, main: str, job_id: str = "") -> HTMLResponse:
    root = _root_path(request)
    assets = root + ASSETS_PATH
    nav = "".join(
        f'<a href="{escape(root + UI_PATH + href)}"'
        f"{' class=current' if page == key or (key == 'jobs' and page == 'job') else ''}>"
        f"{label}</a>"
        for key, label, href in _NAV
    )
    html = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} - maskops</title>
<link rel="stylesheet" href="{escape(assets)}/dashboard.css">
<script src="{escape(assets)}/chartjs/chart.umd.min.js" defer></script>
<script src="{escape(assets)}/dashboard.js" defer></script>
</head>
<body data-page="{escape(page)}" data-root="{escape(root)}" data-job-id="{escape(job_id)}">
<header>
<a class="brand" href="{escape(root + UI_PATH)}">maskops</a>
<nav>{nav}<a href="{escape(root)}/docs">API docs</a></nav>
<span class="who"><span id="auth-state"></span>
<button type="button" id="sign-out" hidden>Forget token</button></span>
</header>
<form id="token-form" hidden>
<p>This server requires an API token (create one with <code>maskops token create</code>).
It is kept in this browser tab only and sent as <code>Authorization: Bearer</code>.</p>
<label>API token <input id="token-input" type="password" autocomplete="off" required></label>
<button type="submit">Use token</button>
<p id="token-error" class="error"></p>
</form>
<main id="content" hidden>
<h1>{escape(title)}</h1>
{main}
</main>
<p id="error" class="error"></p>
</body>
</html>
"""
    response = HTMLResponse(html)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


_JOBS = """<p class="controls"><label>Status <select id="status-filter">
<option value="">any</option><option>queued</option><option>running</option>
<option>cancelling</option><option>succeeded</option><option>failed</option>
<option>cancelled</option></select></label>
<span class="muted">refreshes every 2 s</span></p>
<table id="jobs"><thead><tr><th>Job</th><th>Action</th><th>Status</th><th>Progress</th>
<th>ETA</th><th>Latest loss</th><th>Created</th></tr></thead><tbody></tbody></table>
<p id="jobs-total" class="muted"></p>"""

_JOB = """<section id="job-summary"><dl id="job-fields"></dl>
<div class="bar"><div id="job-bar"></div></div><p id="job-error" class="error"></p></section>
<section class="charts">
<figure><figcaption>Loss</figcaption><div class="chart"><canvas id="loss-chart"></canvas></div>
</figure>
<figure><figcaption>AP</figcaption><div class="chart"><canvas id="ap-chart"></canvas></div>
<p id="ap-empty" class="muted">No AP yet (evaluations write it).</p></figure>
</section>
<section id="per-class" hidden><h2>Per-class AP <span id="per-class-step" class="muted">
</span></h2><table id="per-class-table"><thead><tr><th>Class</th><th>AP</th><th>mask AP</th>
</tr></thead><tbody></tbody></table></section>
<section id="automl" hidden><h2>AutoML trials <span id="automl-best" class="muted"></span></h2>
<section class="charts">
<figure><figcaption>Metric by trial</figcaption>
<div class="chart"><canvas id="trial-chart"></canvas></div></figure>
<figure><figcaption>Parameter vs metric <select id="param-select"></select></figcaption>
<div class="chart"><canvas id="param-chart"></canvas></div></figure>
</section>
<table id="trials"><thead><tr><th>Trial</th><th>State</th><th>Value</th><th>Parameters</th>
<th>Job</th></tr></thead><tbody></tbody></table></section>
<section><h2>Artefacts</h2><ul id="artifacts"></ul></section>
<section><h2>Log</h2><pre id="log"></pre></section>"""

_DATASETS = """<div id="datasets"></div><p id="datasets-total" class="muted"></p>"""

_MODELS = """<table id="models"><thead><tr><th>Model</th><th>Versions</th></tr></thead>
<tbody></tbody></table>
<section><h2>Try an image</h2>
<form id="try-form"><label>Model <select id="try-model" required></select></label>
<label>Image (JPEG or PNG) <input id="try-image" type="file" accept="image/jpeg,image/png"
required></label>
<label>Score threshold <input id="try-threshold" type="number" min="0" max="1" step="0.05"
value="0.3"></label>
<button type="submit">Run</button></form>
<p id="try-status" class="muted"></p>
<canvas id="try-canvas" width="0" height="0"></canvas>
<table id="try-results"><thead><tr><th>Category</th><th>Score</th><th>Box [x, y, w, h]</th>
</tr></thead><tbody></tbody></table></section>"""
