"""The `afm` command line: one subcommand per flow, plus the local stack, deployments, serving and lineage.
It sits above everything it drives (imports point down: cli -> flows -> tasks -> domain packages -> afm core);
the console script `afm` is `cli.app:app`, and `python -m cli` runs the same.

    afm pipeline [--config configs/default.yaml] [--set sft.lr=1e-3 ...]   # distill -> sft -> rl -> evaluate
    afm distill | sft | rl | eval  [--config FILE] [--set key=value ...]    # one stage
    afm stack up | status | down                                              # local S3 + MLflow + Prefect + Ray
    afm deploy                                                                # register Prefect deployments
    afm serve MODEL [--port 8000] [--engine auto|hf|vllm]                     # Ray Serve, OpenAI-compatible
    afm lineage MODEL                                                         # RL run -> SFT run -> dataset sha
    afm import-autocoa SRC OUT [--kind pairs|messages]                        # AutoCoA's released data -> ours

Each stage subcommand reads the YAML recipe (`--config`), applies `--set` overrides (dotted keys, YAML values)
and runs the Prefect flow in this process. A bad config exits 2 with the file and field named.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from afm.config import ConfigError, load_config

# The temporary Prefect server a CLI run starts must not try to phone home (there is no internet here, and
# the telemetry errors bury the real log).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# A fresh PREFECT_HOME makes that server run its migrations first, which takes 20-40 s on a busy 2-core
# machine; Prefect's 20 s default then fails the whole run with "Timed out ... ephemeral Prefect API server".
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

app = typer.Typer(add_completion=False, no_args_is_help=True, help="afm-platform: train agent foundation models.")
stack_app = typer.Typer(no_args_is_help=True, help="Local stack on 127.0.0.1: S3 (moto), MLflow, Prefect, Ray.")
app.add_typer(stack_app, name="stack")

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML recipe (see configs/).")
SetOpt = typer.Option(None, "--set", "-s", help="Override a field: dotted.key=value (repeatable).")


# Sections of a whole-pipeline recipe (flows.pipeline.PipelineConfig); a stage command ignores the others'.
PIPELINE_SECTIONS = ("distill", "policy", "sft", "rl", "eval", "recipe", "autocoa")


def _load(cls, config: Optional[Path], overrides: Optional[list[str]]):
    try:
        return load_config(cls, config, overrides or [], other_sections=PIPELINE_SECTIONS)
    except ConfigError as exc:
        typer.secho(f"config error:\n{exc}", fg="red", err=True)
        raise typer.Exit(2) from None


def _preflight(store_uri: str = "", paths: Optional[dict[str, str]] = None, trajectory_files: tuple[str, ...] = (),
               cfg=None) -> None:
    """Exit 1 within seconds when a configured server is down, a local input is missing or malformed, or the
    recipe `cfg` asks for more GPUs than there are, for vLLM where it does not import, or for a teacher/judge
    endpoint that does not answer: instead of failing minutes later inside a Ray worker (cli/preflight.py)."""
    from cli.preflight import check_cluster, check_endpoints, check_local_inputs

    problems = check_endpoints(store_uri) + check_local_inputs(paths or {}, trajectory_files)
    if cfg is not None:
        problems += check_cluster(cfg)
    if problems:
        typer.secho("preflight failed:\n" + "\n".join(f"  {p}" for p in problems), fg="red", err=True)
        raise typer.Exit(1)


def _print_json(data) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


@app.command()
def pipeline(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Run the whole pipeline: distill -> sft -> rl -> evaluate -> promote."""
    from flows.pipeline import PipelineConfig, pipeline_flow

    cfg = _load(PipelineConfig, config, set_)
    _preflight(cfg.store_uri, cfg=cfg)
    pipeline_flow(cfg)


@app.command()
def distill(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Teacher rollouts -> CoA trajectories -> progressive filtering -> versioned SFT dataset + RL problems."""
    from flows.distill import DistillFlowConfig, distill_flow

    cfg = _load(DistillFlowConfig, config, set_)
    _preflight(cfg.store_uri, cfg=cfg)
    _print_json(distill_flow(cfg))


@app.command()
def sft(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Supervised fine-tuning on Ray Train (observation tokens masked)."""
    from flows.sft import SFTFlowConfig, sft_flow

    cfg = _load(SFTFlowConfig, config, set_)
    # Only a trajectories file is read as trajectories: pairs and text records have their own row checks.
    _preflight(cfg.store_uri, {"sft.model_path": cfg.sft.model_path, "sft.dataset": cfg.sft.dataset},
               (cfg.sft.dataset,) if cfg.sft.data_format == "trajectories" else (), cfg=cfg)
    _print_json(sft_flow(cfg))


@app.command()
def rl(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Agentic RL (GRPO/DAPO) with real tools from an SFT model."""
    from flows.rl import RLFlowConfig, rl_flow

    cfg = _load(RLFlowConfig, config, set_)
    _preflight(cfg.store_uri, {"rl.policy": cfg.rl.policy, "dataset_uri": cfg.dataset_uri}, cfg=cfg)
    _print_json(rl_flow(cfg))


@app.command(name="eval")
def eval_(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Evaluate models and the teacher side by side; promote on improvement."""
    from flows.evaluate import EvalFlowConfig, evaluate_flow

    cfg = _load(EvalFlowConfig, config, set_)
    _preflight(cfg.store_uri, {f"eval.models.{label}": uri for label, uri in cfg.eval.models.items()}, cfg=cfg)
    result = evaluate_flow(cfg)
    typer.echo(result["table"])


@stack_app.command("up")
def stack_up() -> None:
    """Start the local servers (bound to 127.0.0.1) and write their env vars to .afm/stack/env.sh."""
    from afm.stack import StackConfig, stack_up as up

    env = up(StackConfig())
    _print_json(env)


@stack_app.command("status")
def stack_status() -> None:
    """Show which local servers are up."""
    from afm.stack import StackConfig, stack_status as status

    _print_json(status(StackConfig()))


@stack_app.command("down")
def stack_down() -> None:
    """Stop exactly the servers `afm stack up` started (by PID)."""
    from afm.stack import StackConfig, stack_down as down

    _print_json(down(StackConfig()))


@app.command()
def deploy(work_pool: str = typer.Option("afm-process", help="Prefect process work pool to create/use.")) -> None:
    """Register every flow as a Prefect deployment (and `nightly-retrain` on its cron) on the running server."""
    from flows.deployments import deployment_summary, register_deployments

    _preflight()
    typer.echo(deployment_summary(register_deployments(work_pool), work_pool, os.environ.get("PREFECT_API_URL", "")))


@app.command()
def serve(
    model: str = typer.Argument(..., help="Model path, s3:// URI or MLflow URI (models:/afm@champion)."),
    port: int = typer.Option(8000, help="HTTP port on 127.0.0.1; in use -> exit 1."),
    tools: Optional[str] = typer.Option(
        None, help="Tools of /v1/agent, comma-separated (web_search,crawl_page,code). Default: the toolbox "
                   "recorded with the model (RL records it), else code only."),
    corpus: Optional[Path] = typer.Option(
        None, help="Search corpus JSONL for web_search/crawl_page (a distill dataset's corpus.jsonl). Default: "
                   "the corpus recorded with the model."),
    engine: Optional[str] = typer.Option(
        None, help="auto | hf | vllm. vllm: vLLM's OpenAI server under the replica (vLLM server flags: --set "
                   "vllm.python=.vllm-venv/bin/python, vllm.max_model_len=..., see ServeConfig). Default: auto "
                   "(vllm on GPUs when vllm.python has vLLM, else hf)."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """Serve MODEL with Ray Serve until Ctrl-C / SIGTERM: /v1/chat/completions, /v1/models, /v1/agent."""
    from serving.app import ServeConfig, ServeError, run_server

    overrides = (set_ or []) + [f"model={model}", f"port={port}"]
    overrides += [f"toolbox.tools={json.dumps(tools.split(','))}"] if tools else []
    overrides += [f"corpus_path={corpus}"] if corpus else []
    overrides += [f"engine={engine}"] if engine else []
    cfg = _load(ServeConfig, config, overrides)
    _preflight(paths={"model": cfg.model, "corpus": str(cfg.corpus_path or "")})
    try:
        run_server(cfg)  # checks the port and the tools first, before Ray starts
    except ServeError as exc:
        typer.echo(f"afm serve: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def lineage(model: str = typer.Argument(..., help="MLflow model URI, e.g. models:/afm-rl/3 or models:/afm-rl@champion.")) -> None:
    """Print a model version's lineage: RL run -> SFT run -> dataset sha."""
    from afm.lineage import format_lineage, lineage as walk

    _preflight()
    typer.echo(format_lineage(walk(model)))


@app.command(name="import-autocoa")
def import_autocoa(
    source: Path = typer.Argument(..., help="AutoCoA's file: a JSON array (.json) or JSONL."),
    out: Path = typer.Argument(..., help="JSONL to write: pair records or trajectories (what the SFT trainer reads)."),
    kind: str = typer.Option("pairs", help="pairs: when-to-act pairs (sharegpt ranking: conversation, chosen, "
                                           "rejected) for SFT stage 1; messages: CoA/CoT message files (stages 2-3)."),
    limit: Optional[int] = typer.Option(None, help="Import only the first N rows."),
) -> None:
    """Convert AutoCoA's released training data into this platform's files (distill/autocoa_import.py)."""
    from distill.autocoa_import import import_autocoa_messages, import_autocoa_pairs
    from distill.autocoa_pairs import write_pairs
    from models.format import write_jsonl

    if kind not in ("pairs", "messages"):
        typer.echo(f"--kind must be 'pairs' or 'messages', not {kind!r}", err=True)
        raise typer.Exit(2)
    try:
        if kind == "pairs":
            n = write_pairs(out, import_autocoa_pairs(source, limit))
            train = "--set sft.data_format=pairs --set sft.objective=pairwise"
        else:
            n = write_jsonl(out, import_autocoa_messages(source, limit))
            train = ""
    except (OSError, ValueError) as exc:  # PairFormatError / TrajectoryError name the file and the row
        typer.echo(f"import-autocoa: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {n} {'pairs' if kind == 'pairs' else 'trajectories'} to {out}; train on them with: "
               f"afm sft --set sft.model_path=<policy> --set sft.dataset={out} {train}".rstrip())


def exit_on_sigterm(signum: int, _frame) -> None:
    """SIGTERM (`kill`, a scheduler's timeout, a supervisor) unwinds the run like an exception, exit status
    128 + 15: `finally` blocks and atexit handlers run, so MLflow runs end as failed and child servers stop,
    Prefect's temporary API server included (before, a killed `afm pipeline` left it running, orphaned). What is
    finished stays in the stage cache, so the same command resumes. It does NOT cover SIGKILL or a process stuck
    in native code that never returns to the interpreter."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    sys.exit(app())
