"""Estimators for sampled evaluation: avg@k, unbiased pass@k, maj@k, with standard errors.

Each problem gets n >= k samples, each with a reward and the answer the verifier extracted.
Per problem i (c_i = samples with reward >= CORRECT_REWARD, n_i = samples):

    avg@k_i  = mean reward of all n_i samples. The mean reward of k samples has the same
               expectation for every k, and averaging all n_i samples is its lowest-variance
               unbiased estimate, so avg@k does not depend on k (k only names the setting).
    pass@k_i = 1 - C(n_i - c_i, k) / C(n_i, k), the unbiased estimator of the chance that at
               least one of k samples is correct (Chen et al. 2021, "Evaluating Large Language
               Models Trained on Code", arXiv:2107.03374, eq. 1). Taking the fraction of
               problems with c >= 1 among k samples instead is the biased "pass@n" that
               overstates small-k numbers.
    maj@k_i  = 1 if the most frequent extracted answer among the first k samples (in sample
               order; ties go to the answer seen first; samples without an answer do not
               vote) is correct, else 0.

Each metric is the mean over problems; its standard error is s / sqrt(P), s the sample
standard deviation of the per-problem values over the P problems: the problems are the
independent units, the samples of one problem are clustered (Miller 2024, "Adding Error Bars
to Evals", arXiv:2411.00640, section 2). With one problem the standard error is undefined and
reported as None.

How maj@k judges the voted answer: only rewards and extracted strings are available here,
and the verifier (math equivalence, not string equality) already judged every sample, so an
extracted answer counts as correct iff some sample of the same problem with exactly that
extracted string got a correct reward. Voting is on the exact strings the verifier extracted
(the verifier owns normalisation), so "1/2" and "0.5" are two different votes.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

# A sample is correct when its reward reaches this. Verifiers give 1 for a correct answer;
# ">=" keeps a correct answer correct when a shaped reward adds a bonus on top.
CORRECT_REWARD = 1.0

METRIC_NAMES = ("avg", "pass", "maj")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which equals the binomial ratio but never
    forms the huge binomials (C(200, 100) ~ 9e58) that overflow floats.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k needs integers, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c} correct of n={n} samples")
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, got n={n}")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_answer(answers: list[str | None]) -> str | None:
    """The most frequent non-None answer; ties go to the one that appeared first."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    # Counter keeps first-insertion order and max() returns the first maximum it meets.
    return max(counts, key=counts.__getitem__)


def _stderr(values: list[float]) -> float | None:
    """Standard error of the mean, s / sqrt(P) with the (P-1)-normalised s; None if P < 2."""
    p = len(values)
    if p < 2:
        return None
    mean = sum(values) / p
    variance = sum((v - mean) ** 2 for v in values) / (p - 1)
    return math.sqrt(variance / p)


def check_ks(ks: list[int]) -> list[int]:
    """The distinct ks, ascending; a clear error for an empty list or a k that is not a positive int."""
    if not ks:
        raise ValueError("need at least one k, e.g. ks=[1, 4, 8]")
    for k in ks:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"every k must be a positive integer, got {k!r}")
    return sorted(set(ks))


def _samples_by_problem(
    problem_ids: list[str], rewards: list[float], extracted: list[str | None], ks: list[int]
) -> dict[str, list[tuple[float, str | None]]]:
    """Each problem's (reward, extracted) samples in list order; every problem needs max(ks)."""
    if not len(problem_ids) == len(rewards) == len(extracted):
        raise ValueError(
            f"problem_ids, rewards and extracted must have one entry per sample, got lengths "
            f"{len(problem_ids)}, {len(rewards)}, {len(extracted)}"
        )
    if not problem_ids:
        raise ValueError("no samples to evaluate")
    samples: dict[str, list[tuple[float, str | None]]] = {}
    for pid, reward, answer in zip(problem_ids, rewards, extracted):
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"problem {pid!r}: reward must be a finite number, got {reward!r}")
        samples.setdefault(pid, []).append((float(reward), answer))
    too_few = {pid: len(s) for pid, s in samples.items() if len(s) < ks[-1]}
    if too_few:
        pid, n = next(iter(too_few.items()))
        raise ValueError(
            f"@{ks[-1]} metrics need at least {ks[-1]} samples per problem; {len(too_few)} "
            f"problem(s) have fewer, e.g. {pid!r} has {n}"
        )
    return samples


def _problem_values(rows: list[tuple[float, str | None]], ks: list[int]) -> dict[str, float]:
    """One problem's avg@k, pass@k and maj@k for each k (see the module docstring)."""
    n = len(rows)
    c = sum(r >= CORRECT_REWARD for r, _ in rows)
    correct_answers = {a for r, a in rows if r >= CORRECT_REWARD and a is not None}
    mean_reward = sum(r for r, _ in rows) / n
    values = {}
    for k in ks:
        vote = majority_answer([a for _, a in rows[:k]])
        values[f"avg@{k}"] = mean_reward
        values[f"pass@{k}"] = pass_at_k(n, c, k)
        values[f"maj@{k}"] = float(vote is not None and vote in correct_answers)
    return values


def summarize(
    problem_ids: list[str],
    rewards: list[float],
    extracted: list[str | None],
    references: dict[str, str] | None,
    ks: list[int],
) -> dict:
    """avg@k, pass@k and maj@k with standard errors over problems, and a per-problem table.

    The three lists are parallel, one entry per sample; a problem's samples are taken in list
    order as sample 0, 1, ... (maj@k uses the first k). Every problem needs n >= max(ks)
    samples; problems may have different n. `references` (problem id -> reference answer) is
    only shown in the table: correctness comes from the rewards (see the module docstring).

    Returns {"avg@k", "pass@k", "maj@k" for each k, "n_problems", "stderr": {same metric
    keys}, "problems": [{"id", "n", "c", "mean_reward", "majority", "majority_correct",
    "reference"}]}, where "majority" is the vote over the first max(ks) samples.
    """
    ks = check_ks(ks)
    samples = _samples_by_problem(problem_ids, rewards, extracted, ks)

    per_problem: dict[str, list[float]] = {f"{m}@{k}": [] for m in METRIC_NAMES for k in ks}
    table = []
    for pid, rows in samples.items():
        values = _problem_values(rows, ks)
        for key, value in values.items():
            per_problem[key].append(value)
        table.append(
            {
                "id": pid,
                "n": len(rows),
                "c": sum(r >= CORRECT_REWARD for r, _ in rows),
                "mean_reward": values[f"avg@{ks[-1]}"],
                "majority": majority_answer([a for _, a in rows[: ks[-1]]]),  # the vote of the largest k
                "majority_correct": values[f"maj@{ks[-1]}"] == 1.0,
                "reference": None if references is None else references.get(pid),
            }
        )

    summary: dict = {key: sum(values) / len(values) for key, values in per_problem.items()}
    summary["n_problems"] = len(samples)
    summary["stderr"] = {key: _stderr(values) for key, values in per_problem.items()}
    summary["problems"] = table
    return summary


def paired_difference(
    before: tuple[list[str], list[float], list[str | None]],
    after: tuple[list[str], list[float], list[str | None]],
    ks: list[int],
) -> dict:
    """after - before for each metric, over the problems both evaluations scored, with the
    paired standard error.

    Each argument is an evaluation's parallel (problem_ids, rewards, extracted) lists, as
    summarize() takes them. Per problem i, d_i = metric_i(after) - metric_i(before); the
    difference is mean(d) and its standard error sd(d) / sqrt(P) over the P shared problems.
    Pairing removes the spread between problems (an easy problem is easy before and after),
    which is most of the variance of either figure alone: the paired error is smaller than
    the two unpaired ones combined, and it is the one that says whether training moved the
    score (Miller 2024, "Adding Error Bars to Evals", arXiv:2411.00640, section 4).

    Returns {"n_problems": P, "difference": {metric: mean d}, "stderr": {metric: se or None}}.
    """
    ks = check_ks(ks)
    first = {pid: _problem_values(rows, ks) for pid, rows in _samples_by_problem(*before, ks).items()}
    second = {pid: _problem_values(rows, ks) for pid, rows in _samples_by_problem(*after, ks).items()}
    shared = [pid for pid in first if pid in second]
    if not shared:
        raise ValueError("the two evaluations share no problem to pair")
    keys = [f"{m}@{k}" for m in METRIC_NAMES for k in ks]
    deltas = {key: [second[pid][key] - first[pid][key] for pid in shared] for key in keys}
    return {
        "n_problems": len(shared),
        "difference": {key: sum(d) / len(d) for key, d in deltas.items()},
        "stderr": {key: _stderr(d) for key, d in deltas.items()},
    }


def flat_eval_metrics(summary: dict, prefix: str) -> dict[str, float]:
    """A summarize() result as flat scalar metrics for metrics.jsonl, under `prefix`.

    E.g. prefix "eval/aime24" gives "eval/aime24/avg@8", "eval/aime24/stderr/avg@8" and
    "eval/aime24/n_problems"; the per-problem table stays out (it lives in the sample file).
    """
    metrics = {f"{prefix}/{key}": value for key, value in summary.items() if "@" in key}
    metrics.update({f"{prefix}/stderr/{key}": value for key, value in summary["stderr"].items() if value is not None})
    metrics[f"{prefix}/n_problems"] = summary["n_problems"]
    return metrics


def spread(stderr: float | None) -> str:
    """ " ± se", or nothing where too few problems give a standard error."""
    return "" if stderr is None else f" ± {stderr:.3f}"


def headline_line(summary: dict, samples: int | None = None) -> str:
    """A summarize() result in one line: avg, pass and maj at its largest k, each with its standard
    error, then how many problems and `samples` each (default: as its problem table says):
    "avg@4 0.135 ± 0.017  ...  (200 problems x 4)"."""
    k = max(int(key.split("@")[1]) for key in summary if key.startswith("avg@"))
    figures = "  ".join(
        f"{m}@{k} {summary[f'{m}@{k}']:.3f}{spread(summary['stderr'].get(f'{m}@{k}'))}" for m in METRIC_NAMES
    )
    samples = samples or max((row["n"] for row in summary.get("problems", [])), default=None)
    return f"{figures}  ({summary['n_problems']} problems" + (f" x {samples})" if samples else ")")


def write_summary(out: Path, summary: dict) -> None:
    """The summary as JSON at `out`: its headline figures, then each problem's."""
    out.parent.mkdir(parents=True, exist_ok=True)
    headline = {key: value for key, value in summary.items() if key != "problems"}
    out.write_text(json.dumps(headline | {"problems": summary.get("problems", [])}, indent=2, allow_nan=False))
