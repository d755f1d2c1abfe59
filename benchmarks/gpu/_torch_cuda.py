"""The CUDA device the torch scripts of this folder measure on, or a clear refusal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn


def refuse(why: str) -> NoReturn:
    """Say why the script cannot run here, and exit with status 2."""
    print(f"{Path(sys.argv[0]).stem}: {why}", file=sys.stderr)
    sys.exit(2)


def cuda_device(index: int) -> Any:
    """torch's CUDA device `index`; a refusal without torch, CUDA or that device."""
    try:
        import torch
    except ImportError:
        refuse("needs torch with CUDA: pip install 'timeslice[torch]' (a CUDA build of torch)")
    if not torch.cuda.is_available():
        refuse(
            f"needs a CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none"
        )
    if not 0 <= index < torch.cuda.device_count():
        refuse(f"no CUDA device {index}: this machine has {torch.cuda.device_count()}")
    return torch.device("cuda", index)
