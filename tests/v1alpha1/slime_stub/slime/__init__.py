"""A stand-in for the Slime RL framework, with only what the v1alpha1 Slime
integration imports: `slime.utils.phase_callback.PhaseCallback`."""
