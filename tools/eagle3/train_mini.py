"""Train an EAGLE-3 draft head for gpt-oss-mini from the model's own hidden states, then measure
its acceptance in Gossamer's engine on held-out prompts.

    # one GPU, about 3 minutes in all (see tools/eagle3/README.md):
    python -m tools.eagle3.train_mini --out /tmp/eagle3-mini
    # CPU smoke test, seconds:
    python -m tools.eagle3.train_mini --out /tmp/e3 --tiny

Pipeline: the gpt-oss-mini corpus (tools/mini/corpus.py: stdlib source + Harmony chats, split by
file) tokenized with the model's own tokenizer -> the target run over training windows (batched
prefill through gossamer's model, `aux_layers` as the engine passes them) for its aux hidden states
and next-token logits -> the draft vocabulary (the tokens the target predicts most often) ->
training-time test (tools/eagle3/head.py) with AdamW under bf16 autocast -> the published EAGLE-3
layout (config.json + model.safetensors) -> the engine, greedy, with and without the head: the
spec stats (mean accepted length, acceptance per draft position) and whether outputs agree.
Writes OUT/head/ and OUT/summary.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.model.gpt_oss import GptOssForCausalLM
from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.ops.base import AttentionMetadata
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.eagle3 import Eagle3Config
from tools.eagle3.head import DraftHead, eagle3_hf_config
from tools.mini.corpus import SPLITS, build_corpus, read_documents
from tools.mini.evaluate import windows
from tools.mini.tokenizer import encode_split
from tools.mini.train import EpochSampler

CHAT_REPLY = "<|start|>assistant"  # a chat prompt ends here; the model writes the reply


@dataclass(frozen=True)
class Settings:
    # head
    aux_layers: tuple[int, ...] = (1, 3, 5)  # residual stream entering these target layers
    draft_vocab_size: int = 4096  # 96% of the target's top-1 predictions (2048: 89%)
    intermediate_size: int = 1024
    # training
    seq_len: int = 512
    batch_size: int = 32
    ttt_steps: int = 5
    loss: str = "kl"  # "kl": the target's distribution over the draft vocab; "argmax": its top-1
    step_decay: float = 0.8  # weight of TTT step j: decay ** j
    lr: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_steps: int = 4000
    time_budget_s: float = 100.0  # the training loop
    vocab_sample_batches: int = 16  # batches of target predictions counted for the draft vocab
    val_max_tokens: int = 65536
    seed: int = 0
    # evaluation in the engine
    eval_prompts: int = 64
    eval_prompt_len: int = 128  # code prompts; chat prompts end where the reply starts
    eval_max_tokens: int = 128
    num_speculative_tokens: int = 5
    exact_prompts: int = 4  # float32 prompts for the exactness check on the GPU
    exact_max_tokens: int = 32


TINY = Settings(
    draft_vocab_size=1024,
    intermediate_size=128,
    seq_len=64,
    batch_size=4,
    ttt_steps=3,
    lr=3e-3,
    warmup_steps=2,
    max_steps=8,
    vocab_sample_batches=2,
    val_max_tokens=512,
    eval_prompts=3,
    eval_prompt_len=24,
    eval_max_tokens=12,
    num_speculative_tokens=3,
    exact_prompts=2,
    exact_max_tokens=8,
)


def log(message: str) -> None:
    tqdm.write(f"[{time.strftime('%H:%M:%S')}] {message}")


# --- Data ----------------------------------------------------------------------------------------


def prepare_data(
    work: Path, model_dir: Path, stdlib: Path | None, max_files: int | None
) -> tuple[dict[str, np.ndarray], Path]:
    """The gpt-oss-mini corpus, tokenized with the model's tokenizer: ({split: uint16 stream},
    corpus folder)."""
    corpus = work / "corpus"
    manifest = build_corpus(corpus, stdlib, max_files=max_files)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    streams = {split: encode_split(tokenizer, corpus / f"{split}.jsonl")[0] for split in SPLITS}
    counts = {split: len(stream) for split, stream in streams.items()}
    log(f"corpus (Python {manifest.python_version} stdlib): tokens {counts}")
    return streams, corpus


def heldout_prompts(corpus: Path, model_dir: Path, count: int, code_len: int) -> list[list[int]]:
    """Prompts from the test split, half chats (cut where the assistant's reply starts), half
    code (`code_len` tokens at evenly spaced offsets of the test code), interleaved."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    documents = list(read_documents(corpus / "test.jsonl"))
    chats = [d["text"] for d in documents if d["kind"] == "chat" and CHAT_REPLY in d["text"]]
    chats = [
        text[: text.index(CHAT_REPLY) + len(CHAT_REPLY)] for text in _spread(chats, count // 2)
    ]
    code = [
        t
        for d in documents
        if d["kind"] == "code"
        for t in tokenizer.encode(d["text"], add_special_tokens=False).ids
    ]
    starts = np.linspace(0, max(0, len(code) - code_len), count - len(chats)).astype(int)
    chat_prompts = [tokenizer.encode(text, add_special_tokens=False).ids for text in chats]
    code_prompts = [code[start : start + code_len] for start in starts]
    mixed = itertools.zip_longest(chat_prompts, code_prompts)
    return [prompt for pair in mixed for prompt in pair if prompt is not None]


def _spread(items: list, count: int) -> list:
    if count <= 0 or not items:
        return []
    index = np.linspace(0, len(items) - 1, min(count, len(items))).round().astype(int)
    return [items[i] for i in index]


# --- The target's features -----------------------------------------------------------------------


class TargetFeatures:
    """Runs the target (gossamer's model, as the engine does) over equal-length windows in one
    batched prefill and returns the EAGLE-3 aux hidden states and the next-token logits."""

    def __init__(self, model: GptOssForCausalLM, aux_layers: tuple[int, ...], block_size: int = 16):
        self.model = model
        self.aux_layers = aux_layers
        self.block_size = block_size
        self.kv_cache: torch.Tensor | None = None
        self._metadata: dict[tuple[int, int], AttentionMetadata] = {}

    @torch.no_grad()
    def __call__(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """token_ids [B, W] -> (aux [B, W, 3 * H], logits [B, W, vocab] float32)."""
        batch, length = token_ids.shape
        model = self.model
        metadata = self._batch_metadata(batch, length)
        positions = torch.arange(length, device=model.device).repeat(batch)
        hidden, aux = model(
            token_ids.flatten().to(model.device),
            positions,
            metadata,
            self.kv_cache,
            aux_layers=self.aux_layers,
        )
        logits = model.compute_logits(hidden)
        return torch.cat(aux, dim=-1).view(batch, length, -1), logits.view(batch, length, -1)

    def _batch_metadata(self, batch: int, length: int) -> AttentionMetadata:
        """Prefill metadata for `batch` sequences of `length` tokens; each sequence owns its own
        blocks in every cache group (block 0 is the null block)."""
        key = (batch, length)
        if key not in self._metadata:
            groups, size = self.model.num_cache_groups, self.block_size
            per_seq = -(-length // size)
            num_blocks = 1 + groups * batch * per_seq
            if self.kv_cache is None or self.kv_cache.shape[2] < num_blocks:
                self.kv_cache = self.model.allocate_kv_cache(num_blocks, size)
            first = 1 + torch.arange(groups * batch).view(groups, batch, 1) * per_seq
            tables = first + torch.arange(per_seq)  # [groups, batch, blocks per sequence]
            positions = torch.arange(length)
            slots = tables[:, :, positions // size] * size + positions % size
            device = self.model.device
            self._metadata[key] = AttentionMetadata(
                query_start_loc=(torch.arange(batch + 1, dtype=torch.int32) * length).to(device),
                seq_lens=torch.full((batch,), length, dtype=torch.int32, device=device),
                slot_mapping=tuple(s.flatten().to(device) for s in slots),
                block_tables=tuple(t.to(device, torch.int32) for t in tables),
                max_query_len=length,
                max_seq_len=length,
                query_lens_host=(length,) * batch,
                seq_lens_host=(length,) * batch,
            )
        return self._metadata[key]


def choose_draft_vocab(
    features: TargetFeatures, sampler: EpochSampler, batches: int, size: int, train: np.ndarray
) -> tuple[torch.Tensor, float]:
    """The `size` tokens the target predicts most often on training windows (ties: the more
    frequent in the corpus), ascending, and the share of those predictions they cover."""
    vocab = features.model.config.vocab_size
    predicted = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(batches):
        _, logits = features(sampler.next())
        predicted += torch.bincount(logits.argmax(-1).flatten().cpu(), minlength=vocab)
    corpus = torch.from_numpy(np.bincount(train, minlength=vocab).astype(np.float64))
    score = predicted + corpus / (corpus.sum() + 1)
    draft_ids = score.topk(min(size, vocab)).indices.sort().values
    coverage = float(predicted[draft_ids].sum() / predicted.sum().clamp(min=1))
    return draft_ids, coverage


# --- Training ------------------------------------------------------------------------------------


def ttt_loss(
    head: DraftHead,
    draft_logits: list[torch.Tensor],  # per step [B, L, draft_vocab]
    target_logits: torch.Tensor,  # [B, W, vocab]
    kind: str,
    decay: float,
) -> tuple[torch.Tensor, list[float], list[float]]:
    """(weighted loss, loss per step, top-1 agreement with the target per step). Step j's row p
    is compared with the target's prediction at position p + 1 + j; rows whose target top-1 is
    outside the draft vocabulary carry no loss (the head cannot propose it)."""
    total, weights, losses, matches = 0.0, 0.0, [], []
    for j, logits in enumerate(draft_logits):
        target = target_logits[:, 1 + j : 1 + j + logits.shape[1]]
        top = target.argmax(-1)
        inside = head.t2d[top].float()
        log_q = logits.float().log_softmax(-1)
        if kind == "kl":
            p = target[..., head.draft_ids].softmax(-1)
            per_row = -(p * log_q).sum(-1)
        else:
            per_row = -log_q.gather(-1, head.draft_index[top].clamp(min=0)[..., None])[..., 0]
        step_loss = (per_row * inside).sum() / inside.sum().clamp(min=1)
        total, weights = total + decay**j * step_loss, weights + decay**j
        losses.append(step_loss.item())
        matches.append(float((head.draft_ids[logits.argmax(-1)] == top).float().mean()))
    return total / weights, losses, matches


def lr_at(settings: Settings, step: int, progress: float) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak as `progress` (the larger of the
    step and time fractions used) goes from 0 to 1."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    return settings.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_head(
    head: DraftHead, features: TargetFeatures, sampler: EpochSampler, settings: Settings
) -> list[dict]:
    """The training loop; returns its history (one entry per logged step)."""
    device = head.lm_head.weight.device
    optimizer = torch.optim.AdamW(
        head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay
    )
    history: list[dict] = []
    started = time.perf_counter()
    log_every = max(1, settings.max_steps // 50)
    progress_bar = tqdm(range(settings.max_steps), desc="eagle3", mininterval=2.0)
    for step in progress_bar:
        progress = max(
            step / settings.max_steps, (time.perf_counter() - started) / settings.time_budget_s
        )
        if progress >= 1.0:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(settings, step, progress)
        token_ids = sampler.next()
        aux, target_logits = features(token_ids)
        with _autocast(device):
            draft_logits = head.unroll(token_ids, aux, settings.ttt_steps)
        loss, losses, matches = ttt_loss(
            head, draft_logits, target_logits, settings.loss, settings.step_decay
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), settings.grad_clip)
        optimizer.step()
        progress_bar.set_postfix(
            loss=f"{loss.item():.3f}", match0=f"{matches[0]:.2f}", refresh=False
        )
        if step % log_every == 0 or step == settings.max_steps - 1:
            history.append(_history_entry(step, loss, losses, matches, started))
    progress_bar.close()
    if history and history[-1]["step"] != step:
        history.append(_history_entry(step, loss, losses, matches, started))
    return history


def _history_entry(step, loss, losses, matches, started) -> dict:
    return {
        "step": step + 1,
        "loss": round(loss.item(), 4),
        "step_losses": [round(x, 4) for x in losses],
        "step_match": [round(x, 4) for x in matches],
        "seconds": round(time.perf_counter() - started, 1),
    }


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def evaluate_head(
    head: DraftHead, features: TargetFeatures, batches: torch.Tensor, settings: Settings
) -> dict:
    """Teacher-forced loss and top-1 agreement per TTT step on held-out windows."""
    device = head.lm_head.weight.device
    losses, matches = [], []
    for start in range(0, len(batches), settings.batch_size):
        token_ids = batches[start : start + settings.batch_size].to(device)
        aux, target_logits = features(token_ids)
        with _autocast(device):
            draft_logits = head.unroll(token_ids, aux, settings.ttt_steps)
        _, step_losses, step_matches = ttt_loss(
            head, draft_logits, target_logits, settings.loss, settings.step_decay
        )
        losses.append(step_losses)
        matches.append(step_matches)
    return {
        "step_losses": np.mean(losses, axis=0).round(4).tolist(),
        "step_match": np.mean(matches, axis=0).round(4).tolist(),
    }


def build_head(
    model: GptOssForCausalLM, settings: Settings, draft_ids: torch.Tensor
) -> tuple[DraftHead, dict]:
    """A fresh head and its config.json. Its LM head and final norm start as the target's (rows
    of the draft vocabulary): the head learns to stand in for the target's last hidden state, so
    the target's unembedding is a far better start than noise."""
    cfg = model.config
    hf_config = eagle3_hf_config(
        vocab_size=cfg.vocab_size,
        draft_vocab_size=len(draft_ids),
        hidden_size=cfg.hidden_size,
        aux_layer_ids=settings.aux_layers,
        intermediate_size=settings.intermediate_size,
        max_position_embeddings=model.max_model_len,
    )
    config = Eagle3Config.from_hf(hf_config)
    config.aux_layers(cfg.num_hidden_layers)  # raises on layers the target does not have
    embedding = model.model.embed_tokens.weight
    head = DraftHead(config, embedding, draft_ids, model.max_model_len).to(model.device)
    with torch.no_grad():
        head.lm_head.weight.copy_(model.lm_head.weight[head.draft_ids].float())
        head.norm.weight.copy_(model.model.norm.weight.float())
    return head, hf_config


# --- Evaluation in the engine --------------------------------------------------------------------


def generate(
    model: GptOssForCausalLM,
    prompts: list[list[int]],
    max_tokens: int,
    spec: SpecConfig | None,
    max_num_seqs: int = 256,
) -> tuple[list[list[int]], dict[str, float], float]:
    """Greedy outputs of EngineCore, its spec stats and the wall seconds."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    longest = max(len(p) for p in prompts) + max_tokens + 2 * 32
    num_blocks = 2 * len(prompts) * -(-longest // 16) + 16
    # eager on both sides: the EAGLE-3 target runner always is (it returns the aux states)
    config = EngineConfig(
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        cuda_graphs=False,
        speculative_config=spec,
    )
    engine = EngineCore(model, None, config)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
    seconds = time.perf_counter() - started
    return [outputs[str(i)] for i in range(len(prompts))], engine.stats.spec_stats, seconds


def compare_outputs(plain: list[list[int]], spec: list[list[int]]) -> dict:
    """How many outputs are identical, and where the others first part."""
    parts = [_first_difference(a, b) for a, b in zip(plain, spec, strict=True)]
    return {
        "identical": sum(p is None for p in parts),
        "total": len(parts),
        "first_difference_at": [p for p in parts if p is not None],
    }


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def engine_report(
    model: GptOssForCausalLM, head_dir: Path, prompts: list[list[int]], settings: Settings
) -> dict:
    """Acceptance of the head on held-out prompts, and output agreement with plain decoding."""
    spec = SpecConfig(
        method="eagle3",
        model=str(head_dir),
        num_speculative_tokens=settings.num_speculative_tokens,
        min_acceptance_rate=0.0,  # never switch the head off: measure it everywhere
    )
    plain, _, plain_seconds = generate(model, prompts, settings.eval_max_tokens, None)
    drafted, stats, spec_seconds = generate(model, prompts, settings.eval_max_tokens, spec)
    positions = [
        round(stats[f"acceptance_rate_pos_{i}"], 4) for i in range(settings.num_speculative_tokens)
    ]
    report = {
        "prompts": len(prompts),
        "max_tokens": settings.eval_max_tokens,
        "num_speculative_tokens": settings.num_speculative_tokens,
        "mean_accepted_length": round(stats["mean_accepted_length"], 4),
        "acceptance_rate": round(stats["acceptance_rate"], 4),
        "acceptance_rate_per_position": positions,
        "num_drafts": stats["num_drafts"],
        "generated_tokens": sum(map(len, drafted)),
        "outputs_vs_plain": compare_outputs(plain, drafted),
        "eager_seconds": {"plain": round(plain_seconds, 2), "eagle3": round(spec_seconds, 2)},
    }
    if model.dtype != torch.float32:
        # the yardstick for outputs_vs_plain: bf16 plain decoding against itself in smaller
        # batches, which changes only the GEMM shapes and so the rounding
        small, _, _ = generate(model, prompts, settings.eval_max_tokens, None, max_num_seqs=8)
        report["plain_vs_plain_in_batches_of_8"] = compare_outputs(plain, small)
    return report


def exactness_check(
    model_dir: Path, head_dir: Path, prompts: list[list[int]], settings: Settings, device: str
) -> dict:
    """Greedy outputs with and without the head in float32 (torch ops), where verification is
    exact; bf16 outputs may part after a near tie (tests/spec/test_spec_gpu.py)."""
    model = load_model(
        str(model_dir), dtype="float32", device=device, ops="torch", max_model_len=1024
    ).model
    spec = SpecConfig(
        method="eagle3", model=str(head_dir), num_speculative_tokens=settings.num_speculative_tokens
    )
    plain, _, _ = generate(model, prompts, settings.exact_max_tokens, None)
    drafted, stats, _ = generate(model, prompts, settings.exact_max_tokens, spec)
    return compare_outputs(plain, drafted) | {"num_accepted_tokens": stats["num_accepted_tokens"]}


# --- Pipeline ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    settings = _settings(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(settings.seed)
    model_dir = Path(args.model) if args.model else default_model_path()
    work = args.work or Path(tempfile.mkdtemp(prefix="eagle3-mini-"))
    streams, corpus = prepare_data(work, model_dir, args.stdlib, args.max_files)
    data_seconds = time.perf_counter() - started

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    max_len = max(settings.seq_len + 1, settings.eval_prompt_len * 4 + settings.eval_max_tokens)
    model = load_model(
        str(model_dir), dtype=dtype, device=device, max_model_len=_round_up(max_len, 256)
    ).model
    features = TargetFeatures(model, settings.aux_layers)
    sampler = EpochSampler(
        streams["train"], settings.seq_len, settings.batch_size, device, settings.seed
    )
    draft_ids, coverage = choose_draft_vocab(
        features,
        sampler,
        settings.vocab_sample_batches,
        settings.draft_vocab_size,
        streams["train"],
    )
    log(f"draft vocabulary: {len(draft_ids)} tokens cover {coverage:.2%} of target predictions")
    head, hf_config = build_head(model, settings, draft_ids)
    val = windows(streams["val"], settings.seq_len, settings.val_max_tokens)
    val_before = evaluate_head(head, features, val, settings)
    train_started = time.perf_counter()
    history = train_head(head, features, sampler, settings)
    train_seconds = time.perf_counter() - train_started
    val_after = evaluate_head(head, features, val, settings)
    log(f"held-out (val) top-1 agreement per step: {val_after['step_match']}")
    head_dir = head.save(args.out / "head", hf_config)
    del features, head  # free the training activations' memory before the engine runs

    prompts = heldout_prompts(corpus, model_dir, settings.eval_prompts, settings.eval_prompt_len)
    engine = engine_report(model, head_dir, prompts, settings)
    log(f"engine: {json.dumps({k: engine[k] for k in list(engine)[:7]})}")
    exact = exactness_check(
        model_dir, head_dir, prompts[: settings.exact_prompts], settings, device
    )
    log(f"float32 exactness: {exact}")
    summary = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "software": {"python": platform.python_version(), "torch": torch.__version__},
        "target": str(model_dir),
        "settings": asdict(settings),
        "corpus_tokens": {split: int(len(stream)) for split, stream in streams.items()},
        "draft_vocab": {"size": len(draft_ids), "coverage_of_target_top1": round(coverage, 4)},
        "training": {
            "steps": history[-1]["step"] if history else 0,
            "seconds": round(train_seconds, 1),
            "tokens_per_step": settings.batch_size * (settings.seq_len + 1),
            "first": history[0] if history else None,
            "last": history[-1] if history else None,
        },
        "val_teacher_forced": {"before": val_before, "after": val_after},
        "engine_heldout": engine,
        "exact_float32": exact,
        "data_seconds": round(data_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
        "head": str(head_dir),
        "history": history,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _settings(args: argparse.Namespace) -> Settings:
    settings = TINY if args.tiny else Settings()
    overrides = {
        name: getattr(args, name)
        for name in (
            "draft_vocab_size",
            "seq_len",
            "batch_size",
            "ttt_steps",
            "loss",
            "lr",
            "time_budget_s",
            "eval_prompts",
            "eval_max_tokens",
            "num_speculative_tokens",
            "seed",
        )
        if getattr(args, name) is not None
    }
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    if args.aux_layers is not None:
        overrides["aux_layers"] = tuple(int(x) for x in args.aux_layers.split(","))
    return replace(settings, **overrides)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="head/ and summary.json go here")
    parser.add_argument("--model", default=None, help="target folder (default: gpt-oss-mini)")
    parser.add_argument("--work", type=Path, default=None, help="corpus folder (default: TMP)")
    parser.add_argument("--stdlib", type=Path, default=None, help="default: this Python's")
    parser.add_argument("--max-files", type=int, default=None, help="a smaller corpus")
    parser.add_argument("--device", default=None)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke-test settings")
    parser.add_argument("--steps", type=int, default=None, help="at most this many steps")
    parser.add_argument("--time-budget-s", type=float, default=None, help="training loop limit")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--ttt-steps", type=int, default=None, help="unrolled draft steps")
    parser.add_argument("--draft-vocab-size", type=int, default=None)
    parser.add_argument("--aux-layers", default=None, help="three target layers, e.g. 1,3,5")
    parser.add_argument("--loss", choices=("kl", "argmax"), default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--eval-prompts", type=int, default=None)
    parser.add_argument("--eval-max-tokens", type=int, default=None)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    if args.tiny and args.max_files is None:
        args.max_files = 12
    args.out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if args.tiny:
        torch.set_num_threads(1)  # tiny shapes: more threads only add synchronisation
    try:
        summary = run(args)
    finally:
        torch.set_num_threads(threads)
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2))
    return summary


if __name__ == "__main__":
    main()
