"""Plugins that put RL frameworks' training loops on the time-sliced accelerators.

Each module wraps one framework's own hooks, so that the training loop does not
change: the job acquires its groups before a phase's accelerator work, yields
them after, and registers its state (a `TorchWorkload`) with the node's agent so
that the state moves out while another job holds the accelerators.

- `timeslice.integrations.transformers`: a `transformers.TrainerCallback` (and so
  TRL's trainers, which are `Trainer` subclasses).
- `timeslice.integrations.verl`: a plugin on veRL's trainer hooks (sample and
  weight update, each begin and end).
- `timeslice.integrations.slime`: a Slime phase callback.

This package imports nothing itself: each module imports its framework (and
torch) only when it is imported.
"""
