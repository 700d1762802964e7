"""Pre-train or fine-tune the one backbone with any of the four papers' objectives.

    python train.py --objective pmlm                                  # the main job: tiny model, embedded corpus,
                                                                      # a few minutes on a laptop CPU
    torchrun --nproc_per_node 2 train.py --objective pmlm             # the same on 2 processes (DDP)
    torchrun --nproc_per_node 8 train.py --objective pmlm --preset base --batch_size 32 --data corpus_dir/
    python train.py --task seq2seq --init_from out/pmlm-pretrain/ckpt.pt --data train.jsonl   # fine-tune
    python train.py --objective unilm --resume                        # continue out/unilm-pretrain exactly

Every setting is a `--key value` flag (nanoGPT style, one mechanism): the training settings in TRAIN below, any
model.ModelConfig field (`--n_layer 4 --attn_impl naive`), and the chosen objective's own options (its class's
`options`). An unknown key is an error that lists the known ones.

What happens: the WordPiece vocabulary and the tokenized corpus are built on first use and cached (data.py);
passages (pre-training) or (source, target) pairs (fine-tuning) become batches through the objective; AdamW with
linear warmup then linear decay; gradient accumulation and clipping; bf16 autocast on CUDA; periodic evaluation
on the held-out split; a tqdm bar with loss, lr, tokens/s and MFU; a jsonl metrics log; atomic checkpoints holding
everything `--resume` needs to continue exactly. Under torchrun (RANK in the environment) it runs DDP: NCCL on
GPUs, gloo on CPUs, each rank its own shard of every epoch, gradients synced on the last micro-step only, and
only rank 0 logs and writes.

Left out: multi-node launching (torchrun's own --nnodes does it), FSDP/tensor parallelism, mixed fp16 loss scaling.
"""
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import data
import model as M
from generate import read_checkpoint
from objectives import OBJECTIVES, get_objective
from tokenizer import WordPiece

# ---------------------------------------------------------------------------------------------------------------
# Settings

TRAIN = dict(
    objective="pmlm",        # unilm | pmlm | ernie_gen | palm
    task="pretrain",         # pretrain | seq2seq
    preset="tiny",           # tiny | small | base (model.PRESETS); ModelConfig fields override it
    data="",                 # pretrain: a text file/folder (blank line between documents); seq2seq: jsonl or
                             # parallel files (data.read_seq2seq); "" = the embedded CPython-docs corpus / task
    init_from="",            # a checkpoint to start from (fine-tuning): model weights and vocabulary
    vocab="",                # a vocab.txt to use instead of training one
    out_dir="",              # "" = out/<objective>-<task>
    resume=False,            # continue from out_dir/ckpt.pt exactly where it stopped
    vocab_size=8192,
    seq_len=0,               # passage / source budget in tokens; 0 = 128 (tiny) or the model's max_position
    batch_size=32,           # per rank and micro-step
    grad_accum=1,
    max_steps=600,
    stop_at=0,               # stop after this step as if interrupted (checkpoint kept; for tests and time boxes)
    time_limit=0.0,          # minutes; stop at the next log step after this much training time (checkpoint kept)
    lr=2e-3,
    warmup_steps=-1,         # -1 = 5% of max_steps
    min_lr_frac=0.0,         # linear decay to lr * min_lr_frac
    weight_decay=0.01,
    beta2=0.98,
    grad_clip=1.0,
    label_smoothing=-1.0,    # -1 = 0.1 when fine-tuning (the papers' setting), 0 when pre-training
    eval_interval=200,
    eval_batches=10,
    log_interval=10,
    ckpt_interval=200,
    seed=1337,
    device="auto",           # auto | cpu | cuda | cuda:N
    compile=False,
    cache_dir=".cache",
    progress=True,
)


def parse_value(text, default, key):
    """Turn a command-line string into the type of the default."""
    if isinstance(default, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise SystemExit(f"--{key} expects true/false, got {text!r}")
    try:
        return type(default)(text) if default is not None else text
    except ValueError:
        raise SystemExit(f"--{key} expects a {type(default).__name__}, got {text!r}")


def split_argv(argv):
    """['--a', '1', '--b=2', '--flag'] -> {'a': '1', 'b': '2', 'flag': None}."""
    pairs, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise SystemExit(f"expected --key value, got {arg!r}")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            i += value is not None
        pairs[key.replace("-", "_")] = value
        i += 1
    return pairs


def parse_args(argv):
    """-> (train settings, model overrides, objective options); unknown keys raise, listing the known ones."""
    raw = split_argv(argv)
    name = raw.get("objective") or TRAIN["objective"]
    if name not in OBJECTIVES:
        raise SystemExit(f"--objective {name!r}: choose one of {sorted(OBJECTIVES)}")
    obj_defaults = objective_class(name).options
    model_fields = {f: v for f, v in M.ModelConfig().to_dict().items() if f != "vocab_size"}
    cfg, model_over, obj_opts = dict(TRAIN), {}, {}
    for key, value in raw.items():
        for table, out in ((TRAIN, cfg), (model_fields, model_over), (obj_defaults, obj_opts)):
            if key in table:
                default = table[key]
                out[key] = True if value is None and isinstance(default, bool) else parse_value(value or "", default, key)
                break
        else:
            raise SystemExit(f"unknown setting --{key}.\n  training: {sorted(TRAIN)}\n  model: {sorted(model_fields)}\n"
                             f"  objective {name!r}: {sorted(obj_defaults)}")
    return cfg, model_over, obj_opts


def objective_class(name):
    import importlib
    return importlib.import_module(f"objectives.{OBJECTIVES[name]}").OBJECTIVE


# ---------------------------------------------------------------------------------------------------------------
# Distributed set-up: torchrun puts RANK / LOCAL_RANK / WORLD_SIZE in the environment


def setup_distributed(device_arg):
    ddp = "RANK" in os.environ
    if device_arg == "auto":
        device_arg = "cuda" if torch.cuda.is_available() else "cpu"
    if not ddp:
        return False, 0, 1, torch.device(device_arg)
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if device_arg.startswith("cuda"):
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return True, rank, world, device


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints: written atomically (temp file + rename), so a crash mid-write never loses the last good one


def save_checkpoint(path, state):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    try:
        return read_checkpoint(path)          # generate.py's reader: file, readability and keys checked
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(str(e))


SHAPE_KEYS = ("vocab_size", "n_layer", "n_head", "n_embd", "ffn_dim", "max_position", "n_segment",
              "rel_pos_buckets", "rel_pos_max_distance")


def check_compatible(ckpt, model_cfg, tok, path):
    """Refuse a checkpoint whose vocabulary or model shape differs, naming the difference."""
    if ckpt["vocab"] != tok.vocab:
        diff = next((i for i, (a, b) in enumerate(zip(ckpt["vocab"], tok.vocab)) if a != b), None)
        raise SystemExit(f"{path}: its vocabulary ({len(ckpt['vocab'])} tokens) differs from this run's "
                         f"({len(tok.vocab)} tokens)" + (f", first at id {diff}: {ckpt['vocab'][diff]!r} vs "
                                                        f"{tok.vocab[diff]!r}" if diff is not None else ""))
    theirs, ours = ckpt["model_config"], model_cfg.to_dict()
    diffs = [f"{k}: checkpoint {theirs.get(k)} vs now {ours[k]}" for k in SHAPE_KEYS if theirs.get(k) != ours[k]]
    if diffs:
        raise SystemExit(f"{path} does not fit this model: " + "; ".join(diffs))


# ---------------------------------------------------------------------------------------------------------------
# Optimizer and schedule


def make_optimizer(model, cfg, device):
    """AdamW; no weight decay on biases, LayerNorms, and the position/segment/relative-bias tables."""
    no_decay_names = ("pos_emb", "seg_emb", "rel_bias")
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or any(n in name for n in no_decay_names) else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(0.9, cfg["beta2"]), eps=1e-6,
                             fused=device.type == "cuda")


def lr_at(step, cfg):
    """Linear warmup to lr, then linear decay to lr * min_lr_frac at max_steps."""
    warmup = cfg["warmup_steps"] if cfg["warmup_steps"] >= 0 else max(1, cfg["max_steps"] // 20)
    if step < warmup:
        return cfg["lr"] * (step + 1) / warmup
    frac = (step - warmup) / max(1, cfg["max_steps"] - warmup)
    return cfg["lr"] * (1 - (1 - cfg["min_lr_frac"]) * min(1.0, frac))


# ---------------------------------------------------------------------------------------------------------------
# Data


def build_tokenizer_and_data(cfg, obj_opts, ckpt_tok, rank, ddp):
    """Rank 0 builds (or finds) the cached vocabulary and tokenized data first; the other ranks then read the cache."""
    data_arg = cfg["data"] or None
    tok = ckpt_tok or (WordPiece.from_file(cfg["vocab"]) if cfg["vocab"] else None)
    for turn in ((0, 1) if ddp else (0,)):
        if (rank == 0) == (turn == 0):
            if cfg["task"] == "pretrain":
                tok, splits, info = data.prepare_pretrain(data_arg, cfg["vocab_size"], cfg["cache_dir"],
                                                          max_tokens=cfg["seq_len"] - 3, tokenizer=tok,
                                                          progress=cfg["progress"] and rank == 0)
                if cfg["objective"] == "ernie_gen" and not obj_opts.get("span_vocab"):
                    # ERNIE-GEN 3.3: the t-test span vocabulary, built once per corpus beside the tokenized data
                    from objectives.ernie_gen import build_span_vocab
                    path = Path(info["cache_path"]) / "span_vocab.json"
                    build_span_vocab(splits["train"], tok, cache_path=path, progress=cfg["progress"] and rank == 0)
                    obj_opts["span_vocab"] = str(path)
            else:
                if tok is None:   # no pre-trained checkpoint: use the embedded corpus's vocabulary
                    tok, _, _ = data.prepare_pretrain(None, cfg["vocab_size"], cfg["cache_dir"], progress=rank == 0)
                splits = data.prepare_seq2seq(data_arg, tok, cfg["cache_dir"], progress=cfg["progress"] and rank == 0)
                info = {split: len(v) for split, v in splits.items()}
        if ddp:
            dist.barrier()
    return tok, splits, info


# ---------------------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate(model, objective, examples, cfg, device, autocast):
    """Mean metrics over the first eval_batches batches of the held-out split (fixed order and randomness)."""
    model.eval()
    sums, n = {}, 0
    for k, batch in enumerate(data.batches(examples, cfg["batch_size"], seed=0, epoch=0, drop_last=False)):
        if k == cfg["eval_batches"]:
            break
        b = objective.make_batch(batch, random.Random(f"eval:{k}")).to(device)
        with autocast:
            _, metrics = objective.loss(model, b)
        for key, v in metrics.items():
            v = float(v)
            if math.isfinite(v):
                sums[key] = sums.get(key, 0.0) + v
        n += 1
    model.train()
    return {k: v / n for k, v in sums.items()} if n else {}


# ---------------------------------------------------------------------------------------------------------------
# The run


def main(argv):
    cfg, model_over, obj_opts = parse_args(argv)
    ddp, rank, world, device = setup_distributed(cfg["device"])
    if device.type == "cuda" and "OMP_NUM_THREADS" not in os.environ:
        # the CPU only builds batches here: a few threads do it, and several processes x all cores thrash
        torch.set_num_threads(min(4, torch.get_num_threads()))
    master = rank == 0
    out_dir = Path(cfg["out_dir"] or f"out/{cfg['objective']}-{cfg['task']}")
    ckpt_path = out_dir / "ckpt.pt"
    torch.manual_seed(cfg["seed"])

    # --- what we start from: a run to resume, a checkpoint to fine-tune, or nothing
    start = None
    if cfg["resume"]:
        start = load_checkpoint(ckpt_path)
        if start["train_config"]["objective"] != cfg["objective"] or start["train_config"]["task"] != cfg["task"]:
            raise SystemExit(f"{ckpt_path} was a {start['train_config']['objective']}/{start['train_config']['task']}"
                             f" run; this one is {cfg['objective']}/{cfg['task']}")
    elif cfg["init_from"]:
        start = load_checkpoint(cfg["init_from"])
    ckpt_tok = WordPiece(start["vocab"], start["lowercase"]) if start else None
    if start and cfg["vocab"]:
        ckpt_tok = WordPiece.from_file(cfg["vocab"])        # check_compatible will compare it with the checkpoint's

    # --- model config: preset, then what the objective needs (e.g. relative positions for pmlm), then the flags
    model_dict = dict(M.PRESETS[cfg["preset"]])
    needs = getattr(objective_class(cfg["objective"]), "model_defaults", {})
    model_dict.update(needs)
    if start:   # the checkpoint fixes the shapes; the objective may still add a head (PALM's copy head)
        model_dict.update(start["model_config"])
        model_dict.update({k: v for k, v in needs.items() if k not in SHAPE_KEYS})
    model_dict.update(model_over)
    if not cfg["seq_len"]:
        cfg["seq_len"] = 128 if cfg["preset"] == "tiny" and not start else model_dict.get("max_position", 512)
    if cfg["label_smoothing"] < 0:
        cfg["label_smoothing"] = 0.1 if cfg["task"] == "seq2seq" else 0.0

    tok, splits, info = build_tokenizer_and_data(cfg, obj_opts, ckpt_tok, rank, ddp)
    model_cfg = M.ModelConfig.from_dict({**model_dict, "vocab_size": len(tok)})
    if start:
        check_compatible(start, model_cfg, tok, ckpt_path if cfg["resume"] else cfg["init_from"])
    if cfg["seq_len"] > model_cfg.max_position:
        raise SystemExit(f"--seq_len {cfg['seq_len']} exceeds the model's max_position {model_cfg.max_position}")

    objective = get_objective(cfg["objective"], tok, task=cfg["task"], max_len=model_cfg.max_position,
                              label_smoothing=cfg["label_smoothing"], **obj_opts)
    model = M.Transformer(model_cfg).to(device)
    if start:
        # fine-tuning may add a head the pre-trained model did not have (PALM's copy head): strict only on resume
        missing, unexpected = model.load_state_dict(start["model"], strict=bool(cfg["resume"]))
        if master and (missing or unexpected):
            print(f"initialised from {cfg['init_from']}; new: {missing}; unused: {unexpected}")
    optimizer = make_optimizer(model, cfg, device)
    step, data_state = 0, None
    if cfg["resume"]:
        optimizer.load_state_dict(start["optimizer"])
        step, data_state = start["step"], start["data_state"][rank] if rank < len(start["data_state"]) else None
    del start

    train_model = LossModule(torch.compile(model) if cfg["compile"] else model, objective)
    if ddp:
        # find_unused_parameters: some heads sit out some batches (NSP outside UniLM's bidirectional LM, PALM's
        # copy head in stage 1)
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[device] if device.type == "cuda" else None, find_unused_parameters=True)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    if master:
        out_dir.mkdir(parents=True, exist_ok=True)
        n_all, n_body = sum(p.numel() for p in model.parameters()), model.num_params()
        print(f"unigen | {cfg['objective']} / {cfg['task']} | {model_cfg.n_layer} layers, {model_cfg.n_embd} wide, "
              f"{n_body / 1e6:.2f}M parameters (+{(n_all - n_body) / 1e6:.2f}M in embeddings) | vocab {len(tok)} | "
              f"{world} process(es) on {device} | data: {info}")
    train_examples, valid_examples = splits["train"], splits["valid"]
    stream = data.infinite_batches(train_examples, cfg["batch_size"], cfg["seed"], rank, world, state=data_state)
    peak = M.peak_flops(device)
    log_file = open(out_dir / "metrics.jsonl", "a" if cfg["resume"] else "w") if master else None
    bar = tqdm(total=cfg["max_steps"], initial=step, disable=not (master and cfg["progress"]), dynamic_ncols=True)
    t_last, tokens_since, flops_since, sums, counts = time.time(), 0, 0.0, {}, {}

    def checkpoint():
        check_pending()
        states = all_data_states(data_state, ddp, world)      # a collective: every rank takes part
        if master:
            save_checkpoint(ckpt_path, dict(
                model=model.state_dict(), model_config=model_cfg.to_dict(), vocab=tok.vocab, lowercase=tok.lowercase,
                objective=cfg["objective"], objective_options=obj_opts, task=cfg["task"], train_config=cfg,
                optimizer=optimizer.state_dict(), step=step, data_state=states,
                rng=dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())))

    def log(record):
        if master:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()

    # The finiteness check of a step's loss is a host-device sync. It runs one step late, after the CPU has built
    # the next batches, so that batch building overlaps the GPU's backward pass; no checkpoint is written before
    # the check, so a non-finite step never reaches the disk.
    pending = None

    def check_pending():
        nonlocal pending
        if pending is not None:
            finite, bad_step, bad_batches, bad_loss = pending
            pending = None
            if not bool(finite):
                describe_bad_batch(bad_step, bad_batches, bad_loss, tok, master)
                cleanup(ddp, log_file)
                raise SystemExit(1)

    last = min(cfg["max_steps"], cfg["stop_at"] or cfg["max_steps"])
    t_start = time.time()
    while step < last:
        if hasattr(objective, "set_step"):         # PALM's two stages switch on the step
            objective.set_step(step, cfg["max_steps"])
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # one seed per (step, rank) for the objective's and dropout's randomness: a resumed run replays exactly
        torch.manual_seed(cfg["seed"] * 100003 + step * world + rank)
        batches = []
        for micro in range(cfg["grad_accum"]):
            examples, data_state = next(stream)
            batches.append(objective.make_batch(examples, random.Random(f"{cfg['seed']}:{rank}:{step}:{micro}")))
        check_pending()
        loss_sum = 0.0
        for micro, batch in enumerate(batches):
            n_tokens = batch.n_tokens                  # counted on the CPU copy: no sync
            pred_frac = int((batch.labels != -100).sum()) / max(1, n_tokens)   # rows that go through the output layer
            tokens_since += n_tokens
            flops_since += n_tokens * model.estimate_flops(batch.input_ids.size(1), pred_frac)
            batch = batch.to(device)
            sync = micro == cfg["grad_accum"] - 1     # DDP all-reduces gradients on the last micro-step only
            with (train_model.no_sync() if ddp and not sync else nullcontext()), autocast:
                loss, metrics = train_model(batch)
            (loss / cfg["grad_accum"]).backward()
            loss_sum = loss_sum + loss.detach()
            for k, v in metrics.items():     # averaged over the micro-steps and steps where each key appears
                sums[k] = sums.get(k, 0.0) + (v.detach() if torch.is_tensor(v) else v)
                counts[k] = counts.get(k, 0) + 1
        finite = torch.isfinite(torch.as_tensor(loss_sum, dtype=torch.float32, device=device)).float()
        if ddp:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        pending = (finite, step, batches, loss_sum)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)

        if step % cfg["log_interval"] == 0 or step == last:
            check_pending()
            dt = time.time() - t_last
            tok_s = tokens_since * world / dt
            record = {"step": step, "split": "train", "lr": lr, "tokens_per_s": tok_s,
                      **{k: float(v) / counts[k] for k, v in sums.items()}}
            if peak:
                record["mfu"] = flops_since * world / dt / (peak * world)
            bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{lr:.1e}", tok_s=f"{tok_s:,.0f}",
                            **({"mfu": f"{record['mfu']:.1%}"} if peak else {}))
            log(record)
            t_last, tokens_since, flops_since, sums, counts = time.time(), 0, 0.0, {}, {}
            if cfg["time_limit"] and out_of_time(t_start, cfg["time_limit"], ddp):
                if master:
                    bar.write(f"time limit of {cfg['time_limit']} min reached at step {step}: stopping")
                last = step
        if step % cfg["eval_interval"] == 0 or step == last:
            check_pending()
            if master and valid_examples:
                metrics = evaluate(model, objective, valid_examples, cfg, device, autocast)
                log({"step": step, "split": "valid", **metrics})
                bar.write(f"step {step}: valid " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            t_last = time.time()                       # evaluation time is not training throughput
        if step % cfg["ckpt_interval"] == 0 or step == last:
            checkpoint()
    check_pending()
    bar.close()
    if ddp:
        check_replicas_agree(model, world, master)
    if master:
        if objective.skipped:
            print(f"examples the objective skipped, by reason: {objective.skipped}")
        print(f"done: {step} steps; checkpoint {ckpt_path}; metrics {out_dir / 'metrics.jsonl'}")
    cleanup(ddp, log_file)


class LossModule(torch.nn.Module):
    """model + objective as one module, so that DDP sees the whole loss (heads included) inside its forward."""

    def __init__(self, model, objective):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch):
        return self.objective.loss(self.model, batch)


def out_of_time(t_start, minutes, ddp):
    """Rank 0's clock decides for everyone (a broadcast), so all ranks stop at the same step."""
    flag = torch.tensor([float(time.time() - t_start > 60 * minutes)])
    if ddp:
        on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        flag = flag.to(on)
        dist.broadcast(flag, src=0)
    return bool(flag.item())


def check_replicas_agree(model, world, master):
    """DDP keeps every rank's replica identical; verify it once at the end (a cheap checksum per rank)."""
    with torch.no_grad():
        checksum = torch.stack([p.double().abs().sum() for p in model.parameters()]).sum().cpu()
    sums = [None] * world
    dist.all_gather_object(sums, float(checksum))
    if master:
        same = all(s == sums[0] for s in sums)
        print(f"DDP: parameter checksums of the {world} ranks: {sums} -> {'identical' if same else 'DIFFERENT'}")
        if not same:
            raise SystemExit("DDP replicas diverged")


def all_data_states(state, ddp, world):
    """Every rank's position in its data stream (rank 0 writes them all into the checkpoint)."""
    if not ddp:
        return [state]
    states = [None] * world
    dist.all_gather_object(states, state)
    return states


def describe_bad_batch(step, batches, loss, tok, master):
    if master:
        b = batches[-1]      # on the CPU
        first = tok.decode(b.input_ids[0, :40].tolist())
        print(f"\nnon-finite loss {float(loss)} at step {step + 1} (batch of {tuple(b.input_ids.shape)}, "
              f"first example starts: {first!r}); stopping. The last good checkpoint is kept.", file=sys.stderr)


def cleanup(ddp, log_file):
    if log_file:
        log_file.close()
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
