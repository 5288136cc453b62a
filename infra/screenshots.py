"""Re-take the README's MLflow and Prefect screenshots in a real (headless) browser, and re-print its
streaming-chat example.

Three subcommands, each run by the interpreter that has its one extra dependency:

    # 1. MLflow: starts `mlflow ui` (the README's lean flags) on AFM_HOME's store, opens it in Chromium and saves
    #    docs/images/mlflow-pipeline-runs.png (the `pipeline` runs with their nested stages) and
    #    docs/images/mlflow-compare-runs.png (the two newest pipeline runs compared).
    #    Needs the `playwright` package in any Python (not a project dependency: a throw-away venv will do) and a
    #    Chromium: `playwright install chromium`, or --chrome PATH to any Chromium/Chrome binary (where no browser
    #    download is reachable: the npm package @sparticuz/chromium carries one; `await chromium.executablePath()`
    #    in node unpacks it to /tmp/chromium).
    python infra/screenshots.py mlflow --afm-home /tmp/shots/home [--chrome /path/to/chromium]

    # 2. Chat: `afm serve` the model on 127.0.0.1, stream a chat completion and an agent answer with the official
    #    `openai` client (the README's snippets, same code) and print what they print; then stop the server.
    .venv/bin/python infra/screenshots.py chat --afm-home /tmp/shots/home [--model models:/afm-rl@champion]

    # 3. Prefect: a throw-away Prefect server (its own PREFECT_HOME under --afm-home), `afm deploy` on it and a
    #    worker polling the pool (so the deployments are Ready), then docs/images/prefect-deployments.png (the
    #    Deployments page). Same browser needs as mlflow.
    python infra/screenshots.py prefect --afm-home /tmp/shots/home [--chrome /path/to/chromium]

The store needs at least two runs of the `pipeline` experiment, e.g. two `afm pipeline` runs in a throw-away
AFM_HOME (`AFM_HOME=/tmp/shots/home .venv/bin/afm pipeline --config configs/default.yaml --set ...`). Every
server this starts listens on 127.0.0.1 and is stopped before it returns, on errors too.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
VIEWPORT = {"width": 1400, "height": 900}
# Chromium flags for a container without a GPU or a setuid sandbox (what headless Chromium needs to start as
# root in one; harmless elsewhere).
CHROME_ARGS = ["--no-sandbox", "--no-zygote", "--disable-gpu", "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Poll url until it answers 200; fail early if the server process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM the server's process group (mlflow ui forks uvicorn workers) and wait for it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def mlflow_api(base: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}/ajax-api/2.0/mlflow/{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def pipeline_runs(base: str) -> tuple[str, list[dict]]:
    """The `pipeline` experiment's id and its two newest finished runs (newest first)."""
    exp = mlflow_api(base, "experiments/get-by-name?experiment_name=pipeline")["experiment"]["experiment_id"]
    # The stages' runs are in the same experiment, nested: the parents are the ones tagged afm.stage=pipeline.
    query = "tags.`afm.stage` = 'pipeline' and attributes.status = 'FINISHED'"
    runs = mlflow_api(base, "runs/search", {"experiment_ids": [exp], "filter": query,
                                            "order_by": ["attributes.start_time DESC"], "max_results": 2})
    runs = runs.get("runs", [])
    if len(runs) < 2:
        raise SystemExit(f"the pipeline experiment has {len(runs)} finished run(s); two are needed to compare")
    return exp, runs


def shoot_mlflow(args: argparse.Namespace) -> None:
    from playwright.sync_api import sync_playwright

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    cmd = [str(VENV_BIN / "mlflow"), "ui", "--backend-store-uri", f"sqlite:///{args.afm_home / 'mlflow.db'}",
           "--workers", "1", "--host", "127.0.0.1", "--port", str(port)]
    # cwd AFM_HOME: mlflow ui's default artifact root (./mlartifacts) lands there, not in the repo.
    proc = subprocess.Popen(cmd, cwd=args.afm_home, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"{base}/health", proc, timeout_s=120)
        exp, runs = pipeline_runs(base)
        ids = [r["info"]["run_id"] for r in reversed(runs)]  # older first: left column = last night's
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chrome, args=CHROME_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{base}/#/experiments/{exp}/runs")
            toggles = page.locator("[role=gridcell][col-id='attributes.`Run Name`'] button")
            toggles.first.wait_for(timeout=60_000)
            tidy(page)
            page.wait_for_timeout(2000)  # the grid renders its rows in a second pass
            for i in range(toggles.count()):  # the +/- before a parent run: show its nested stages
                toggles.nth(i).click()
                page.wait_for_timeout(1000)  # the grid re-renders with the children before the next click
            save(page, args.out / "mlflow-pipeline-runs.png")
            # The compare page scrolls inside its own pane: a tall viewport shows all of it in one shot.
            page.set_viewport_size({"width": VIEWPORT["width"], "height": args.compare_height})
            page.goto(f"{base}/#/compare-runs?runs={json.dumps(ids)}&experiments={json.dumps([exp])}")
            page.get_by_text("Run details").first.wait_for(timeout=60_000)
            tidy(page)
            page.get_by_role("switch", name="Metrics - Show diff only").click()
            for section in ("Visualizations", "Parameters"):  # collapsed (the whole config is params): metrics
                page.get_by_text(section, exact=True).click()  # move up into the shot
            scroll_metrics_to(page, args.first_metric)
            save(page, args.out / "mlflow-compare-runs.png")
            browser.close()
    finally:
        stop(proc)


def shoot_prefect(args: argparse.Namespace) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(args.afm_home / "prefect"), PREFECT_API_URL=api,
               PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.Popen([str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"{api}/health", proc, timeout_s=300)  # a fresh PREFECT_HOME migrates its database first
        subprocess.run([str(VENV_BIN / "afm"), "deploy"], env=env, check=True)
        # A deployment is Ready only while a worker polls its pool.
        worker = subprocess.Popen([str(VENV_BIN / "prefect"), "worker", "start", "--pool", "afm-process"], env=env,
                                  start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready_deployments(api, timeout_s=180)
            shoot_deployments(args, port)
        finally:
            stop(worker)
    finally:
        stop(proc)


def wait_ready_deployments(api: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        req = urllib.request.Request(f"{api}/deployments/filter", data=b"{}",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            if all(d["status"] == "READY" for d in json.load(r)):
                return
        time.sleep(2)
    raise SystemExit(f"deployments not Ready {timeout_s:.0f} s after the worker started")


def shoot_deployments(args: argparse.Namespace, port: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chrome, args=CHROME_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"http://127.0.0.1:{port}/deployments")
        page.get_by_text("nightly-retrain").first.wait_for(timeout=60_000)
        save(page, args.out / "prefect-deployments.png")
        browser.close()


def scroll_metrics_to(page, name: str) -> None:
    """Wheel over the compare page's metric table, as a user does, until metric `name`'s row is in view (MLflow
    caps the table at 300 px, ~6 rows, and renders only visible rows). Not scrollTop: the names and the values
    are separate grids, kept aligned on wheel events only (setting scrollTop showed values against wrong names)."""
    grid = page.locator(".ReactVirtualized__Grid").first
    if not grid.count():
        print("no metric differs between the runs: nothing to scroll")
        return
    grid.hover()
    top = grid.bounding_box()["y"]
    for _ in range(80):
        link = grid.get_by_role("link", name=name, exact=True)
        if link.count() and link.bounding_box()["y"] - top < 45:  # 45 px: one row
            return
        page.mouse.wheel(0, 45)
        page.wait_for_timeout(150)
    print(f"metric {name!r} not in the compare table (identical in both runs?)")


def tidy(page) -> None:
    """Close the MLflow Assistant panel (it opens by default and takes a third of the width)."""
    close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
    if close.count():
        close.click()


def save(page, path: Path) -> None:
    page.mouse.move(0, 0)  # no hover highlight
    page.evaluate("document.activeElement?.blur()")  # ... and no focus ring on the last clicked control
    page.wait_for_timeout(1500)  # let charts and lazy cells settle
    page.screenshot(path=str(path))
    print(f"{path}: {path.stat().st_size / 1024:.0f} KiB")


def stream_chat(base_url: str, question: str) -> None:
    """The README's chat snippet, verbatim: one `|` after each streamed chunk's content."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none")
    stream = client.chat.completions.create(
        model="afm", messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0,
        stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if not chunk.choices:
            print("\n", chunk.usage)
        elif chunk.choices[0].finish_reason:
            print(f" [finish_reason={chunk.choices[0].finish_reason}]", end="")
        else:
            print(chunk.choices[0].delta.content, end="|", flush=True)


def stream_agent(base_url: str, question: str) -> None:
    """The README's agent snippet, verbatim."""
    from openai import OpenAI, Stream

    client = OpenAI(base_url=base_url, api_key="none")
    events = client.post("/agent", body={"question": question, "stream": True},
                         cast_to=object, stream=True, stream_cls=Stream[object])
    for event in events:
        if event["object"] == "agent.turn":
            for seg in event["segments"]:
                print(f"turn {event['turn']} <{seg['tag']}>", seg["text"][:90].replace("\n", " "))
        else:
            print(event["object"], event["status"], repr(event["answer"]), event["tools"], event["usage"])


def run_chat(args: argparse.Namespace) -> None:
    port = args.port or free_port()
    env = dict(os.environ, AFM_HOME=str(args.afm_home),
               MLFLOW_TRACKING_URI=f"sqlite:///{args.afm_home / 'mlflow.db'}")
    env.pop("RAY_ADDRESS", None)  # a Ray of its own: the stack's may already run Serve
    proc = subprocess.Popen([str(VENV_BIN / "afm"), "serve", args.model, "--port", str(port)], env=env,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", proc, timeout_s=300)
        base_url = f"http://127.0.0.1:{port}/v1"
        print("## chat")
        stream_chat(base_url, args.question)
        print("## agent")
        stream_agent(base_url, args.question)
    finally:
        stop(proc, timeout_s=120)
        print("## afm serve printed")
        print(proc.stdout.read().strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    shots = sub.add_parser("mlflow", help="screenshot the pipeline runs and their comparison")
    shots.add_argument("--afm-home", type=Path, required=True, help="AFM_HOME whose mlflow.db holds the runs")
    shots.add_argument("--chrome", default=None, help="Chromium binary (default: playwright's own)")
    shots.add_argument("--out", type=Path, default=REPO / "docs" / "images", help="where the PNGs go")
    shots.add_argument("--compare-height", type=int, default=900, help="viewport height of the compare shot (px)")
    shots.add_argument("--first-metric", default="rl.reward_first",
                       help="the compare shot's metric table starts at this metric (it shows ~6 rows)")
    prefect = sub.add_parser("prefect", help="screenshot the Prefect deployments page")
    prefect.add_argument("--afm-home", type=Path, required=True, help="the throw-away server's PREFECT_HOME goes here")
    prefect.add_argument("--chrome", default=None, help="Chromium binary (default: playwright's own)")
    prefect.add_argument("--out", type=Path, default=REPO / "docs" / "images", help="where the PNG goes")
    chat = sub.add_parser("chat", help="serve a model and print the README's streaming examples")
    chat.add_argument("--afm-home", type=Path, required=True, help="AFM_HOME whose mlflow.db holds the model")
    chat.add_argument("--model", default="models:/afm-rl@champion", help="what `afm serve` serves")
    chat.add_argument("--port", type=int, default=0, help="0: a free port")
    chat.add_argument("--question", default="What is the capital of Ludoria?", help="asked in both examples")
    args = parser.parse_args()
    args.afm_home = args.afm_home.resolve()
    {"mlflow": shoot_mlflow, "prefect": shoot_prefect, "chat": run_chat}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
