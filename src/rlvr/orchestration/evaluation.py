"""Held-out evaluation on its schedule: before RL, every `eval.every` steps, after the last step.

Each pass is `rlvr.eval.runner.evaluate` (the function `rlvr eval` runs too) on data.test with
the sampling `held_out_sampling` derives from the config, written to run_dir/eval/TAG.json and
its samples to TAG.jsonl; the loop logs the headline numbers (avg@k, pass@k, maj@k).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.config import RunConfig
from rlvr.eval.metrics import headline_line, spread
from rlvr.eval.rollouts_file import paired_rows, read_samples, summarize_rows
from rlvr.eval.runner import evaluate, held_out_sampling
from rlvr.rollout.prompts import PromptSet
from rlvr.rollout.sampler import EpochSampler
from rlvr.rollout.trajectories import EnvironmentEngine, TrajectoryRunner
from rlvr.tracking.timing import StepTimer


class Evaluation:
    """Runs the test set's trajectories through the run's environment (single_turn: one completion)."""

    def __init__(
        self,
        cfg: RunConfig,
        runner: TrajectoryRunner,
        pool,
        test_set: PromptSet | None,
        timer: StepTimer,
        progress=None,
        log=print,
        train_set: PromptSet | None = None,
        sampler: EpochSampler | None = None,
    ):
        self.cfg, self.runner, self.pool, self.test_set = cfg, runner, pool, test_set
        # given where test prompts also occur in data.train: the after-evaluation then also reports
        # the test problems never drawn for training (`unseen`), the figure that is held out in fact
        self.train_set, self.sampler = train_set, sampler
        self.timer, self.progress, self.log = timer, progress, log
        self.folder = Path(cfg.run_dir) / "eval"

    def due(self, step: int) -> bool:
        """A periodic evaluation after `step` (the last step has its own, `after`)."""
        every = self.cfg.eval.every
        return bool(every) and step % every == 0 and step < self.cfg.steps

    def uses_push_of(self, step: int) -> bool:
        """An evaluation runs on the policy pushed after `step`: a periodic one, or the last step's `after`."""
        return self.test_set is not None and (self.due(step) or step == self.cfg.steps)

    def run(self, tag: str) -> dict[str, float]:
        """Evaluate the engine's current policy; the headline numbers ({} without data.test)."""

        if self.test_set is None:
            return {}
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.timer("eval"):
            result = evaluate(
                EnvironmentEngine(self.runner, self.test_set.problems),
                self.pool,
                self.test_set.problems,
                self.test_set.prompts,
                n=self.cfg.eval.n,
                ks=self.cfg.eval.k,
                sampling=held_out_sampling(self.cfg.eval, self.cfg.rollout.sampling, self.cfg.seed),
                samples_path=str(self.folder / f"{tag}.jsonl"),
                progress=self.progress,
            )
        if tag == "after":  # both evaluations' samples, read once for the pairing and the unseen split
            saved = self._saved_rows()
            if "before" in saved:
                result["paired"] = self._paired(saved)
            if self.train_set is not None:
                result["unseen"] = self._unseen(saved)
        (self.folder / f"{tag}.json").write_text(json.dumps(result, indent=2))
        return self._headline(tag, result)

    def _headline(self, tag: str, result: dict) -> dict[str, float]:
        """Log an evaluation's headline numbers (and the unseen problems'); return them."""
        keys = [f"{m}@{k}" for k in self.cfg.eval.k for m in ("avg", "pass", "maj")]
        headline = {k: round(float(result[k]), 4) for k in keys if k in result}
        k = max(self.cfg.eval.k)
        self.log(f"eval {tag}: {headline_line(result, self.cfg.eval.n)}")
        if paired := result.get("paired"):
            headline |= {f"paired/{key}": round(value, 4) for key, value in paired["difference"].items()}
            headline |= {f"paired/stderr/{key}": round(se, 4) for key, se in paired["stderr"].items() if se is not None}
            changes = "  ".join(
                f"{key} {paired['difference'][key]:+.3f}" + spread(paired["stderr"][key])
                for key in (f"avg@{k}", f"pass@{k}", f"maj@{k}")
            )
            self.log(f"  after - before, paired over the same {paired['n_problems']} problems: {changes}")
        if unseen := result.get("unseen"):
            for when, figures in unseen.items():
                headline |= {f"unseen_{when}/{key}": round(float(figures[key]), 4) for key in keys if key in figures}
            before = f"{headline[f'unseen_before/avg@{k}']:.3f} -> " if "before" in unseen else ""
            after_spread = spread(unseen["after"]["stderr"].get(f"avg@{k}"))
            self.log(
                f"  on the {unseen['after']['n_problems']} test problems never drawn for training: avg@{k} {before}"
                f"{headline[f'unseen_after/avg@{k}']:.3f}{after_spread}"
            )
        return headline

    def _saved_rows(self) -> dict:
        """{"before": rows, "after": rows}: the saved samples of those evaluations that ran."""

        paths = {when: self.folder / f"{when}.jsonl" for when in ("before", "after")}
        return {when: read_samples(path) for when, path in paths.items() if path.is_file()}

    def _paired(self, saved: dict) -> dict:
        """after - before on the problems both evaluations scored, with paired standard errors."""

        return paired_rows(saved["before"], saved["after"], self.cfg.eval.k)

    def _unseen(self, saved: dict) -> dict:
        """The before and after metrics on the test problems whose prompt equals no training
        prompt drawn in the run, from the evaluations' saved samples ({} when all were drawn)."""

        assert self.test_set is not None and self.train_set is not None and self.sampler is not None  # see run()
        drawn = {tuple(self.train_set.prompts[i]) for i in self.sampler.drawn()}
        unseen = {
            p.id for p, prompt in zip(self.test_set.problems, self.test_set.prompts) if tuple(prompt) not in drawn
        }
        out = {}
        for when, all_rows in saved.items():
            rows = [row for row in all_rows if row.problem_id in unseen]
            if rows:
                out[when] = {
                    key: value for key, value in summarize_rows(rows, self.cfg.eval.k).items() if key != "problems"
                }
        return out if "after" in out else {}
