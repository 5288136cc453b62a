"""AutoCoA's training and held-out data (issue #23) from a distill stage's dataset directory.

Input (`dataset_dir`, what distill/pipeline.py and tasks/distill.py write): `train.jsonl` (the filtered teacher
CoA trajectories), `problems.jsonl` (their problems, with the world solution every pair needs; the distill work
dir always has it, a dataset artifact must carry it) and, optional, `eval_heldout.jsonl` (held-out-world eval
problems).

Held-out split: `heldout_fraction` of the generated problems (world multi-hop and computation: those with a
solution) that have a training trajectory are held out (seeded, by problem id). Nothing of theirs is trained on by any AutoCoA or ReAct stage; their trajectories give the
when-to-act and world-model metrics. Other problems of the same world may still search the same entity (a
world is small): the world-model examples record that as `seen_call`.

Output (`out_dir`):
- `pairs.jsonl` (SFT stage 1, `data_format: pairs`): the when-to-act pairs of the training trajectories
  (`trajectory_pairs` + `facts_given_pair`, distill/autocoa_pairs.py), at most `max_pairs_per_trajectory` each;
  a computation problem gives none (no distractor to hallucinate, no looked-up fact to give: it always needs
  its code);
- `pairs_heldout.jsonl`: the same for the held-out problems' trajectories, all of them (no problem shared);
- `coa_cot.jsonl` (SFT stages 2 and 3, trajectory JSONL as train.jsonl): the training CoA trajectories and
  `cot_per_coa` CoT-only trajectories per CoA one (`cot_trajectory(facts_given_problem(p))` of training-side
  multi-hop problems, trajectory or not), shuffled together;
- `react.jsonl` (the ReAct baseline): distill/react.py's form of the same training CoA trajectories;
- `observations_heldout.jsonl`: world-model examples of the held-out trajectories (evaluation/world_model.py;
  search, crawl and, for computations, code calls);
- `eval_facts_given.jsonl`: the facts-given variant of every world problem of `eval_heldout.jsonl` (problem
  JSONL, split "heldout"): evaluated next to it, the abstained-when-not rate (evaluation/when_to_act.py);
- `autocoa_data.json`: the config, the counts and the held-out problem ids.

Deterministic for a seed. A bad line names file:line.

Usage:
    counts = write_autocoa_data(Path("runs/distill"), Path("runs/autocoa-data"), AutoCoADataConfig())
    python -m distill.autocoa_data --dataset runs/distill --out runs/autocoa-data [key=value ...]
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Iterator

from pydantic import Field

from afm.config import Config, load_config
from distill.autocoa_pairs import (
    PairRecord, cot_trajectory, facts_given_pair, facts_given_problem, given_facts, trajectory_pairs, write_pairs,
)
from distill.react import react_trajectory
from evaluation.world_model import observation_examples, training_calls, write_observation_examples
from models.format import Trajectory, TrajectoryError, validate_trajectory, write_jsonl
from problems.records import Problem, read_problems, write_problems


class AutoCoADataConfig(Config):
    """How AutoCoA's data is cut from a distilled dataset (AutoCoA: ~1.5k pairs, ~5k CoA + ~1k CoT)."""

    cot_per_coa: float = Field(0.2, ge=0.0, description="CoT-only trajectories per training CoA trajectory in "
                                                        "coa_cot.jsonl (AutoCoA: ~1k CoT for ~5k CoA); capped by "
                                                        "the training-side multi-hop problems available.")
    max_pairs_per_trajectory: int = Field(3, ge=0, description="Most training pairs from one trajectory (0 = all); "
                                                               "a capped trajectory keeps one pair of each case "
                                                               "first, then a seeded choice.")
    facts_given_pairs: bool = Field(True, description="Also make the info_present pair on each problem's "
                                                      "facts-given variant (chosen: the CoT answer).")
    heldout_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="Share of the generated problems with a training "
                                                                     "trajectory held out for the when-to-act and "
                                                                     "world-model metrics (never trained on).")
    seed: int = Field(0, description="Seeds the held-out split, the pair cap, the CoT choice and the mixing order.")


def _trajectories(path: Path) -> Iterator[tuple[int, Trajectory]]:
    """(line number, valid trajectory) of a trajectory JSONL; anything else raises naming file:line."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                traj = Trajectory.from_dict(json.loads(line))
                validate_trajectory(traj)
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError, TrajectoryError) as exc:
                raise TrajectoryError(f"{path}:{lineno}: not a valid trajectory record: {exc}") from exc
            yield lineno, traj


def _runs(train_path: Path, problems_path: Path) -> list[tuple[Trajectory, Problem | None]]:
    """(trajectory, its generated problem, or None for a problem without a solution, e.g. an imported one)."""
    problems = {p.id: p for p in read_problems(problems_path)}
    runs = []
    for lineno, traj in _trajectories(train_path):
        pid = traj.metadata.get("problem_id")
        if pid not in problems:
            raise ValueError(f"{train_path}:{lineno}: trajectory {traj.id!r}: problem_id {pid!r} is not in {problems_path}")
        problem = problems[pid]
        runs.append((traj, problem if "solution" in problem.metadata else None))
    return runs


def _capped(pairs: list[PairRecord], cap: int, rng: random.Random) -> list[PairRecord]:
    """At most `cap` pairs: one of each case first (acting and answering both taught), then a seeded choice."""
    if not cap or len(pairs) <= cap:
        return pairs
    order = rng.sample(pairs, len(pairs))
    first = [next(p for p in order if p.case == case) for case in dict.fromkeys(p.case for p in order)][:cap]
    chosen = first + [p for p in order if p not in first][:cap - len(first)]
    return [p for p in pairs if p in chosen]  # trajectory order


def _pairs(runs: list[tuple[Trajectory, Problem]], cfg: AutoCoADataConfig, cap: int, rng: random.Random) -> list[PairRecord]:
    """The pairs of each run, capped; a pair whose text repeats an earlier one (several samples of one problem
    give the same facts-given pair) is left out."""
    out, seen = [], set()
    for traj, problem in runs:
        pairs = trajectory_pairs(traj, problem)
        given = facts_given_pair(traj, problem) if cfg.facts_given_pairs else None
        fresh = []
        for pair in pairs + ([given] if given else []):
            key = (pair.question, pair.prefix, pair.chosen, pair.rejected)
            if key not in seen:
                seen.add(key)
                fresh.append(pair)
        out += _capped(fresh, cap, rng)
    return out


def write_autocoa_data(dataset_dir: Path, out_dir: Path, cfg: AutoCoADataConfig,
                       problems_path: Path | None = None) -> dict[str, int]:
    """Write the files of the module docstring into `out_dir`; returns {file name: records} plus
    coa_trajectories, cot_trajectories, heldout_problems and react_dropped (trajectories with no ReAct form).
    `problems_path`: the trajectories' problems (default `dataset_dir/problems.jsonl`)."""
    dataset_dir, out_dir = Path(dataset_dir), Path(out_dir)
    problems_path = Path(problems_path) if problems_path else dataset_dir / "problems.jsonl"
    for path in (dataset_dir / "train.jsonl", problems_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: AutoCoA data needs the distilled trajectories "
                                    "(train.jsonl) and their problems with world solutions (problems.jsonl)")
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    runs = _runs(dataset_dir / "train.jsonl", problems_path)
    world_ids = sorted({p.id for _, p in runs if p is not None})
    heldout = set(rng.sample(world_ids, round(cfg.heldout_fraction * len(world_ids))))
    train = [(t, p) for t, p in runs if p is None or p.id not in heldout]
    held = [(t, p) for t, p in runs if p is not None and p.id in heldout]
    coa = [t for t, _ in train]

    counts = {"pairs.jsonl": write_pairs(out_dir / "pairs.jsonl",
                                         _pairs([r for r in train if r[1]], cfg, cfg.max_pairs_per_trajectory, rng)),
              "pairs_heldout.jsonl": write_pairs(out_dir / "pairs_heldout.jsonl", _pairs(held, cfg, 0, rng))}

    cot_pool = sorted((p for p in read_problems(problems_path) if given_facts(p) and p.id not in heldout),
                      key=lambda p: p.id)
    cot = [cot_trajectory(facts_given_problem(p))
           for p in rng.sample(cot_pool, min(len(cot_pool), round(cfg.cot_per_coa * len(coa))))]
    mixed = coa + cot
    rng.shuffle(mixed)
    counts["coa_cot.jsonl"] = write_jsonl(out_dir / "coa_cot.jsonl", mixed)
    react = [r for r in map(react_trajectory, coa) if r is not None]
    counts["react.jsonl"] = write_jsonl(out_dir / "react.jsonl", react)
    counts["observations_heldout.jsonl"] = write_observation_examples(
        out_dir / "observations_heldout.jsonl", observation_examples(held, training_calls(coa)))

    eval_path = dataset_dir / "eval_heldout.jsonl"
    given = [facts_given_problem(p) for p in read_problems(eval_path) if given_facts(p)] \
        if eval_path.is_file() else []
    counts["eval_facts_given.jsonl"] = write_problems(out_dir / "eval_facts_given.jsonl", given)
    counts.update(coa_trajectories=len(coa), cot_trajectories=len(cot), heldout_problems=len(heldout),
                  react_dropped=len(coa) - len(react))
    (out_dir / "autocoa_data.json").write_text(json.dumps({"config": cfg.model_dump(), "counts": counts,
                                                           "heldout_problem_ids": sorted(heldout)}, indent=2))
    return counts


def main(argv: list[str]) -> None:
    dataset = Path(argv[argv.index("--dataset") + 1])
    out = Path(argv[argv.index("--out") + 1])
    cfg = load_config(AutoCoADataConfig, None, [a for a in argv if "=" in a])
    print(json.dumps(write_autocoa_data(dataset, out, cfg), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
