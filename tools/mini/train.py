"""Train gpt-oss-mini end to end: corpus -> tokenizer -> train -> export -> MXFP4 -> evaluate.

    # the real run, one H200, about 8 minutes in all (see tools/mini/MODEL_CARD.md):
    python -m tools.mini.train --out /path/to/gpt-oss-mini
    # CPU smoke test, a few seconds:
    python -m tools.mini.train --tiny --out /tmp/mini-tiny
    # a draft model for gpt-oss-mini (its tokenizer, 2 layers, 60 s; tools/mini/draft.py):
    python -m tools.mini.train --preset draft --out /path/to/mini-draft

Schedule: warmup, then a constant learning rate until the validation loss stops improving (the
corpus is small, so the model overfits before the time runs out) or the time budget nears its
end, then a linear decay over a further `decay_fraction` of the steps taken (warmup-stable-decay).
The decay phase trains through MXFP4 fake quantisation of the experts, so the shipped MXFP4
checkpoint holds exactly the weights that were trained. The best validation checkpoint of the
decay phase is the one exported.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import sysconfig
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from gossamer.config import ModelConfig
from gossamer.models import default_model_path
from tools.mini.corpus import build_corpus
from tools.mini.draft import distillation_terms, load_mini, target_description, top1_agreement
from tools.mini.evaluate import evaluate_checkpoint, load_hf_model, mean_loss, windows
from tools.mini.export import convert_to_mxfp4, export_bf16, folder_bytes
from tools.mini.model import (
    MiniConfig,
    MiniGptOss,
    cross_entropy,
    init_weights,
    load_balance_loss,
)
from tools.mini.tokenizer import build_token_data, build_token_data_with

MAX_FOLDER_BYTES = 25_000_000
CARD_TEMPLATE = Path(__file__).with_name("MODEL_CARD.md")
DRAFT_CARD_TEMPLATE = Path(__file__).with_name("DRAFT_CARD.md")


@dataclass(frozen=True)
class TrainSettings:
    seq_len: int = 2048
    batch_size: int = 16  # sequences per step: 32k tokens
    lr: float = 1.5e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    dropout: float = 0.1
    balance_coef: float = 0.01  # load-balancing auxiliary loss
    eval_every: int = 50
    log_every: int = 50
    eval_batch_size: int = 8
    eval_max_tokens: int | None = None  # None: the whole validation split
    patience: int = 4  # evals without a new best before the decay starts
    min_delta: float = 0.002  # nats: smaller gains do not count as improvement
    decay_fraction: float = 0.25
    qat: bool = True  # MXFP4 fake quantisation of the experts during the decay
    time_budget_s: float = 420.0  # the training loop, compilation included
    max_epochs: float = 60.0
    max_steps: int | None = None
    seed: int = 0
    compile: bool = True
    # Weight of the target's next-token distribution in the loss of a draft model (0: the corpus
    # alone); see tools/mini/draft.py.
    distill: float = 0.0


TINY_MODEL = MiniConfig(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=32,
    sliding_window=16,
)
TINY_SETTINGS = TrainSettings(
    seq_len=64,
    batch_size=4,
    warmup_steps=2,
    eval_every=3,
    log_every=1,
    eval_batch_size=4,
    eval_max_tokens=1024,
    max_steps=8,
    time_budget_s=600.0,
    compile=False,
)
# A draft model for gpt-oss-mini (tools/mini/draft.py says why each value differs).
DRAFT_MODEL = MiniConfig(hidden_size=256, num_hidden_layers=2, num_local_experts=8)
DRAFT_SETTINGS = TrainSettings(time_budget_s=60.0, compile=False)
PRESETS = {"mini": (MiniConfig(), TrainSettings()), "draft": (DRAFT_MODEL, DRAFT_SETTINGS)}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- Data --------------------------------------------------------------------------------------


class EpochSampler:
    """Non-overlapping [B, T+1] windows of the train stream; each epoch a new random offset and
    order, so every token is seen once per epoch and windows straddle different boundaries."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch_size: int, device: str, seed: int):
        self.tokens = torch.from_numpy(stream.astype(np.int64)).to(device)
        self.seq_len, self.batch_size = seq_len, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.batches_per_epoch = (len(stream) - seq_len - 1) // (seq_len * batch_size)
        if self.batches_per_epoch < 1:
            raise ValueError("the train split is smaller than one batch; lower --batch-size")
        self._queue: list[torch.Tensor] = []

    def _refill(self) -> None:
        offset = int(torch.randint(self.seq_len, (1,), generator=self.generator))
        count = (len(self.tokens) - offset - 1) // self.seq_len
        starts = offset + torch.randperm(count, generator=self.generator) * self.seq_len
        usable = self.batches_per_epoch * self.batch_size
        self._queue = list(starts[:usable].view(self.batches_per_epoch, self.batch_size))
        self.epoch += 1

    def next(self) -> torch.Tensor:
        if not self._queue:
            self._refill()
        starts = self._queue.pop(0).to(self.tokens.device)
        index = starts[:, None] + torch.arange(self.seq_len + 1, device=self.tokens.device)
        return self.tokens[index]

    @property
    def epochs_done(self) -> float:
        return self.epoch - len(self._queue) / self.batches_per_epoch


# --- Schedule ----------------------------------------------------------------------------------


class WarmupStableDecay:
    """The learning-rate schedule; the trainer decides when the decay starts."""

    def __init__(self, settings: TrainSettings):
        self.settings = settings
        self.decay_start: int | None = None
        self.decay_steps = 0

    def start_decay(self, step: int, steps_affordable: int) -> None:
        wanted = max(1, round(self.settings.decay_fraction * step))
        self.decay_start, self.decay_steps = step, max(1, min(wanted, steps_affordable))

    def finished(self, step: int) -> bool:
        return self.decay_start is not None and step >= self.decay_start + self.decay_steps

    def lr(self, step: int) -> float:
        peak = self.settings.lr
        if self.decay_start is not None:
            progress = (step - self.decay_start) / self.decay_steps
            return peak * max(0.0, 1.0 - progress)
        return peak * min(1.0, (step + 1) / self.settings.warmup_steps)


# --- Training ----------------------------------------------------------------------------------


@dataclass
class TrainResult:
    steps: int
    epochs: float
    tokens_seen: int
    seconds: float
    tokens_per_second: float
    best_val_loss: float
    decay_start_step: int | None
    decay_reason: str
    history: list[dict]


def make_optimizer(model: MiniGptOss, settings: TrainSettings, device: str):
    decay, no_decay = [], []
    for param in model.parameters():
        (no_decay if param.ndim < 2 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, settings.beta2), fused=fused)


def loss_terms(model: MiniGptOss, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(next-token cross entropy, load-balancing loss) of a [B, T+1] batch."""
    hidden, router_logits = model.hidden_states(batch[:, :-1])
    logits = model.lm_head(hidden)
    return cross_entropy(logits, batch[:, 1:]), load_balance_loss(
        router_logits, model.config.num_experts_per_tok
    )


class Trainer:
    def __init__(
        self,
        model: MiniGptOss,
        settings: TrainSettings,
        train: np.ndarray,
        val: np.ndarray,
        device: str,
        loss_fn=loss_terms,  # (model, [B, T+1] batch) -> (objective, balance loss)
    ):
        self.model, self.settings, self.device = model, settings, device
        self.loss_fn = loss_fn
        self.sampler = EpochSampler(
            train, settings.seq_len, settings.batch_size, device, settings.seed
        )
        self.val_windows = windows(val, settings.seq_len, settings.eval_max_tokens)
        self.optimizer = make_optimizer(model, settings, device)
        self.schedule = WarmupStableDecay(settings)
        self.autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda"))
        self.step_fn = loss_fn
        self.compiled = False
        if settings.compile and device.startswith("cuda"):
            self.step_fn = torch.compile(loss_fn)
            self.compiled = True
        self.history: list[dict] = []
        self.step_times: list[float] = []
        self.best_loss, self.best_state, self.stale = math.inf, None, 0

    def evaluate(self) -> float:
        self.model.eval()
        with self.autocast:
            loss = mean_loss(
                self.model, self.val_windows, self.settings.eval_batch_size, self.device
            )
        self.model.train()
        return loss

    def train_step(self, step: int) -> tuple[float, float]:
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule.lr(step)
        batch = self.sampler.next()
        with self.autocast:
            try:
                ce, balance = self.step_fn(self.model, batch)
            except Exception as error:  # noqa: BLE001 - compilation problems: run eager instead
                if not self.compiled:
                    raise
                warnings.warn(f"torch.compile failed ({error!r}); training eagerly", stacklevel=1)
                self.step_fn, self.compiled = self.loss_fn, False
                ce, balance = self.loss_fn(self.model, batch)
        loss = ce + self.settings.balance_coef * balance
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.optimizer.step()
        return ce.item(), balance.item()

    def run(self) -> TrainResult:
        s = self.settings
        tokens_per_step = s.batch_size * s.seq_len
        started = time.perf_counter()
        decay_reason = "not reached"
        step, ce, evaluated_at = 0, math.nan, -1
        self.model.train()
        while not self.schedule.finished(step):
            if time.perf_counter() - started > s.time_budget_s * 1.05:
                decay_reason += " (stopped at the time limit)"
                break
            ce, balance = self._timed_step(step)
            step += 1
            if step % s.log_every == 0 or step == 1:
                self._log_step(step, ce, balance, tokens_per_step, time.perf_counter() - started)
            if step % s.eval_every == 0 or self.schedule.finished(step):
                self._evaluate_and_keep_best(step, ce, started)
                evaluated_at = step
            if self.schedule.decay_start is None:
                reason = self._decay_reason(step, time.perf_counter() - started)
                if reason:
                    decay_reason = reason
                    self._begin_decay(step, reason, started)
        if evaluated_at != step:
            self._evaluate_and_keep_best(step, ce, started)
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        step_seconds = self.step_seconds()
        return TrainResult(
            steps=step,
            epochs=round(self.sampler.epochs_done, 2),
            tokens_seen=step * tokens_per_step,
            seconds=round(time.perf_counter() - started, 1),
            tokens_per_second=round(tokens_per_step / step_seconds) if step_seconds else 0,
            best_val_loss=self.best_loss,
            decay_start_step=self.schedule.decay_start,
            decay_reason=decay_reason,
            history=self.history,
        )

    def _evaluate_and_keep_best(self, step: int, train_loss: float, started: float) -> None:
        """Evaluate; remember the best weights and how many evals since a real improvement."""
        val_loss = self.evaluate()
        self.history.append(
            {
                "step": step,
                "epoch": round(self.sampler.epochs_done, 3),
                "train_loss": round(train_loss, 4),
                "val_loss": round(val_loss, 4),
                "lr": self.schedule.lr(step - 1),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        improved = val_loss < self.best_loss - self.settings.min_delta
        if val_loss < self.best_loss:
            self.best_loss, self.best_state = val_loss, _cpu_copy(self.model)
        self.stale = 0 if improved else self.stale + 1
        log(
            f"eval step {step}: val loss {val_loss:.4f} (best {self.best_loss:.4f}, "
            f"stale {self.stale})"
        )

    def _timed_step(self, step: int) -> tuple[float, float]:
        begun = time.perf_counter()
        result = self.train_step(step)  # .item() inside waits for the GPU
        self.step_times.append(time.perf_counter() - begun)
        return result

    def step_seconds(self) -> float:
        """Median seconds per training step (robust to compilation and evaluation pauses)."""
        timed = self.step_times[5:] or self.step_times
        return float(np.median(timed)) if timed else 0.0

    def _decay_reason(self, step: int, elapsed: float) -> str | None:
        s = self.settings
        share = 1 / (1 + s.decay_fraction)  # the stable phase's share of the run
        if self.stale >= s.patience:
            return f"validation loss flat for {self.stale} evals"
        if elapsed >= share * s.time_budget_s:
            return "time budget"
        if self.sampler.epochs_done >= share * s.max_epochs:
            return "epoch limit"
        if s.max_steps is not None and step >= math.floor(share * s.max_steps):
            return "step limit"
        return None

    def _begin_decay(self, step: int, reason: str, started: float) -> None:
        s = self.settings
        remaining = s.time_budget_s - (time.perf_counter() - started)
        step_seconds = self.step_seconds()
        # Fake quantisation (and its recompilation) makes steps slower; leave a margin.
        affordable = int(0.7 * remaining / step_seconds) if step_seconds else 10**9
        if s.max_steps is not None:
            affordable = min(affordable, s.max_steps - step)
        self.schedule.start_decay(step, affordable)
        if s.qat:
            self.model.set_fake_quantize(True)
        # The exported weights are the best of the decay phase (fake-quantised, if QAT is on).
        self.best_loss, self.best_state, self.stale = math.inf, None, 0
        qat = ", MXFP4 fake-quantised experts" if s.qat else ""
        log(f"decay starts at step {step} ({reason}) for {self.schedule.decay_steps} steps{qat}")

    def _log_step(self, step: int, ce: float, balance: float, tokens: int, elapsed: float) -> None:
        seconds = self.step_seconds()
        speed = f"{tokens / seconds / 1e3:.0f}k tok/s" if seconds else "warming up"
        log(
            f"step {step} epoch {self.sampler.epochs_done:.2f} loss {ce:.4f} "
            f"balance {balance:.3f} lr {self.schedule.lr(step - 1):.2e} {speed} "
            f"elapsed {elapsed:.0f}s"
        )


def _cpu_copy(model: MiniGptOss) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


# --- Samples and the model card ----------------------------------------------------------------


SAMPLE_PROMPTS = {
    "chat": (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\n\nReasoning: low\n\n# Valid channels: analysis, commentary, "
        "final. Channel must be included for every message.<|end|><|start|>user<|message|>"
        "What does `os.path.join` do?<|end|><|start|>assistant"
    ),
    "code": "def fibonacci(n):\n",
}


@torch.no_grad()
def greedy_samples(checkpoint: Path, device: str, max_new_tokens: int = 96) -> dict[str, str]:
    """Greedy continuations by transformers' generate() on the shipped checkpoint."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = load_hf_model(checkpoint, device, dtype)
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    samples = {}
    for name, prompt in SAMPLE_PROMPTS.items():
        ids = torch.tensor([tokenizer.encode(prompt).ids], device=device)
        out = model.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=generation["eos_token_id"],
            pad_token_id=generation["pad_token_id"],
        )
        samples[name] = tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=False)
    return samples


def fill_model_card(metrics: dict, out: Path, template: Path = CARD_TEMPLATE) -> None:
    """README.md in the checkpoint folder: the template with the measured numbers put in."""
    if not template.is_file():
        return
    text = template.read_text()
    for key, value in _flatten(metrics).items():
        text = text.replace("{{" + key + "}}", str(value))
    (out / "README.md").write_text(text)


def _flatten(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        flat: dict[str, object] = {}
        for key, inner in value.items():
            flat |= _flatten(inner, f"{prefix}{key}.")
        return flat
    if isinstance(value, float):
        value = f"{value:.4g}"
    return {prefix.rstrip("."): value}


# --- Pipeline ----------------------------------------------------------------------------------


def run_pipeline(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    config, settings = _configs(args)
    work = args.work or Path(tempfile.gettempdir()) / f"gossamer-{args.preset}"
    torch.manual_seed(settings.seed)

    manifest, token_summary = prepare_data(args, work, config.vocab_size)
    log(f"data ready in {time.perf_counter() - started:.0f}s")
    teacher = args.target if settings.distill else None
    model, result = train_model(config, settings, work / "tokens", device, teacher)
    notes = {"corpus_python": manifest.python_version}
    if args.target is not None:
        notes["draft_for"] = args.target.name
    bf16_dir, size = ship(model, work, args, notes)
    measured = measure(args.out, bf16_dir, work / "tokens", settings, device, args.tiny)
    if args.target is not None:
        measured |= measure_agreement(args.out, args.target, work / "tokens", settings, device)

    metrics = {
        "date": time.strftime("%Y-%m-%d"),
        "device": _device_name(device),
        "software": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "tokenizers": _version("tokenizers"),
        },
        "corpus": {
            "python": manifest.python_version,
            "files": {k: v.files for k, v in manifest.splits.items()},
            "chats": {k: v.chat_documents for k, v in manifest.splits.items()},
            "tokens": {k: v["tokens"] for k, v in token_summary["splits"].items()},
        },
        "model": asdict(config) | {"parameters": sum(p.numel() for p in model.parameters())},
        **({"target": target_description(args.target)} if args.target is not None else {}),
        "settings": asdict(settings),
        "training": {k: v for k, v in asdict(result).items() if k != "history"},
        "history": result.history,
        **measured,
        "checkpoint_bytes": size,
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    fill_model_card(metrics, args.out, DRAFT_CARD_TEMPLATE if args.target else CARD_TEMPLATE)
    log(f"done in {metrics['total_seconds']}s: {args.out}")
    return metrics


def prepare_data(args: argparse.Namespace, work: Path, vocab_size: int):
    """Corpus from the stdlib, tokenizer, token streams (all under `work`)."""
    log(f"corpus from {args.stdlib or sysconfig.get_paths()['stdlib']}")
    manifest = build_corpus(work / "corpus", args.stdlib, max_files=args.max_files)
    log(f"corpus: {json.dumps({k: asdict(v) for k, v in manifest.splits.items()})}")
    if args.target is None:
        token_summary = build_token_data(work / "corpus", work / "tokens", vocab_size)
    else:  # a draft model must share its target's tokenizer: copied, not trained
        tokenizer = args.target / "tokenizer.json"
        token_summary = build_token_data_with(tokenizer, work / "corpus", work / "tokens")
    log(f"tokens: {json.dumps(token_summary['splits'])}")
    return manifest, token_summary


def train_model(
    config: MiniConfig,
    settings: TrainSettings,
    tokens: Path,
    device: str,
    teacher: Path | None = None,
) -> tuple[MiniGptOss, TrainResult]:
    """`teacher`: the checkpoint a draft model distils from (settings.distill > 0)."""
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    model = MiniGptOss(config, dropout=settings.dropout)
    init_weights(model, seed=settings.seed)
    model.to(device)
    count = sum(p.numel() for p in model.parameters())
    log(f"model: {count / 1e6:.2f}M parameters, {json.dumps(asdict(config))}")
    log(f"settings: {json.dumps(asdict(settings))}")
    loss_fn = loss_terms
    if settings.distill:
        log(f"distilling from {teacher} (weight {settings.distill})")
        loss_fn = distillation_terms(load_mini(teacher, device), settings.distill)
    train, val = np.load(tokens / "train.npy"), np.load(tokens / "val.npy")
    trainer = Trainer(model, settings, train, val, device, loss_fn)
    result = trainer.run()
    log(
        f"trained {result.steps} steps, {result.epochs} epochs in {result.seconds}s "
        f"({result.tokens_per_second} tokens/s); best val {result.best_val_loss:.4f}"
    )
    model.eval()
    model.set_fake_quantize(False)  # export the master weights; MXFP4 packing quantises them
    return model, result


def ship(model: MiniGptOss, work: Path, args: argparse.Namespace, notes: dict) -> tuple[Path, int]:
    """bf16 checkpoint under work/, then the MXFP4 one at args.out; returns (bf16 dir, bytes)."""
    extra = {"gossamer_mini": notes}
    bf16_dir = export_bf16(model, work / "tokens" / "tokenizer.json", work / "bf16", extra)
    if args.out.exists():
        shutil.rmtree(args.out)
    shard_bytes = None if args.max_shard_mb is None else int(args.max_shard_mb * 1e6)
    convert_to_mxfp4(bf16_dir, args.out, shard_bytes)
    size = folder_bytes(args.out)
    log(f"checkpoint {args.out}: {size / 1e6:.2f} MB")
    if size > MAX_FOLDER_BYTES:
        log(f"WARNING: {size / 1e6:.2f} MB is over the {MAX_FOLDER_BYTES / 1e6:.0f} MB budget")
    return bf16_dir, size


def measure(
    out: Path, bf16_dir: Path, tokens: Path, settings: TrainSettings, device: str, tiny: bool
) -> dict:
    """Held-out losses (transformers) and greedy samples. A failure here is logged and recorded,
    not raised: the checkpoint is already written and is what a long run must not lose."""
    evals: dict[str, dict] = {}
    runs = {"val": (out, "val"), "test": (out, "test"), "val_bf16": (bf16_dir, "val")}
    for name, (checkpoint, split) in runs.items():
        try:
            evals[name] = evaluate_checkpoint(
                checkpoint,
                tokens,
                split,
                device=device,
                seq_len=settings.seq_len,
                batch_size=settings.eval_batch_size,
                max_tokens=settings.eval_max_tokens,
            )
            result = evals[name]
            log(
                f"{name}: loss {result['loss']:.4f} ppl {result['perplexity']:.2f} "
                f"bits/byte {result['bits_per_byte']:.3f} (transformers)"
            )
        except Exception:  # noqa: BLE001
            evals[name] = {"error": traceback.format_exc()}
            log(f"{name}: evaluation failed\n{evals[name]['error']}")
    try:
        samples = greedy_samples(out, device, max_new_tokens=32 if tiny else 96)
        for name, text in samples.items():
            log(f"sample ({name}): {text!r}")
    except Exception:  # noqa: BLE001
        samples = {"error": traceback.format_exc()}
        log(f"samples failed\n{samples['error']}")
    return {"eval": evals, "samples": samples}


def measure_agreement(
    out: Path, target: Path, tokens: Path, settings: TrainSettings, device: str
) -> dict:
    """A draft's top-1 agreement with its target on the test split; logged and recorded, not
    raised, as in measure()."""
    try:
        agreement = top1_agreement(
            out,
            target,
            tokens,
            "test",
            device=device,
            seq_len=settings.seq_len,
            batch_size=settings.eval_batch_size,
            max_tokens=settings.eval_max_tokens,
        )
        log(f"top-1 agreement with {target.name} (test): {agreement['top1_agreement']:.4f}")
    except Exception:  # noqa: BLE001
        agreement = {"error": traceback.format_exc()}
        log(f"agreement failed\n{agreement['error']}")
    return {"agreement": agreement}


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return platform.processor() or "cpu"


def _configs(args: argparse.Namespace) -> tuple[MiniConfig, TrainSettings]:
    config, settings = (TINY_MODEL, TINY_SETTINGS) if args.tiny else PRESETS[args.preset]
    if args.target is not None:  # a draft's embedding rows are its target's token ids
        config = replace(config, vocab_size=ModelConfig.from_hf(args.target).vocab_size)
    overrides = {
        name: getattr(args, name)
        for name in (
            "max_steps",
            "time_budget_s",
            "seq_len",
            "batch_size",
            "lr",
            "seed",
            "eval_every",
            "eval_max_tokens",
            "dropout",
            "distill",
        )
        if getattr(args, name) is not None
    }
    if args.no_compile:
        overrides["compile"] = False
    if args.no_qat:
        overrides["qat"] = False
    settings = replace(settings, **overrides)
    if not 0 <= settings.distill <= 1:
        raise SystemExit(f"--distill is a weight in [0, 1], got {settings.distill}")
    if settings.distill and args.target is None:
        raise SystemExit("--distill needs a teacher: --target DIR (or --preset draft)")
    return config, settings


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="final checkpoint folder")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="mini", help="draft: a draft for --target"
    )
    parser.add_argument(
        "--target",
        type=Path,
        default=None,
        help="train a draft model for this checkpoint, on its tokenizer (default with --preset "
        "draft: the built-in gpt-oss-mini)",
    )
    parser.add_argument(
        "--distill", type=float, default=None, help="weight of the target's distribution, 0..1"
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="corpus, tokens, bf16 checkpoint (default: TMP)"
    )
    parser.add_argument("--stdlib", type=Path, default=None, help="default: this Python's")
    parser.add_argument(
        "--tiny", action="store_true", help="tiny model and corpus (CPU smoke test)"
    )
    parser.add_argument("--max-files", type=int, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dropout", type=float, default=None)
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--eval-max-tokens", type=int, default=None)
    parser.add_argument("--max-shard-mb", type=float, default=None, help="split the weights")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-qat", action="store_true")
    args = parser.parse_args(argv)
    if args.preset == "draft" and args.target is None:
        args.target = default_model_path()
    if args.tiny and args.max_files is None:
        args.max_files = 12
    threads = torch.get_num_threads()
    if args.tiny:
        torch.set_num_threads(1)  # tiny shapes: threads only add synchronisation
    try:
        run_pipeline(args)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    sys.exit(main())
