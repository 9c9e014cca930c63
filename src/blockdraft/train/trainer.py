"""The training loop every drafter shares: AdamW, schedule, time budget, log, resumable state, stop signals."""

from __future__ import annotations

import json
import math
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..errors import BlockdraftError
from .metrics import DraftMetrics


class TrainLog:
    """Appends one JSON line per event to OUT/train_log.jsonl (loss curve, validation, timing)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / "train_log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class Budget:
    """Stops training after `max_minutes` (0: no limit), counted across resumed runs."""

    def __init__(self, max_minutes: float, spent_s: float = 0.0):
        self.limit = max_minutes * 60 if max_minutes else float("inf")
        self.start = time.time() - spent_s

    @property
    def spent(self) -> float:
        return time.time() - self.start

    def over(self) -> bool:
        return self.spent >= self.limit


def progress(total: int, initial: int, desc: str) -> tqdm:
    return tqdm(total=total, initial=initial, desc=desc, unit="step", smoothing=0.05, dynamic_ncols=True)


def saved_state(out) -> Path | None:
    """The folder holding a run's last complete training state (OUT/resume), or None."""
    for name in ("resume", "resume-new"):  # resume-new: killed between writing a new state and renaming it
        if (Path(out) / name / "state.json").is_file():
            return Path(out) / name
    return None


class Trainer:
    """AdamW + warmup/cosine schedule + progress bar + time budget + periodic, resumable checkpoints.

    The schedule follows whichever runs out first, steps or minutes, so a time-boxed run still
    ends with a decayed learning rate. A checkpoint (OUT/resume/) holds the weights, the optimizer
    state (safetensors, never pickle), the step (hence the schedule's position), the time spent and
    the data position (epoch, batch, the data rng's state): with `batches()` a resumed run draws exactly
    the batches an uninterrupted one would have, so in float32 it ends with the same weights. SIGINT/SIGTERM (Ctrl-C,
    a session that ends) stop after the current step, like the time limit: state saved, resumable.
    """

    def __init__(self, model: torch.nn.Module, out, lr: float, total_steps: int, max_minutes: float = 0.0,
                 save_every_minutes: float = 10.0, resume: bool = False, desc: str = "train",
                 evaluate=None, eval_every_minutes: float = 8.0, stop_at_step: int = 0):
        self.model, self.out, self.peak_lr, self.total = model, Path(out), lr, max(1, total_steps)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.step_no, spent = 0, 0.0
        self.epoch, self.batch_in_epoch = 0, 0  # the data position: the next batch to draw ...
        self.rng = self.epoch_start = self.saved_rng = None  # ... and the data rng's states (see batches())
        self.counters: dict[str, int] = {}  # running totals for the log (e.g. anchors seen), kept across resumes
        self.state_dir = self.out / "resume"
        if resume:
            spent = self.load_state(self.state_dir)
        self.budget = Budget(max_minutes, spent)
        self.stop_at = stop_at_step  # stop (resumably) here; the schedule still spans total_steps
        self.stop_requested, self.stop_reason = False, None
        self.save_every = save_every_minutes * 60
        self.last_save = time.time()
        self.bar = progress(self.total, self.step_no, desc)
        self.log = TrainLog(self.out)
        self.ema = None
        # evaluate() -> DraftMetrics on a held-out sample, logged every few minutes: the curve of
        # draft quality against training steps shows whether a longer run would pay off.
        self.evaluate, self.eval_every, self.last_eval = evaluate, eval_every_minutes * 60, time.time()
        self.started = time.time()
        self._handlers = _catch_stop_signals(self)

    def load_state(self, folder: Path) -> float:
        """Weights, optimizer state, step and data position from a saved state; returns the seconds spent."""
        from safetensors.torch import load_file

        folder = saved_state(folder.parent)
        if folder is None:
            raise BlockdraftError(f"--resume: '{self.out}' has no saved training state (resume/state.json)")
        state = json.loads((folder / "state.json").read_text())
        weights = load_file(str(folder / "model.safetensors"))
        device = next(iter(self.model.state_dict().values())).device
        self.model.load_state_dict({k: v.to(device) for k, v in weights.items()})
        if (folder / "optimizer.safetensors").is_file():
            opt = load_file(str(folder / "optimizer.safetensors"))
            for i, p in enumerate(self.params):
                if f"{i}.step" in opt:  # AdamW keeps `step` on the CPU (not capturable), the moments with p
                    self.opt.state[p] = {"step": opt[f"{i}.step"], "exp_avg": opt[f"{i}.exp_avg"].to(p.device),
                                         "exp_avg_sq": opt[f"{i}.exp_avg_sq"].to(p.device)}
        self.step_no = state["step"]
        self.epoch, self.batch_in_epoch = state.get("epoch", 0), state.get("batch", 0)
        self.saved_rng = state.get("rng")
        self.counters = state.get("counters", {})
        return state["spent_s"]

    def batches(self, items, size: int, rng: np.random.Generator):
        """Endless epochs of `size` items, each epoch a fresh permutation of `items` drawn from `rng` (which
        also serves the batches' own random choices, e.g. anchors), from the saved data position.

        The state saves the rng's state at the epoch's start (to draw the same permutation again) and now
        (for the batches still to come): a resumed run draws exactly what an uninterrupted one would, and
        the stream is the one a plain loop over `rng` draws.
        """
        items = np.asarray(items)
        per_epoch = len(items) // size
        if per_epoch == 0:
            return
        self.rng, resumed = rng, self.saved_rng
        while True:
            if resumed:
                rng.bit_generator.state = resumed[0]
            self.epoch_start = rng.bit_generator.state
            order = rng.permutation(items)
            if resumed:
                rng.bit_generator.state, resumed = resumed[1], None
            while self.batch_in_epoch < per_epoch:
                i = self.batch_in_epoch
                self.batch_in_epoch += 1  # a state saved during this batch's step resumes at the next one
                yield order[i * size : (i + 1) * size]
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def record(self, cfg, store) -> dict:
        """How the checkpoint was made, for its config.json: options, time, steps, data size."""
        return {"command_config": vars(cfg), "minutes": round(self.budget.spent / 60, 1), "steps": self.step_no,
                "planned_steps": self.total, "stopped": self.stop_reason, "train_tokens": store.meta["n_tokens"],
                "wall_minutes_this_run": round((time.time() - self.started) / 60, 1)}

    @property
    def fraction(self) -> float:
        by_time = self.budget.spent / self.budget.limit if math.isfinite(self.budget.limit) else 0.0
        return max(self.step_no / self.total, by_time)

    def step(self, loss: torch.Tensor, **extra) -> bool:
        """One optimizer step on `loss`. Returns False when the run should stop (steps or time used up)."""
        frac = self.fraction
        lr = self.peak_lr * (min(1.0, (self.step_no + 1) / 30)) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.step_no += 1
        value = float(loss.detach())
        self.ema = value if self.ema is None else 0.9 * self.ema + 0.1 * value
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.ema:.3f}", lr=f"{lr:.1e}")
        if self.step_no % 10 == 0:
            self.log.write(step=self.step_no, loss=round(self.ema, 4), lr=lr, minutes=round(self.budget.spent / 60, 2),
                           **extra)
        if time.time() - self.last_save > self.save_every:
            self.save_state()
        if self.evaluate is not None and time.time() - self.last_eval > self.eval_every:
            self.log_validation(**extra)
        return not self.should_stop()

    def should_stop(self) -> bool:
        """Steps done, or stopped early (time limit, signal, --stop-at-step): then say how to continue."""
        if self.step_no >= self.total:
            return True
        if self.stop_reason is None:
            self.stop_reason = ("interrupted" if self.stop_requested else "time limit" if self.budget.over()
                                else "--stop-at-step" if self.stop_at and self.step_no >= self.stop_at else None)
            if self.stop_reason:
                more = " --max-minutes LARGER" if self.stop_reason == "time limit" else ""
                self.bar.write(f"{self.stop_reason}: stopping at step {self.step_no}/{self.total}; "
                               f"continue with `blockdraft train --resume {self.out}{more}`")
        return self.stop_reason is not None

    def log_validation(self, **extra) -> DraftMetrics:
        self.model.eval()
        metrics = self.evaluate()
        self.model.train()
        self.log.write(step=self.step_no, minutes=round(self.budget.spent / 60, 2), valid_tau_tf=round(metrics.tau, 4),
                       valid_accuracy=[round(a, 4) for a in metrics.accuracy], **extra)
        self.bar.write(f"step {self.step_no}: validation tau_tf {metrics.tau:.3f}, top-1 per depth "
                       + " ".join(f"{a:.2f}" for a in metrics.accuracy))
        self.last_eval = time.time()
        return metrics

    def save_state(self) -> None:
        """Write OUT/resume/ atomically: a new folder first, then swapped in (a kill never leaves half a state)."""
        from safetensors.torch import save_file

        new, old = self.out / "resume-new", self.out / "resume-old"
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()},
                  str(new / "model.safetensors"))
        opt = {}
        for i, p in enumerate(self.params):
            st = self.opt.state.get(p)
            if st:
                opt.update({f"{i}.step": torch.as_tensor(st["step"]).reshape(()).float().cpu(),
                            f"{i}.exp_avg": st["exp_avg"].cpu(), f"{i}.exp_avg_sq": st["exp_avg_sq"].cpu()})
        if opt:
            save_file(opt, str(new / "optimizer.safetensors"))
        state = {"step": self.step_no, "total_steps": self.total, "spent_s": self.budget.spent,
                 "epoch": self.epoch, "batch": self.batch_in_epoch, "counters": self.counters,
                 "rng": [self.epoch_start, self.rng.bit_generator.state] if self.rng is not None else self.saved_rng}
        (new / "state.json").write_text(json.dumps(state))  # last: a folder with state.json is complete
        shutil.rmtree(old, ignore_errors=True)
        if self.state_dir.exists():
            self.state_dir.rename(old)
        new.rename(self.state_dir)
        shutil.rmtree(old, ignore_errors=True)
        self.last_save = time.time()

    def close(self) -> None:
        self.bar.close()
        self.save_state()
        _restore_signals(self._handlers)


def _catch_stop_signals(trainer: Trainer) -> dict:
    """SIGINT/SIGTERM ask the trainer to stop after its current step (a second Ctrl-C interrupts at once)."""
    def handler(signum, frame):
        if trainer.stop_requested:
            raise KeyboardInterrupt
        trainer.stop_requested = True

    old = {}
    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handler)
    return old


def _restore_signals(old: dict) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)
