"""The loggers of a run folder: ``logs/metrics.csv`` (Lightning's CSV logger, every row written as it is logged and
appended to on resume), ``tb/`` (TensorBoard: scalars, and at the end the figures and the config as hyperparameters
with the final metrics) and, with ``trainer.wandb: PROJECT``, Weights & Biases (:class:`WandbLogger`, offline unless
``WANDB_MODE`` says otherwise; ``pip install "rlattention[wandb]"``)."""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from lightning.fabric.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only

from rlattention.engine.rundir import write_text_nofollow


def _csv_logger(run_dir: Path, resume: bool) -> CSVLogger:
    """Lightning's CSV logger, writing every row as it is logged (its default keeps up to 100 in memory, which a
    killed run loses); on resume it appends to the run's metrics.csv instead of replacing it."""
    logger = CSVLogger(run_dir, name="logs", version="", flush_logs_every_n_steps=1)
    csv_path = run_dir / "logs" / "metrics.csv"
    if resume and csv_path.is_file():
        aside = run_dir / ".metrics.csv.previous"
        os.replace(csv_path, aside)
        writer = logger.experiment  # created now, while there is no metrics.csv for it to delete
        os.replace(aside, csv_path)
        with open(csv_path, newline="") as f:
            header = next(csv.reader(f), [])
        writer.metrics_keys = sorted(header)  # append under the existing columns
    return logger


def make_loggers(run_dir: Path | None, resume: bool = False, wandb: str = "", config: dict | None = None) -> list:
    """The loggers of a run written to ``run_dir`` (none without one): CSV, TensorBoard and, when ``wandb`` names
    a project (``trainer.wandb``), W&B with ``config``. A missing wandb package is a one-line error at once."""
    if run_dir is None:
        return []
    loggers = [_csv_logger(run_dir, resume), TensorBoardLogger(run_dir, name="tb", version="")]
    if wandb:
        loggers.append(WandbLogger(run_dir, wandb, config))
    return loggers


def truncate_metrics_csv(path: Path, step: int, final_prefix: str = "") -> int:
    """Drop the rows of ``path`` that a run killed after its checkpoint at ``step`` logged after that checkpoint,
    and that the resumed run logs again: every row of a later step, and the final evaluation's rows (keys starting
    with ``final_prefix``, e.g. ``test/``) at ``step`` itself. Atomic. Returns how many rows were dropped; a
    missing file drops none."""
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames or [], list(reader)

    def logged_after(row: dict) -> bool:
        try:
            at = int(float(row.get("step") or -1))
        except ValueError:  # not a number: keep it, it is not ours to judge
            return False
        final = bool(final_prefix) and any(k.startswith(final_prefix) and v not in ("", None) for k, v in row.items())
        return at > step or (at == step and final)

    kept = [r for r in rows if not logged_after(r)]
    if len(kept) == len(rows):
        return 0
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)
    return len(rows) - len(kept)


WANDB_MISSING = 'trainer.wandb needs the wandb package: pip install "rlattention[wandb]"'
_WANDB_FORBIDDEN = set("/\\#?%:")  # characters W&B refuses in a project name


def check_wandb_project(project: str) -> str:
    """``project`` (``trainer.wandb``) if it is a name W&B accepts (at most 128 characters, none of ``/\\#?%:``);
    else a :class:`~rlattention.engine.config.ConfigError`."""
    from rlattention.engine.config import ConfigError

    if (
        not isinstance(project, str)
        or len(project) > 128
        or _WANDB_FORBIDDEN & set(project)
        or project != project.strip()
    ):
        raise ConfigError(
            f"trainer.wandb must be a Weights & Biases project name (at most 128 characters, none of / \\ # ? % :), "
            f"got {project!r}"
        )
    return project


def _import_wandb():
    try:
        import wandb
    except ImportError:
        raise ModuleNotFoundError(WANDB_MISSING) from None
    return wandb


class WandbLogger(Logger):
    """Weights & Biases as a Fabric logger (``trainer.wandb: PROJECT``): the run's scalars, its config, its final
    metrics (the run summary) and its figures. Offline unless the environment says otherwise: ``mode`` is
    ``$WANDB_MODE``, ``offline`` when unset, so nothing leaves the machine unasked (``wandb sync RUN/wandb/...``
    uploads it later; ``WANDB_MODE=online`` logs live). Files under ``RUN/wandb/``; the W&B run is named after the
    run folder and keeps its id in ``RUN/wandb-id``, so a resumed run continues the same W&B run. Rank 0 only."""

    def __init__(self, run_dir: Path, project: str, config: dict | None = None) -> None:
        super().__init__()
        self._wandb = _import_wandb()  # at once: a missing package is an error before the run starts
        self._run_dir, self._project, self._config = Path(run_dir), check_wandb_project(project), config
        self._run = None

    @property
    def name(self) -> str:
        return "wandb"

    @property
    def version(self) -> str:
        return self._run_dir.name

    @property
    @rank_zero_experiment
    def experiment(self):
        """The W&B run, started at the first use (on rank 0)."""
        if self._run is None:
            id_file = self._run_dir / "wandb-id"
            run_id = id_file.read_text().strip() if id_file.is_file() else None
            self._run = self._wandb.init(
                project=self._project,
                name=self._run_dir.name,
                dir=str(self._run_dir),
                id=run_id,
                resume="allow" if run_id else None,
                mode=os.environ.get("WANDB_MODE") or "offline",
                config=self._config,
            )
            if run_id is None and getattr(self._run, "id", None):
                write_text_nofollow(id_file, str(self._run.id))
        return self._run

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.experiment.log(dict(metrics), step=step)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """``params`` into the run's config, ``metrics`` into its summary (the figures a run table shows)."""
        self.experiment.config.update(params, allow_val_change=True)
        if metrics:
            self.experiment.summary.update(dict(metrics))

    @rank_zero_only
    def log_image(self, tag: str, path: Path, step: int | None = None) -> None:
        self.experiment.log({tag: self._wandb.Image(str(path))}, step=step)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0 if status == "success" else 1)
            self._run = None


def _read_png(path: Path) -> np.ndarray:
    """``(H, W, 3)`` float32 in [0, 1]: a figure as TensorBoard's ``add_image`` takes it (alpha dropped)."""
    from matplotlib.image import imread

    image = np.asarray(imread(str(path)), dtype=np.float32)
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=-1)
    image = image[..., :3]
    return image / 255.0 if image.max() > 1.0 else image


def log_figures(loggers: list, paths: list[Path], step: int) -> None:
    """The run's figure files (``figures/*.png``) as images of its TensorBoard run (tag ``figures/<name>``) and of
    its W&B run; rank 0 (the caller)."""
    for path in map(Path, paths):
        if path.suffix.lower() != ".png":
            continue
        tag = f"figures/{path.stem}"
        for logger in loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image(tag, _read_png(path), step, dataformats="HWC")
            elif isinstance(logger, WandbLogger):
                logger.log_image(tag, path, step)


def final_metrics(report: Mapping[str, Any], split: str, metric_name: str) -> dict[str, float]:
    """The final numbers of a report, as the hyperparameter table shows them: ``<split>/<metric>`` (the tags the
    final evaluation logged) and ``best_val/<selection metric>``."""
    out = {f"{split}/{k}": float(v) for k, v in report[split].items() if isinstance(v, int | float)}
    best = report.get(f"best_val_{metric_name}")
    if isinstance(best, int | float):
        out[f"best_val/{metric_name}"] = float(best)
    return out


def log_hparams(loggers: list, config: dict, metrics: Mapping[str, float], step: int) -> None:
    """The run's resolved config as hyperparameters (TensorBoard's hparams plugin: nested keys joined by ``/``),
    with its final ``metrics``; W&B: config and summary. The CSV log has no such table."""
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(config, dict(metrics), step=step)
        elif isinstance(logger, WandbLogger):
            logger.log_hyperparams(config, metrics)
