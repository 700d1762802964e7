"""What every script shares: the one line reader (read_lines), atomic writes, the device picker
and torchrun's process group, checkpoint files (data, never programs: read_checkpoint) and the
metrics log beside them, and the one way a user's mistake is reported: a UsageError, which the
command lines print as one line, `script.py: error: ...`, with exit status 2. Anything else is a
bug and keeps its traceback.
"""
import json
import os
import re
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


class UsageError(Exception):
    """A mistake the user can fix (a bad setting, a missing file): one line, exit status 2."""


class DataError(UsageError, ValueError):
    """A problem with the user's data; the message names the file (and line or byte) at fault."""


def exit_with_error(prog, error):
    """The one style for a user mistake on every command line: one line on stderr, exit status 2."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    raise SystemExit(2)


def one_line_warnings(prog):
    """Warnings as `prog: warning: message`, one line: no library file path, no source line."""
    warnings.formatwarning = lambda message, *args, **kwargs: f"{prog}: warning: {message}\n"


def check_at_least(settings, **lows):
    """A UsageError for the first setting below its least value; one `settings` lacks is skipped."""
    for key, low in lows.items():
        if getattr(settings, key, low) < low:
            raise UsageError(f"--{key} must be >= {low}, got {getattr(settings, key)}")


# --- Files ----------------------------------------------------------------------------------------
def read_text(path):
    """A file's UTF-8 text (BOM dropped); clear errors for a missing path, a folder, not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file" + (" (it is a directory)" if path.is_dir() else ""))
    data = path.read_bytes()
    # UTF-16 and most binary formats are full of NUL bytes; UTF-8 text has none or a stray few
    head = data[:65536]
    if head.count(0) > 0.3 * len(head):
        raise DataError(f"{path}: looks like a binary (or UTF-16) file, not UTF-8 text")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}: not UTF-8 at byte offset {e.start} (line {line}): "
                        f"{e.reason}") from None
    return text.removeprefix("\ufeff")


def split_lines(text):
    """The project's one line rule: split on '\\n' only, strip ONE trailing '\\r' (Windows), no
    empty line after a final newline (why not str.splitlines(): docs/how-it-fits-together.md)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path):
    """A UTF-8 text file's lines by split_lines: what data.py, generate.py and evaluate.py read."""
    return split_lines(read_text(path))


def atomic_write(path, content):
    """Write str/bytes, or call content(file) on a binary file, through a temp file and os.replace:
    a crash (or Ctrl-C) mid-write leaves the old file, never half a new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# --- Devices and processes ------------------------------------------------------------------------
def pick_device(name="auto"):
    """auto: cuda when a GPU is visible, else cpu; cpu, cuda, cuda:N are checked on this machine."""
    import torch
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"(cpu|cuda)(:\d+)?", name):
        raise UsageError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: this machine has no CUDA device (use --device cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {name}: only {torch.cuda.device_count()} "
                             "CUDA device(s) here")
    return device


@dataclass
class Dist:
    """This process's place in a torchrun job (ddp False: the one process of a plain run)."""
    ddp: bool
    rank: int
    world: int
    device: object                    # a torch.device

    @property
    def master(self):
        return self.rank == 0


def setup_distributed(device_name="auto"):
    """torchrun puts RANK / LOCAL_RANK / WORLD_SIZE in the environment: then join the process group,
    NCCL on GPUs (one GPU a process), gloo on CPUs."""
    import torch
    import torch.distributed as dist
    device = pick_device(device_name)
    if "RANK" not in os.environ:
        return Dist(False, 0, 1, device)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if device.type == "cuda":
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return Dist(True, rank, world, device)


@contextmanager
def master_first(dist_):
    """Rank 0 runs the block first (it builds the caches), then the other ranks (they read them)."""
    import torch.distributed as dist
    if dist_.ddp and not dist_.master:
        dist.barrier()
    yield
    if dist_.ddp and dist_.master:
        dist.barrier()


def check_replicas_agree(model, dist_):
    """DDP keeps every rank's replica identical; verify it once at the end (a checksum per rank)."""
    import torch
    import torch.distributed as dist
    with torch.no_grad():
        checksum = torch.stack([p.double().abs().sum() for p in model.parameters()]).sum().cpu()
    sums = [None] * dist_.world
    dist.all_gather_object(sums, float(checksum))
    if dist_.master:
        same = all(s == sums[0] for s in sums)
        print(f"DDP: parameter checksums of the {dist_.world} ranks: {sums} -> "
              f"{'identical' if same else 'DIFFERENT'}")
        if not same:
            raise SystemExit("DDP replicas diverged")


# --- Checkpoints: data, never programs ------------------------------------------------------------
CHECKPOINT_KEYS = ("model", "model_config", "vocab", "objective")


def save_checkpoint(path, state):
    """torch.save through a temp file (a crash mid-write keeps the last good checkpoint). state
    holds only tensors and plain Python values: read_checkpoint refuses anything else."""
    import torch
    atomic_write(path, lambda f: torch.save(state, f))


def read_checkpoint(path, device="cpu"):
    """A train.py checkpoint -> its dict ("model", "model_config", "vocab", "lowercase",
    "objective", "objective_options", "task", the resume state), by torch.load(weights_only=True).
    A missing, foreign or truncated file, or a pickle that could run code, is a UsageError."""
    import pickle
    import torch
    if not os.path.isfile(path):
        raise UsageError(f"checkpoint not found: {path}")
    try:
        with warnings.catch_warnings():
            # a foreign pickle's protocol is worth no warning: the file is refused below
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        # torch names what it refused to build ("Unsupported global: GLOBAL os.system")
        if isinstance(e, pickle.UnpicklingError) and "GLOBAL" in str(e):
            raise UsageError(f"{path}: refused: the file holds Python objects, not only tensors "
                             "and plain values (unigen loads checkpoints as data and never runs "
                             "code from them)") from None
        # truncated, not a torch file, ...: torch's own words would advise weights_only=False
        raise UsageError(f"{path}: not a unigen checkpoint (torch.load cannot read it: another "
                         "format, or a truncated file)") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise UsageError(f"{path}: not a unigen checkpoint (missing keys {missing})")
    return ckpt


def open_log(path, keep_until=None):
    """A jsonl log of {"step": ...} records, open for appending. A fresh run starts it; a resumed
    one (keep_until: its checkpoint's step) keeps the records up to its checkpoint, then appends."""
    path = Path(path)
    if keep_until is not None and path.exists():
        kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= keep_until]
        atomic_write(path, "".join(line + "\n" for line in kept))
        return open(path, "a", encoding="utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", encoding="utf-8")
